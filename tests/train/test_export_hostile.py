"""Exported folders made hostile (issue 43): a ``config.json`` naming a module to import, weights
re-signed as integers, a vocabulary of the wrong size, a memory sized to exhaust the machine,
FIFOs, devices, links and sparse giants where files should be. Each is refused with one line
naming the file (``relmem.load_pretrained``: an ``ExportError``; the commands: status 2),
before anything blocks, is allocated or is half-loaded."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file, save_model

import relmem
from relmem import cli
from relmem.models import HeadConfig, RMCModelConfig, build_model
from relmem.models.reader import ReaderOptions
from relmem.models.spec import TaskSpec
from relmem.pretrained import load_pretrained
from relmem.tasks import NthFarthestConfig
from relmem.train.config import OptimConfig, TrainConfig
from relmem.train.exported import (
    ExportError,
    is_exported,
    parse_config,
    read_spec,
    read_vocabulary,
    sha256,
    spec_from_dict,
    weights_fingerprint,
)
from relmem.train.loop import run

pytestmark = pytest.mark.timeout(120)  # a FIFO that blocks fails the test, not the suite

PACKAGE = Path(relmem.__file__).resolve().parent
CORPUS = {
    "train": " the lamps stand on the pier . \n the keeper lit the lamps in fog . \n" * 6,
    "valid": " the pier stands in the fog . \n the lamps are lit . \n" * 2,
    "test": " the keeper stands on the pier . \n" * 3,
}


def package_modules() -> list[str]:
    """Every module of relmem, from its files (nothing is imported to list them)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["relmem", *path.relative_to(PACKAGE).with_suffix("").parts]
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.fixture(scope="module")
def nth_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Nth Farthest RMC run (4 steps), exported once; tests copy the folder."""
    root = tmp_path_factory.mktemp("nth")
    config = TrainConfig(
        task=NthFarthestConfig(num_objects=4, num_features=4, test_size=32),
        rmc=RMCModelConfig(mem_slots=2, head_size=8, num_heads=2),
        head=HeadConfig((16,)),
        optim=OptimConfig(lr=3e-3),
        steps=4,
        batch_size=8,
        eval_every=2,
        eval_batch=16,
        log_every=2,
        checkpoint_every=2,
        device="cpu",
        cpu_threads=1,
        out_dir=root,
        run_name="run",
        tensorboard=False,
    )
    run_dir = run(config, "nth-farthest", argv=["relmem", "train", "nth-farthest"]).run_dir
    assert cli.main(["export", str(run_dir), str(root / "exported")]) == 0
    return root / "exported"


@pytest.fixture(scope="module")
def lm_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny language model run on a three-line corpus, exported once (with vocab.json)."""
    root = tmp_path_factory.mktemp("lm")
    data = root / "data"
    data.mkdir()
    for split, text in CORPUS.items():
        (data / f"{split}.txt").write_text(text)
    assert cli.main(lm_train_args(data, root, "lm")) == 0
    assert cli.main(["export", str(root / "lm"), str(root / "exported")]) == 0
    return root / "exported"


def lm_train_args(data: Path, out: Path, name: str) -> list[str]:
    """``relmem train lm`` of a tiny model for 2 steps on the corpus in ``data``."""
    args = ["train", "lm", "--data-dir", str(data), "--device", "cpu", "--steps", "2"]
    args += ["--batch-size", "2", "--eval-batch", "2", "--eval-every", "2", "--log-every", "2"]
    args += ["--checkpoint-every", "2", "--task.bptt", "4", "--task.eval-rows", "2"]
    args += ["--task.embedding-size", "8", "--task.softmax", "full", "--rmc.head-size", "4"]
    args += ["--rmc.mem-slots", "1", "--cpu-threads", "1", "--out-dir", str(out)]
    return [*args, "--run-name", name, "--no-tensorboard"]


def copy_of(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    return copy


def edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def resign(folder: Path, weights: dict[str, torch.Tensor] | None = None) -> None:
    """What a forger does: ``model.safetensors`` rewritten (``weights``, or the model that
    config.json now describes, freshly built) with the header relmem writes for config.json,
    and meta.json's SHA-256 brought in line."""
    _, config, normal = parse_config(folder)
    fingerprint = json.dumps(weights_fingerprint(normal), sort_keys=True)
    metadata = {"format": "pt", "relmem_model": fingerprint, "relmem_step": "4"}
    file = folder / "model.safetensors"
    if weights is None:
        model = build_model(config.model, config.model_config(), config.head, read_spec(folder))
        save_model(model, str(file), metadata=metadata)
    else:
        save_file(weights, str(file), metadata=metadata)
    meta = json.loads((folder / "meta.json").read_text())
    meta["sha256"]["model.safetensors"] = sha256(file)
    (folder / "meta.json").write_text(json.dumps(meta))


def assert_refused(folder: Path, names: str, match: str, capsys, command: list[str] | None) -> None:
    """``load_pretrained`` raises one line naming ``names`` and saying ``match``; ``command``
    (run on the folder; None: none) exits 2 with one line naming it too."""
    with pytest.raises(ExportError) as info:
        load_pretrained(folder)
    message = str(info.value)
    assert "\n" not in message and names in message and match in message, message
    if command is None:
        return
    capsys.readouterr()
    assert cli.main([*command[:1], str(folder), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err and match in err, err


# 1. a config.json names classes from a closed table; it never names a module to import


def test_no_module_of_the_package_is_imported_from_config_json(nth_export: Path) -> None:
    spec = json.loads((nth_export / "config.json").read_text())["spec"]
    fields = {"vocab_size": 4, "char_vocab_size": 4, "question_block": 2, "chars": 2}
    modules = package_modules()
    assert "relmem.__main__" in modules and "relmem.models.reader" in modules
    before = set(sys.modules)
    for module in modules:
        for name in (f"{module}.ReaderOptions", module, f"{module}.main"):
            spec["options"] = {"reader": {"type": name, "fields": fields}}
            if name == "relmem.models.reader.ReaderOptions":  # what older exports wrote
                assert spec_from_dict(spec, "spec").options["reader"] == ReaderOptions(**fields)
                continue
            with pytest.raises(ValueError, match="is not a relmem option class") as info:
                spec_from_dict(spec, "spec")
            assert "\n" not in str(info.value)
    assert set(sys.modules) - before == set()


def test_the_cli_module_named_in_config_json_is_not_run(nth_export, tmp_path, capsys) -> None:
    folder = copy_of(nth_export, tmp_path)
    fields = {"vocab_size": 4, "char_vocab_size": 4, "question_block": 2, "chars": 2}
    option = {"type": "relmem.__main__.ReaderOptions", "fields": fields}
    edit_config(folder, lambda c: c["spec"]["options"].update(reader=option))
    assert "relmem.__main__" not in sys.modules
    assert_refused(
        folder, "config.json", '"relmem.__main__.ReaderOptions" is not', capsys, ["eval"]
    )
    assert "relmem.__main__" not in sys.modules


# 2. weights re-signed with another dtype


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64])
def test_weights_of_another_dtype_are_refused(nth_export, tmp_path, capsys, dtype) -> None:
    folder = copy_of(nth_export, tmp_path)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        weights = {k: f.get_tensor(k).to(dtype) for k in f.keys()}  # noqa: SIM118 (its API)
    resign(folder, weights)
    stored = {torch.int32: "I32", torch.int64: "I64", torch.float64: "F64"}[dtype]
    assert_refused(
        folder,
        "model.safetensors",
        f"is stored as {stored}, but the model's is F32",
        capsys,
        ["eval"],
    )


# 3. a vocabulary that is not the model's


@pytest.mark.parametrize(
    "vocabulary, match",
    [
        (lambda words: words[:-1], "its tokens number"),
        (lambda words: [*words, "extra"], "its tokens number"),
        (lambda words: {"words": words}, "must be a JSON list of strings"),
        (lambda words: [*words[:-1], 7], "must be a JSON list of strings"),
    ],
    ids=["one-word-short", "one-word-more", "an-object", "a-number"],
)
def test_a_vocabulary_of_another_size_is_refused(lm_export, tmp_path, capsys, vocabulary, match):
    folder = copy_of(lm_export, tmp_path)
    words = json.loads((folder / "vocab.json").read_text())
    (folder / "vocab.json").write_text(json.dumps(vocabulary(words)))
    meta = json.loads((folder / "meta.json").read_text())
    meta["sha256"]["vocab.json"] = sha256(folder / "vocab.json")
    (folder / "meta.json").write_text(json.dumps(meta))
    command = ["generate", "--prompt", "the", "--tokens", "2"]
    assert_refused(folder, "vocab.json", match, capsys, command)


READER = ReaderOptions(vocab_size=4, char_vocab_size=3, question_block=2, chars=2)


@pytest.mark.parametrize(
    "vocabulary, match",
    [
        (["<pad>", "<unk>", "a", "b"], "must hold an object of the token lists ['chars', 'words']"),
        ({"words": ["<pad>", "<unk>", "a", "b"]}, "must hold an object of the token lists"),
        ({"words": ["<pad>", "<unk>", "a"], "chars": ["<pad>", "<unk>", "a"]}, "'words' list"),
        ({"words": ["<pad>", "<unk>", "a", "b"], "chars": ["<pad>", "<unk>"]}, "'chars' list"),
        ({"words": ["<pad>", "<unk>", "a", "b"], "chars": "abc"}, "'chars' list must be"),
    ],
    ids=["a-list", "no-characters", "words-short", "chars-short", "chars-a-string"],
)
def test_the_readers_vocabulary_must_be_its_words_and_characters(tmp_path, vocabulary, match):
    spec = TaskSpec(4, 8, 2, "span", "reader", options={"reader": READER}, architecture="reader")
    (tmp_path / "vocab.json").write_text(json.dumps(vocabulary))
    with pytest.raises(ExportError, match="vocab.json") as info:
        read_vocabulary(tmp_path, spec)
    assert match in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "vocab.json").write_text(json.dumps({"words": list("pqrs"), "chars": list("pqr")}))
    assert read_vocabulary(tmp_path, spec) == {"words": list("pqrs"), "chars": list("pqr")}


# 4. a memory sized to exhaust the machine, its weights forged to match


@pytest.mark.parametrize(
    "model, section",
    [
        ("dnc", {"hidden_size": 8, "memory_size": 1 << 20, "word_size": 4, "num_read_heads": 1}),
        ("lstm", {"hidden_size": 8}),  # the same forgery with a sane size loads
    ],
)
def test_a_memory_too_large_to_hold_is_refused_before_it_is_built(
    nth_export, tmp_path, capsys, model, section
) -> None:
    folder = copy_of(nth_export, tmp_path)

    def to(config: dict) -> None:
        del config[config["model"]]
        config["model"], config[model] = model, section

    edit_config(folder, to)
    resign(folder)
    if model == "lstm":
        assert load_pretrained(folder).config.model == "lstm"
        return
    assert_refused(folder, "config.json", "keeps 1,099,", capsys, ["eval"])


# 5. files that are not regular files, too large, not JSON or links to elsewhere


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def link(path: Path, target: str) -> None:
    path.unlink()
    path.symlink_to(target)


# (name, damage, what the message says); `relmem eval` is tried on each too (a folder whose
# config.json is not an exported one's is read by relmem.train.runs.load_run_config as a run's)
SABOTAGE = [
    ("config.json", fifo, "is a FIFO (named pipe), not a regular file"),
    ("config.json", lambda p: sparse(p, 3 << 30), "3,221,225,472 bytes, more than"),
    ("config.json", lambda p: p.write_bytes(b"\x80\x04\x95pickle"), "is not UTF-8 text"),
    ("config.json", lambda p: link(p, "/etc/passwd"), "(a link to /etc/passwd) is not JSON"),
    ("config.json", lambda p: p.write_text("[" * 100_000), "nested deeper"),
    ("meta.json", fifo, "is a FIFO"),
    (
        "model.safetensors",
        lambda p: link(p, "/dev/zero"),
        "(a link to /dev/zero) is a device",
    ),
    ("model.safetensors", fifo, "is a FIFO"),
]
if not Path("/etc/passwd").is_file():
    SABOTAGE = [s for s in SABOTAGE if "passwd" not in s[2]]


@pytest.mark.parametrize(
    "name, damage, match",
    SABOTAGE,
    ids=[f"{n}:{m.split()[-1]}" for n, _, m in SABOTAGE],
)
def test_a_file_that_is_not_a_regular_file_is_refused(
    nth_export, tmp_path, capsys, name, damage, match
) -> None:
    folder = copy_of(nth_export, tmp_path)
    damage(folder / name)
    if name == "config.json":
        assert not is_exported(folder)  # without blocking or reading it whole
    assert_refused(folder, str(folder / name), match, capsys, ["eval"])


@pytest.mark.parametrize(
    "name, damage, match",
    [
        ("vocab.json", fifo, "is a FIFO"),
        ("vocab.json", lambda p: sparse(p, 1 << 30), "1,073,741,824 bytes, more than"),
        ("data.json", fifo, "is a FIFO"),
    ],
    ids=["vocab-fifo", "vocab-sparse", "data-fifo"],
)
def test_the_vocabulary_and_data_files_too(lm_export, tmp_path, capsys, name, damage, match):
    folder = copy_of(lm_export, tmp_path)
    damage(folder / name)
    command = ["generate", "--prompt", "the", "--tokens", "2"]
    assert_refused(folder, str(folder / name), match, capsys, command)


def test_the_cards_sources_in_the_run_may_not_block_the_export(nth_export, tmp_path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(nth_export.parent / "run", run_dir)
    for name in ("eval.json", "run.json"):  # read for the card only: left out when unreadable
        (run_dir / name).unlink(missing_ok=True)
        os.mkfifo(run_dir / name)
    assert cli.main(["export", str(run_dir), str(tmp_path / "out")]) == 0
    assert "trained with: not recorded" in (tmp_path / "out" / "README.md").read_text()


# 6. a Hub endpoint that accepts the connection and never answers


@pytest.fixture
def silent_server():
    """A local HTTP endpoint that accepts connections and never answers; closed (with every
    connection it accepted) at the end, so the abandoned upload's thread ends too."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for connection in accepted:
        connection.close()


def test_a_hub_that_never_answers_is_given_up_on(
    nth_export, tmp_path, capsys, monkeypatch, silent_server
) -> None:
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "ENDPOINT", silent_server)  # HF_ENDPOINT, read at import
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    out = tmp_path / "pushed"
    args = ["export", str(nth_export.parent / "run"), str(out), "--push", "someone/nf-rmc"]
    started = time.monotonic()
    assert cli.main([*args, "--push-timeout", "1"]) == 2
    assert time.monotonic() - started < 60
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"got no answer from {silent_server} within 1 s" in err, err
    assert "--push-timeout" in err and "The folder is written" in err
    assert is_exported(out)


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_the_push_timeout_is_a_positive_number(nth_export, tmp_path, capsys, seconds) -> None:
    args = ["export", str(nth_export.parent / "run"), str(tmp_path / "out"), "--push", "a/b"]
    assert cli.main([*args, "--push-timeout", seconds]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--push-timeout must be a finite number" in err, err
    assert not (tmp_path / "out").exists()


# 7. an OUT_DIR among the run's checkpoints (resuming would take it for one, pruning delete it)


@pytest.mark.parametrize(
    "where, match",
    [
        ("run/checkpoints/step-00000002", "is inside {run}'s checkpoints folder"),
        ("run/checkpoints/exported", "is inside {run}'s checkpoints folder"),
        ("run/checkpoints", "is inside {run}'s checkpoints folder"),
        ("run", "is the run directory {run}"),
        (".", "holds the run directory {run}"),
    ],
)
def test_an_out_dir_in_the_run_is_refused(nth_export, capsys, where, match) -> None:
    root = nth_export.parent
    run_dir = root / "run"
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    out = root / where
    assert cli.main(["export", str(run_dir), str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"OUT_DIR {out} " in err, err
    assert match.format(run=run_dir) in err and "choose an OUT_DIR outside" in err, err
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


# 8. an export publishes no path of the trainer's machine


def test_no_exported_file_holds_the_runs_paths(lm_export, tmp_path, capsys, monkeypatch) -> None:
    root = lm_export.parent
    for file in lm_export.iterdir():
        assert str(root).encode() not in file.read_bytes(), file.name
    config = json.loads((lm_export / "config.json").read_text())
    assert config["task"]["data_dir"] == "data"
    card = (lm_export / "README.md").read_text()
    assert "--data-dir data" in card and f"--out-dir {root.name} " in card  # names only
    assert "names of the training data's files and folders" in card

    folder = copy_of(lm_export, tmp_path)
    monkeypatch.chdir(tmp_path)  # no data folder here: eval says which path it looked for
    capsys.readouterr()
    assert cli.main(["eval", str(folder), "--json-out", str(tmp_path / "e.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data" in err, err
    assert "the task section of its config.json names the data" in err, err
    config["task"]["data_dir"] = str(root / "data")  # what the card says to do
    (folder / "config.json").write_text(json.dumps(config))
    assert cli.main(["eval", str(folder), "--json-out", str(tmp_path / "e.json")]) == 0


# 9. a checkpoint of another run, trained on other data of the same sizes


def test_another_runs_checkpoint_is_not_exported_with_this_runs_vocabulary(
    lm_export, tmp_path, capsys
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for split, text in CORPUS.items():  # the same sizes, other words
        (data / f"{split}.txt").write_text(text.replace("lamps", "lights"))
    assert cli.main(lm_train_args(data, tmp_path, "other")) == 0
    other = tmp_path / "other" / "checkpoints" / "step-00000002"
    assert other.is_dir()
    capsys.readouterr()
    out = tmp_path / "out"
    assert (
        cli.main(["export", str(lm_export.parent / "lm"), str(out), "--checkpoint", str(other)])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--checkpoint {other} was trained on other data" in err, err
    assert not out.exists()
