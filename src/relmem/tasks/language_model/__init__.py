"""Language modelling: corpora, the ``lm`` task, its presets and sampling.

- :func:`load_corpus` (:mod:`.corpus`): a directory of text as a vocabulary and three id streams;
- :mod:`.wikitext`: the WikiText releases' checks and the download;
- :mod:`.batching`: batchify and truncated-BPTT windows;
- :mod:`.task`: :class:`LanguageModel`, registered as ``lm``; :mod:`.presets`: its presets;
- :mod:`.sampling`: text generation from a trained model.
"""

from relmem.tasks.language_model import presets
from relmem.tasks.language_model.corpus import Corpus, CorpusError, load_corpus
from relmem.tasks.language_model.sampling import generate
from relmem.tasks.language_model.task import LanguageModel, LanguageModelConfig, open_corpus

__all__ = [
    "Corpus",
    "CorpusError",
    "LanguageModel",
    "LanguageModelConfig",
    "generate",
    "load_corpus",
    "open_corpus",
    "presets",
]
