"""Language modelling: the corpus loader (tokenisation, layouts, cache, errors, WikiText checks),
BPTT windows and shards, perplexity, the model's ends, presets and sampling."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lm_sample import SPLITS, TEST, TRAIN, VALID, expected_tokens, write_sample
from safetensors.torch import load_file, save_file
from torch import nn

from relmem.models.language_model import AdaptiveLogits, LMOptions, LMSoftmax, token_nll
from relmem.tasks.base import Batch
from relmem.tasks.language_model import (
    Corpus,
    CorpusError,
    LanguageModel,
    LanguageModelConfig,
    generate,
    load_corpus,
    presets,
    wikitext,
)
from relmem.tasks.language_model import corpus as corpus_module
from relmem.tasks.language_model.batching import batchify, num_windows, window
from relmem.tasks.language_model.sampling import filter_top_k, filter_top_p
from relmem.tasks.registry import list_presets
from relmem.train.evaluation import evaluate
from relmem.train.runs import build_model

CPU = torch.device("cpu")


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    return write_sample(tmp_path / "sample")


def small_config(data_dir: Path, **task: object) -> object:
    config = presets.lm_cpu()
    config.task = LanguageModelConfig(
        data_dir=data_dir, bptt=5, eval_rows=2, embedding_size=8, **task
    )
    config.rmc.head_size, config.rmc.num_heads = 6, 2
    config.lstm.hidden_size = 8
    return config


# --- tokenisation, vocabulary and layouts ---------------------------------------------------


def test_word_counts_follow_the_convention(sample: Path) -> None:
    corpus = load_corpus(sample)
    for split, text in SPLITS.items():
        tokens = expected_tokens(text)
        assert corpus.split(split).numel() == len(tokens), split
        assert [corpus.vocab[i] for i in corpus.split(split)] == tokens, split
    blank_lines = sum(1 for line in TRAIN.splitlines() if not line.strip())
    assert blank_lines == 7
    eos = corpus.vocab.index("<eos>")
    assert int((corpus.train == eos).sum()) == len(TRAIN.splitlines())  # blank lines give <eos>


def test_vocabulary_in_order_of_first_appearance_over_train_valid_test(sample: Path) -> None:
    corpus = load_corpus(sample)
    order: list[str] = []
    for word in expected_tokens(TRAIN + VALID + TEST):
        if word not in order:
            order.append(word)
    assert corpus.vocab == order
    assert corpus.vocab.index("Mill") > corpus.vocab.index("museum")  # a valid-only word


def test_encode_decode_round_trip(sample: Path) -> None:
    corpus = load_corpus(sample)
    lines = [" ".join(line.split()) for line in TRAIN.splitlines()]
    assert corpus.decode(corpus.train) == "\n".join(lines) + "\n"
    text = "The lamps show a green light\nThe town"
    assert corpus.decode(corpus.encode(text)) == text
    assert corpus.decode(corpus.encode("a zeppelin")) == "a <unk>"  # unknown words


def test_byte_tokenisation_is_the_files_bytes(sample: Path) -> None:
    corpus = load_corpus(sample, tokenization="byte")
    assert corpus.vocab_size == 256
    assert corpus.train.tolist() == list(TRAIN.encode("utf-8"))
    assert corpus.decode(corpus.encode("Mühle")) == "Mühle"


def test_both_layouts_give_the_same_corpus(tmp_path: Path) -> None:
    a = load_corpus(write_sample(tmp_path / "a", "wikitext"))
    b = load_corpus(write_sample(tmp_path / "b", "txt"))
    assert a.vocab == b.vocab
    for split in SPLITS:
        assert torch.equal(a.split(split), b.split(split))
    assert b.files["train"].name == "train.txt"


def test_cache_is_used_without_pickle_and_rebuilt_when_a_file_changes(
    sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_corpus(sample)
    cache = sample / corpus_module.CACHE_DIR / "word"
    assert sorted(p.name for p in cache.iterdir()) == [
        "ids.safetensors",
        "manifest.json",
        "vocab.json",
    ]
    assert json.loads((cache / "vocab.json").read_text()) == first.vocab

    def refuse(*args: object) -> None:
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(corpus_module, "_tokenise_words", refuse)
    again = load_corpus(sample)
    assert again.vocab == first.vocab and torch.equal(again.train, first.train)
    monkeypatch.undo()
    (sample / "wiki.valid.tokens").write_text(VALID + " The pond is deep . \n", encoding="utf-8")
    changed = load_corpus(sample)
    assert changed.valid.numel() == first.valid.numel() + 6
    assert "deep" in changed.vocab


def test_the_cache_is_keyed_on_content_not_size_and_time(sample: Path) -> None:
    """An edit that keeps a file's size and modification time was read stale from the cache
    while they were its key."""
    first = load_corpus(sample)
    path = sample / "wiki.valid.tokens"
    stat = path.stat()
    text = path.read_text(encoding="utf-8")
    edited = text.replace("The", "Thy", 1)
    assert edited != text and len(edited.encode()) == stat.st_size
    path.write_text(edited, encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    again = load_corpus(sample)
    assert "Thy" in again.vocab and "Thy" not in first.vocab


@pytest.mark.parametrize(
    "damage",
    ["manifest a list", "manifest without sha1", "vocabulary cut short", "2-D stream"],
)
def test_an_inconsistent_cache_is_rebuilt(sample: Path, damage: str) -> None:
    """Each of these was taken as valid: an AttributeError, a KeyError, or an IndexError deep
    in the embedding once training started."""
    first = load_corpus(sample)
    cache = sample / corpus_module.CACHE_DIR / "word"
    manifest = json.loads((cache / "manifest.json").read_text())
    if damage == "manifest a list":
        (cache / "manifest.json").write_text("[]")
    elif damage == "manifest without sha1":
        del manifest["sha1"]
        (cache / "manifest.json").write_text(json.dumps(manifest))
    elif damage == "vocabulary cut short":
        (cache / "vocab.json").write_text(json.dumps(first.vocab[:10]))
    else:
        streams = load_file(str(cache / "ids.safetensors"))
        streams["train"] = streams["train"][:-1].view(-1, 1)
        save_file(streams, str(cache / "ids.safetensors"))
    again = load_corpus(sample)
    assert again.vocab == first.vocab
    for split in corpus_module.SPLITS:
        assert torch.equal(again.split(split), first.split(split))


# --- errors ----------------------------------------------------------------------------------


def test_missing_directory_split_empty_and_non_utf8_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="nowhere does not exist"):
        load_corpus(tmp_path / "nowhere")
    folder = write_sample(tmp_path / "partial", "txt")
    (folder / "test.txt").unlink()
    with pytest.raises(CorpusError, match=r"has train.txt, valid.txt .* but not test.txt"):
        load_corpus(folder)
    (tmp_path / "other").mkdir()
    with pytest.raises(CorpusError, match="holds no corpus: expected the files wiki.train"):
        load_corpus(tmp_path / "other")
    folder = write_sample(tmp_path / "empty")
    (folder / "wiki.test.tokens").write_text(" \n\n")
    with pytest.raises(CorpusError, match=r"wiki.test.tokens is empty"):
        load_corpus(folder)
    folder = write_sample(tmp_path / "latin1")
    (folder / "wiki.valid.tokens").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"wiki.valid.tokens is not UTF-8 text \(byte 3, line 1"):
        load_corpus(folder)
    with pytest.raises(CorpusError, match="tokenization must be one of"):
        load_corpus(write_sample(tmp_path / "ok"), tokenization="char")  # type: ignore[arg-type]


def test_no_corpus_given_is_an_error() -> None:
    with pytest.raises(CorpusError, match="pass --data-dir DIR"):
        LanguageModel(LanguageModelConfig())


# --- WikiText recognition and fetching -------------------------------------------------------


def test_wikitext_release_checks_name_every_difference() -> None:
    wt2 = wikitext.RELEASES["wikitext-2"]
    assert wikitext.recognise({"valid": wt2.sha1["valid"], "x": "0"}) == "wikitext-2"
    assert wikitext.recognise({"train": "0" * 40}) is None
    found = wikitext.differences(
        "wikitext-2", dict(wt2.sha1), dict(wt2.tokens), wt2.vocab_size, check_sha1=True
    )
    assert found == []
    sha1s = dict(wt2.sha1, train="f" * 40)
    counts = dict(wt2.tokens, test=245_570)
    found = wikitext.differences("wikitext-2", sha1s, counts, 33_279, check_sha1=True)
    assert found == [
        f"train SHA-1 {'f' * 40} is not {wt2.sha1['train']}",
        "test has 245,570 tokens, not 245,569",
        "the vocabulary has 33,279 tokens, not 33,278",
    ]


def test_recognised_files_that_differ_are_reported(
    sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory whose valid file has WikiText-2's SHA-1 but whose counts differ: a warning
    that names the differences (here, the sample's counts)."""
    valid_sha1 = hashlib.sha1(VALID.encode()).hexdigest()
    release = wikitext.RELEASES["wikitext-2"]
    fake = wikitext.Release(
        release.vocab_size, release.tokens, dict(release.sha1, valid=valid_sha1), "x"
    )
    monkeypatch.setitem(wikitext.RELEASES, "wikitext-2", fake)
    with pytest.warns(UserWarning, match="looks like wikitext-2 but differs") as caught:
        corpus = load_corpus(sample)
    assert corpus.release == "wikitext-2"
    assert "train has 164 tokens, not 2,088,628" in str(caught[0].message)
    with pytest.raises(CorpusError, match="should hold wikitext-2 but: train has 164 tokens"):
        load_corpus(sample, expect="wikitext-2")


def test_fetch_offline_says_how_to_get_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(wikitext.DATA_ENV, str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails: not installed
    with pytest.raises(ValueError) as info:
        LanguageModel(LanguageModelConfig(dataset="wikitext-2"))
    message = str(info.value)
    assert "pip install -e '.[data]'" in message
    assert f"{tmp_path / 'cache' / 'wikitext-2'}/wiki.train.tokens" in message
    assert "pytorch/examples" in message
    write_sample(tmp_path / "cache" / "wikitext-2")  # files already there: no download needed
    assert wikitext.fetch("wikitext-2") == tmp_path / "cache" / "wikitext-2"


def test_fetch_writes_rows_as_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of the Hugging Face dataset become lines (blank rows empty), and the release's
    counts are then asserted."""

    class FakeDatasets:
        @staticmethod
        def load_dataset(name: str, config: str) -> dict:
            assert (name, config) == ("Salesforce/wikitext", "wikitext-2-v1")
            rows = {
                s: [line + "\n" if line.strip() else "" for line in t.splitlines()]
                for s, t in SPLITS.items()
            }
            return {
                "train": {"text": rows["train"]},
                "validation": {"text": rows["valid"]},
                "test": {"text": rows["test"]},
            }

    monkeypatch.setenv(wikitext.DATA_ENV, str(tmp_path))
    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets)
    folder = wikitext.fetch("wikitext-2")
    corpus = load_corpus(folder)
    assert corpus.train.numel() == len(expected_tokens(TRAIN))
    with pytest.raises(CorpusError, match="should hold wikitext-2"):
        LanguageModel(LanguageModelConfig(dataset="wikitext-2"))


@pytest.mark.slow
def test_real_wikitext2_counts() -> None:
    """WikiText-2 in ``$RELMEM_DATA/wikitext-2`` (skipped when absent) has the release's
    token counts and vocabulary."""
    folder = wikitext.data_root() / "wikitext-2"
    if not folder.is_dir():
        pytest.skip(f"no WikiText-2 in {folder}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        corpus = load_corpus(folder)
    release = wikitext.RELEASES["wikitext-2"]
    assert corpus.vocab_size == release.vocab_size
    assert {s: corpus.split(s).numel() for s in SPLITS} == release.tokens


# --- windows and shards ----------------------------------------------------------------------


@pytest.mark.parametrize(("rows", "bptt"), [(1, 7), (4, 5), (3, 100)])
def test_bptt_windows_cover_every_token_once_in_order(rows: int, bptt: int) -> None:
    ids = torch.arange(203)
    table = batchify(ids, rows)
    assert torch.equal(table.flatten(), ids[: rows * (203 // rows)])
    parts = [window(table, w, bptt) for w in range(num_windows(table.shape[1], bptt))]
    assert all(x.shape[1] == bptt for x, _ in parts[:-1]) and 1 <= parts[-1][0].shape[1] <= bptt
    inputs = torch.cat([x for x, _ in parts], 1)
    targets = torch.cat([y for _, y in parts], 1)
    assert torch.equal(inputs, table[:, :-1]) and torch.equal(targets, table[:, 1:])


def test_training_steps_walk_the_windows_and_wrap_at_the_epoch(sample: Path) -> None:
    task = LanguageModel(small_config(sample).task)
    generator = torch.Generator()
    epoch = task.windows_per_epoch(4)
    rows = task.rows(4)
    seen = torch.cat([task.sample(4, generator, s).targets for s in range(epoch)], 1)
    assert torch.equal(seen, rows[:, 1:])
    assert torch.equal(task.sample(4, generator, epoch).inputs, task.sample(4, generator, 0).inputs)


@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp_shards_are_contiguous_slices_without_overlap(sample: Path, world_size: int) -> None:
    """The trainer gives rank r rows r·B/W .. (r+1)·B/W of every window (Trainer._shard)."""
    task = LanguageModel(small_config(sample).task)
    batch, per_rank = 8, 8 // world_size
    epoch = task.windows_per_epoch(batch)
    slices = []
    for rank in range(world_size):
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        windows = [task.sample(batch, torch.Generator(), s).select(mine) for s in range(epoch)]
        inputs = torch.cat([w.inputs for w in windows], 1)  # [B/W, L-1]
        tokens = torch.cat([inputs, windows[-1].targets[:, -1:]], 1).flatten()
        slices.append(tokens)
    stream = task.corpus.train[: sum(t.numel() for t in slices)]
    assert torch.equal(torch.cat(slices), stream)  # rank after rank: disjoint and contiguous


# --- perplexity and the model's ends ---------------------------------------------------------


class Uniform(nn.Module):
    """Equal logits for every token: perplexity is the vocabulary size."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, ids, state=None, lengths=None):
        return torch.zeros(*ids.shape, self.vocab), state


def test_a_uniform_model_scores_the_vocabulary_size(sample: Path) -> None:
    task = LanguageModel(small_config(sample).task)
    result = evaluate(Uniform(task.corpus.vocab_size), task, task.held_out(CPU))
    assert result["perplexity"] == pytest.approx(task.corpus.vocab_size, rel=1e-6)
    assert result["loss"] == pytest.approx(math.log(task.corpus.vocab_size), rel=1e-6)


@pytest.mark.parametrize("model", ["rmc", "lstm"])
def test_state_carried_across_windows_equals_one_long_sequence(sample: Path, model: str) -> None:
    config = small_config(sample)
    config.model = model
    task = LanguageModel(config.task)
    net = build_model(config, task).eval()
    held_out = task.held_out(CPU)
    assert held_out.inputs.shape[1] > 3 * task.spec.seq_len
    walked = evaluate(net, task, held_out)
    with torch.no_grad():
        whole = task.measure(net(held_out.inputs)[0], held_out)["loss"].value().item()
    assert walked["loss"] == pytest.approx(whole, rel=1e-5)


def test_adaptive_softmax_loss_equals_a_direct_computation() -> None:
    torch.manual_seed(0)
    options = LMOptions(0.0, 0.0, "adaptive", True, (5, 12), 2.0)
    head = LMSoftmax(6, 20, 4, options)
    outputs = torch.randn(3, 7, 6)
    targets = torch.randint(0, 20, (3, 7))
    out = head(outputs)
    assert isinstance(out, AdaptiveLogits)
    softmax = head.decoder
    features = head.projection(outputs)  # [3, 7, 4]
    # By hand: the head gives the shortlist and one logit per cluster; a word in cluster c
    # adds its log-probability within the cluster (tail c: a two-layer projection).
    head_logp = F.log_softmax(softmax.head(features), -1)  # [3, 7, 5 + 2]
    expected = torch.empty(3, 7)
    for b in range(3):
        for t in range(7):
            y = int(targets[b, t])
            if y < 5:
                expected[b, t] = -head_logp[b, t, y]
            else:
                c, low = (0, 5) if y < 12 else (1, 12)
                tail = F.log_softmax(softmax.tail[c](features[b, t]), -1)
                expected[b, t] = -(head_logp[b, t, 5 + c] + tail[y - low])
    torch.testing.assert_close(token_nll(out, targets), expected)
    torch.testing.assert_close(out.log_probs().exp().sum(-1), torch.ones(3, 7))


def test_full_softmax_is_tied_to_the_embedding(sample: Path) -> None:
    config = small_config(sample, softmax="full")
    task = LanguageModel(config.task)
    net = build_model(config, task)
    assert net.head.decoder.weight is net.encoder.weight
    assert net.head.projection is not None  # the RMC's 2 x 6 memory is wider than E = 8
    config.task.tie_weights = False
    untied = build_model(config, LanguageModel(config.task, task.corpus))
    assert untied.head.decoder.weight is not untied.encoder.weight


def test_bad_adaptive_cutoffs_are_refused(sample: Path) -> None:
    config = small_config(sample, softmax="adaptive", cutoffs=(10, 5))
    with pytest.raises(ValueError, match="cutoffs that increase strictly"):
        build_model(config, LanguageModel(config.task))
    config = small_config(sample, softmax="adaptive", cutoffs=(10, 50), div_value=4.0)
    with pytest.raises(ValueError, match=r"last cluster would be 8 // 4\^2 = 0 wide"):
        build_model(config, LanguageModel(config.task))


def test_every_adaptive_parameter_gets_a_gradient() -> None:
    """Also the tail clusters no target falls in (DDP needs a gradient for every parameter)."""
    head = LMSoftmax(4, 30, 4, LMOptions(0.0, 0.0, "adaptive", True, (10, 20), 2.0))
    targets = torch.zeros(2, 3, dtype=torch.int64)  # all in the shortlist
    token_nll(head(torch.randn(2, 3, 4)), targets).sum().backward()
    for name, p in head.named_parameters():
        assert p.grad is not None, name


# --- presets ---------------------------------------------------------------------------------


def stand_in(vocab: int) -> Corpus:
    ids = torch.arange(4000) % vocab
    return Corpus([f"w{i}" for i in range(vocab)], ids, ids[:500], ids[:500], "word")


@pytest.mark.parametrize(
    ("preset", "model", "low", "high"),
    [
        ("wt2-port", "rmc", 10.5e6, 12.5e6),
        ("wt2-port-lstm", "lstm", 10.5e6, 11.5e6),
        ("paper", "rmc", 205e6, 220e6),
        ("cpu", "rmc", 4.5e6, 6e6),
        ("cpu", "lstm", 4.5e6, 6e6),
    ],
)
def test_presets_build_at_their_sizes(preset: str, model: str, low: float, high: float) -> None:
    """Built on the meta device with the real vocabularies (WikiText-2: 33,278; -103: 267,735):
    the port's models at about 11 M parameters, the paper's core at 76.3 M."""
    entry = next(e for e in list_presets("lm") if e.name == preset)
    config = entry.function()
    config.model = model
    vocab = wikitext.RELEASES[config.task.dataset].vocab_size
    task = LanguageModel(config.task, stand_in(vocab))
    with torch.device("meta"):
        net = build_model(config, task)
    count = sum(p.numel() for p in net.parameters())
    assert low < count < high, count
    if preset == "paper":
        assert sum(p.numel() for p in net.core.parameters()) == pytest.approx(76.3e6, rel=0.01)


def test_cpu_lstm_has_about_the_rmcs_parameters() -> None:
    config = presets.lm_cpu()
    task = LanguageModel(config.task, stand_in(33_278))
    counts = {}
    for model in ("rmc", "lstm"):
        config.model = model
        with torch.device("meta"):
            counts[model] = sum(p.numel() for p in build_model(config, task).parameters())
    assert counts["lstm"] == pytest.approx(counts["rmc"], rel=0.02)


# --- sampling --------------------------------------------------------------------------------


def test_sampling_with_a_fixed_seed_is_reproducible(sample: Path) -> None:
    config = small_config(sample)
    task = LanguageModel(config.task)
    net = build_model(config, task)
    prompt = task.corpus.encode("The lamps")
    draws = [
        generate(
            net, prompt, 12, temperature=0.9, top_k=20, generator=torch.Generator().manual_seed(s)
        )
        for s in (3, 3, 4)
    ]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    greedy = generate(net, prompt, 5, temperature=0)
    assert torch.equal(greedy, generate(net, prompt, 5, temperature=0))
    assert net.training  # the model's mode is restored


def test_top_k_and_top_p_filters() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.05, 0.3, 0.15]]))
    assert torch.isfinite(filter_top_k(logits, 2)).tolist() == [[True, False, True, False]]
    assert torch.isfinite(filter_top_p(logits, 0.75)).tolist() == [[True, False, True, False]]
    assert torch.isfinite(filter_top_p(logits, 0.8)).tolist() == [[True, False, True, False]]
    assert torch.isfinite(filter_top_p(logits, 0.81)).tolist() == [[True, False, True, True]]
    assert torch.isfinite(filter_top_p(logits, 0.1)).tolist() == [[True, False, False, False]]


def test_top_p_one_keeps_every_token_of_a_large_vocabulary() -> None:
    """A float32 running sum reached 1 early: p = 1 dropped 1,496 of 33,278 tokens."""
    logits = torch.randn(2, 33278, generator=torch.Generator().manual_seed(0)) * 4
    assert torch.isfinite(filter_top_p(logits, 1.0)).all()
    assert torch.isfinite(filter_top_p(logits, 0.999999)).sum() > 30000


def test_a_tiny_temperature_samples_the_most_likely_token(sample: Path) -> None:
    config = small_config(sample)
    task = LanguageModel(config.task)
    net = build_model(config, task)
    prompt = task.corpus.encode("The lamps")
    greedy = generate(net, prompt, 5, temperature=0)
    # every score / 1e-45 was -inf in float32, and softmax gave NaN
    tiny = generate(net, prompt, 5, temperature=1e-45, generator=torch.Generator())
    assert torch.equal(tiny, greedy)
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
            generate(net, prompt, 1, temperature=bad)


def test_batch_fields_are_token_ids(sample: Path) -> None:
    task = LanguageModel(small_config(sample).task)
    batch = task.sample(4, torch.Generator(), 0)
    assert isinstance(batch, Batch) and batch.inputs.dtype == torch.int64
    assert batch.inputs.shape == batch.targets.shape == (4, 5)
    assert os.fspath(task.config.data_dir) == os.fspath(sample.absolute())


@pytest.mark.parametrize(
    ("preset", "tokens", "batch", "epochs"),
    [("wt2-port", 2_088_628, 64, 100), ("wt2-port-lstm", 2_088_628, 64, 100)]
    + [("paper", 103_227_021, 384, 50)],
)
def test_epoch_presets_evaluate_once_per_epoch(
    preset: str, tokens: int, batch: int, epochs: int
) -> None:
    """An epoch is the windows of one batchified row of the training split (docs/tasks.md
    §3.1's token counts): WikiText-2 at batch 64 has 327, not the 326 the port's presets had,
    which let the evaluations drift off the epochs' ends."""
    config = next(e for e in list_presets("lm") if e.name == preset).function()
    rows = batchify(torch.zeros(tokens, dtype=torch.int32), batch)
    epoch = num_windows(rows.shape[1], config.task.bptt)
    assert config.eval_every == epoch and config.steps == epochs * epoch


class _FixedLogits(torch.nn.Module):
    """A 'language model' whose next-token log-probabilities are always ``log_probs``."""

    def __init__(self, log_probs: torch.Tensor) -> None:
        super().__init__()
        self.zero = torch.nn.Parameter(torch.zeros(()))
        self.log_probs = log_probs

    def forward(self, ids: torch.Tensor, state: object) -> tuple[torch.Tensor, object]:
        return self.log_probs.expand(1, ids.shape[1], -1) + self.zero, state


def test_temperature_divides_the_log_probabilities_once(monkeypatch) -> None:
    """At temperature 2 the sampled distribution is softmax(log p / 2) (dividing twice passed
    the tests of temperature 0 and of a tiny one)."""
    log_probs = torch.tensor([0.6, 0.3, 0.1]).log()
    seen = []
    real = torch.multinomial

    def spy(probs, count, generator=None):
        seen.append(probs.clone())
        return real(probs, count, generator=generator)

    monkeypatch.setattr(torch, "multinomial", spy)
    generate(
        _FixedLogits(log_probs), torch.tensor([0]), 1, temperature=2.0, generator=torch.Generator()
    )
    torch.testing.assert_close(seen[0][0], (log_probs / 2).softmax(-1))


def test_top_p_stops_once_the_mass_is_reached_exactly() -> None:
    """Four tokens of probability exactly 1/4: two reach p = 1/2, and the third is dropped."""
    assert int(torch.isfinite(filter_top_p(torch.zeros(1, 4), 0.5)).sum()) == 2
