"""``relmem export`` and ``relmem.load_pretrained``: a tiny run of each supervised task family
exported, loaded back bit-identically (weights, vocabulary) and evaluated to the run's own
``relmem eval`` figure; the bad inputs of issue 35 (one line, status 2, nothing half-written);
the Hub path through a stand-in ``huggingface_hub`` (tests use local folders only)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import relmem
from relmem import cli
from relmem.models import HeadConfig, RMCModelConfig
from relmem.models.language_model import LMOptions
from relmem.models.spec import DecoderSpec, TaskSpec, register_option
from relmem.pretrained import load_pretrained
from relmem.tasks import NthFarthestConfig
from relmem.tasks.learn_to_execute import LearnToExecuteConfig
from relmem.tasks.learn_to_execute.vocabulary import SYMBOLS
from relmem.train import checkpoint as ckpt_io
from relmem.train.config import OptimConfig, TrainConfig
from relmem.train.exported import ExportError, sha256, spec_from_dict, spec_to_dict
from relmem.train.loop import run

CORPUS = {
    "train": " the lamps stand on the pier . \n the keeper lit the lamps in fog . \n" * 6,
    "valid": " the pier stands in the fog . \n the lamps are lit . \n" * 2,
    "test": " the keeper stands on the pier . \n" * 3,
}


def weights_of(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model.safetensors"))


def assert_bit_identical(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert saved, "no weights saved"
    for name, tensor in saved.items():  # save_model keeps one name of tied tensors
        assert state[name].dtype == tensor.dtype and torch.equal(state[name], tensor), name


def eval_record(target: Path, out: Path, *extra: str) -> dict:
    assert cli.main(["eval", str(target), "--json-out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def export(run_dir: Path, out: Path, *extra: str) -> int:
    return cli.main(["export", str(run_dir), str(out), *extra])


@pytest.fixture(scope="module")
def nth_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny Nth Farthest run of the RMC (20 steps, checkpoints at 10 and 20),
    shared by the tests, which only read it."""
    config = TrainConfig(  # conftest's tiny_config, which a module-scoped fixture cannot take
        task=NthFarthestConfig(num_objects=4, num_features=4, test_size=64),
        rmc=RMCModelConfig(mem_slots=2, head_size=8, num_heads=2),
        head=HeadConfig((32,)),
        optim=OptimConfig(lr=3e-3, grad_clip=1.0),
        steps=20,
        batch_size=32,
        eval_every=10,
        eval_batch=64,
        log_every=5,
        checkpoint_every=10,
        device="cpu",
        cpu_threads=1,
        out_dir=tmp_path_factory.mktemp("nth"),
        run_name="run",
        tensorboard=False,
    )
    return run(config, "nth-farthest", argv=["relmem", "train", "nth-farthest"]).run_dir


def test_nth_farthest_round_trip(nth_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "exported" / "nf-rmc"  # its parent is made
    assert export(nth_run, out) == 0
    assert f"written {out}" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "config.json", "meta.json", "model.safetensors"]  # no data
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staging left
    ckpt = ckpt_io.resolve_checkpoint(nth_run)  # no best kept: the latest, step 20

    model, vocabulary, task_name, config = relmem.load_pretrained(out)
    assert (task_name, config.model, vocabulary) == ("nth-farthest", "rmc", None)
    assert not model.training
    assert_bit_identical(model, weights_of(ckpt))

    from_run = eval_record(nth_run, tmp_path / "run.json")
    from_folder = eval_record(out, tmp_path / "folder.json")
    assert from_folder["step"] == from_run["step"] == 20
    for key in ("accuracy", "loss", "count", "groups"):
        assert from_folder[key] == from_run[key], key

    card = (out / "README.md").read_text()
    accuracy = json.loads((nth_run / "summary.json").read_text())["held_out_accuracy"]
    assert "license: apache-2.0" in card and "Apache-2.0" in card
    assert f"held-out accuracy: **{100 * accuracy:.2f}%** at step 20" in card
    assert f"relmem eval {out.name}" in card and "relmem train nth-farthest" in card
    assert f"{relmem.models.count_parameters(model):,}" in card and "torch" in card

    # plot draws the attention maps from the folder; it has no curves to draw
    assert cli.main(["plot", str(out), "--examples", "1", "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "attention_example_0.png").is_file()
    assert "no learning curves" in capsys.readouterr().out


def test_a_chosen_checkpoint_and_force(nth_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()  # empty: taken
    first = ckpt_io.list_checkpoints(nth_run)[0]
    assert export(nth_run, out, "--checkpoint", str(first)) == 0
    assert json.loads((out / "meta.json").read_text())["step"] == 10
    assert "chosen (--checkpoint)" in (out / "README.md").read_text()
    assert_bit_identical(load_pretrained(out).model, weights_of(first))

    (out / "eval.json").write_text("{}")  # a reader's file beside the export
    assert export(nth_run, out) == 2  # not empty: refused
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out} is not empty; pass --force" in err
    assert json.loads((out / "meta.json").read_text())["step"] == 10  # untouched

    assert export(nth_run, out, "--force") == 0  # an earlier export: replaced
    assert json.loads((out / "meta.json").read_text())["step"] == 20
    assert not (out / "eval.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    with pytest.raises(ValueError, match="exported model, which holds one set of weights"):
        relmem.train.runs.load_trained(out, checkpoint=first)


def test_export_refuses_without_writing(nth_run: Path, tmp_path: Path, capsys, monkeypatch):
    def refused(*args: str, names: str) -> None:
        assert export(*args) == 2
        err = capsys.readouterr().err
        assert err.startswith("relmem export: error: ") and err.count("\n") == 1, err
        assert names in err, err

    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    refused(nth_run, other, "--force", names=f"{other} is not empty and holds no exported")
    assert [p.name for p in other.iterdir()] == ["keep.txt"]

    bare = tmp_path / "bare"  # a run that wrote its config and no checkpoint
    bare.mkdir()
    (bare / "config.json").write_text((nth_run / "config.json").read_text())
    refused(bare, tmp_path / "a", names="holds no checkpoint")

    afile = tmp_path / "afile"
    afile.write_text("")
    refused(nth_run, afile / "out", names="a parent of it is a file")
    refused(nth_run, afile, names=f"{afile} exists and is not a folder")
    refused(nth_run, nth_run, names=f"OUT_DIR {nth_run} is the run directory")

    out = tmp_path / "kept"
    assert export(nth_run, out) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(*args, **kwargs):
        raise RuntimeError("No space left on device")

    monkeypatch.setattr("relmem.pretrained.save_model", full_disk)
    refused(nth_run, out, "--force", names="model.safetensors: No space left on device")
    refused(nth_run, tmp_path / "new", names="No space left on device")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier one intact
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_bad_folders_name_the_file(nth_run: Path, tmp_path: Path, tiny, capsys) -> None:
    good = tmp_path / "good"
    assert export(nth_run, good) == 0

    def copy(name: str) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for p in good.iterdir():
            (folder / p.name).write_bytes(p.read_bytes())
        return folder

    def refused(folder: Path, names: str, *, match: str = "") -> None:
        with pytest.raises((ExportError, FileNotFoundError)) as info:
            load_pretrained(folder)
        assert names in str(info.value) and match in str(info.value), info.value
        assert cli.main(["eval", str(folder), "--json-out", str(tmp_path / "e.json")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and names in err, err

    missing = copy("missing")
    (missing / "config.json").unlink()
    refused(missing, str(missing / "config.json"))

    edited = copy("edited")
    config = json.loads((edited / "config.json").read_text())
    config["rmc"]["mem_slots"] = 3
    (edited / "config.json").write_text(json.dumps(config))
    refused(edited, str(edited / "config.json"), match="rmc.mem_slots is 3")

    unknown = copy("unknown")
    (unknown / "config.json").write_text(json.dumps({**config, "optim": {}}))
    refused(unknown, str(unknown / "config.json"), match="unknown keys ['optim']")

    # another model's weights: another size exported, its weights copied in
    bigger = RMCModelConfig(mem_slots=3, head_size=8, num_heads=2)
    small = run(tiny(run_name="m3", rmc=bigger, steps=2, checkpoint_every=2), "nth-farthest")
    assert export(small.run_dir, tmp_path / "m3-out") == 0
    other = copy("other")
    (other / "model.safetensors").write_bytes((tmp_path / "m3-out/model.safetensors").read_bytes())
    refused(other, str(other / "model.safetensors"), match="rmc.mem_slots is 2, but")

    # relmem's header kept, the shapes changed and the hash brought in line: the load says so
    shaped = copy("shaped")
    with safe_open(str(shaped / "model.safetensors"), framework="pt") as f:
        metadata = f.metadata()
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open's API)
    state = {k: torch.zeros(v.shape[0] + 1, *v.shape[1:]) for k, v in state.items()}
    save_file(state, str(shaped / "model.safetensors"), metadata=metadata)
    meta = json.loads((shaped / "meta.json").read_text())
    meta["sha256"]["model.safetensors"] = sha256(shaped / "model.safetensors")
    (shaped / "meta.json").write_text(json.dumps(meta))
    refused(shaped, f"cannot load weights from {shaped / 'model.safetensors'}", match="size")

    plain = copy("plain")
    save_file(state, str(plain / "model.safetensors"))  # plain save_file: no relmem header
    refused(plain, str(plain / "model.safetensors"), match="not written by relmem export")

    foreign = copy("foreign")
    torch.save({"weights": torch.zeros(3)}, foreign / "model.safetensors")  # a pickle
    refused(foreign, str(foreign / "model.safetensors"), match="not a safetensors file")

    flipped = copy("flipped")
    raw = bytearray((flipped / "model.safetensors").read_bytes())
    raw[-1] ^= 1  # a bit of the last weight
    (flipped / "model.safetensors").write_bytes(bytes(raw))
    refused(flipped, str(flipped / "model.safetensors"), match="SHA-256")

    # the task's section may be edited (a larger held-out set, the data's new place)
    config = json.loads((good / "config.json").read_text())
    config["task"]["test_size"] = 16
    free = copy("free")
    (free / "config.json").write_text(json.dumps(config))
    assert load_pretrained(free).task_name == "nth-farthest"
    assert eval_record(free, tmp_path / "free.json")["count"] == 16

    with pytest.raises(ExportError, match="is a run directory, not an exported model"):
        load_pretrained(nth_run)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(tmp_path / "nowhere")


def test_language_model_round_trip(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for split, text in CORPUS.items():
        (data / f"{split}.txt").write_text(text)
    args = ["train", "lm", "--data-dir", str(data), "--device", "cpu", "--steps", "4"]
    args += ["--batch-size", "2", "--eval-batch", "2", "--eval-every", "2", "--log-every", "2"]
    args += ["--checkpoint-every", "2", "--task.bptt", "4", "--task.eval-rows", "2"]
    args += ["--task.embedding-size", "8", "--task.softmax", "full", "--rmc.head-size", "4"]
    args += ["--rmc.mem-slots", "1", "--cpu-threads", "1"]
    args += ["--out-dir", str(tmp_path), "--run-name", "lm", "--no-tensorboard"]
    assert cli.main(args) == 0
    run_dir, out = tmp_path / "lm", tmp_path / "lm-out"
    assert export(run_dir, out) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "README.md",
        "config.json",
        "data.json",
        "meta.json",
        "model.safetensors",
        "vocab.json",
    ]
    assert (out / "data.json").read_text() == (run_dir / "data.json").read_text()

    model, vocabulary, task_name, _ = load_pretrained(out)  # from config.json: no corpus read
    best = ckpt_io.best_checkpoint(run_dir)
    assert best is not None
    assert_bit_identical(model, weights_of(best))  # the tied embedding and decoder too
    tied = len(list(model.named_parameters(remove_duplicate=False)))
    assert tied == len(list(model.parameters())) + 1  # the decoder's weight is the embedding's
    words = {w for text in CORPUS.values() for w in text.split()}
    assert task_name == "lm" and set(vocabulary) == words | {"<eos>"}
    assert vocabulary.index("the") == 0  # the corpus's order: its first word first

    config = json.loads((out / "config.json").read_text())
    assert config["task"]["data_dir"] == "data"  # its name: the user points it at their copy
    config["task"]["data_dir"] = str(data)
    (out / "config.json").write_text(json.dumps(config))
    from_run = eval_record(run_dir, tmp_path / "r.json")
    from_folder = eval_record(out, tmp_path / "f.json")
    assert from_folder["perplexity"] == from_run["perplexity"]
    assert from_folder["more_held_out"] == from_run["more_held_out"]
    card = (out / "README.md").read_text()
    assert "perplexity" in card and "vocab.json" in card and "data.json" in card

    prompt = ["--prompt", "the lamps", "--tokens", "5", "--seed", "3"]
    capsys.readouterr()
    assert cli.main(["generate", str(run_dir), *prompt]) == 0
    sampled = capsys.readouterr().out
    assert cli.main(["generate", str(out), *prompt]) == 0
    assert capsys.readouterr().out == sampled

    (data / "train.txt").write_text(CORPUS["train"].replace("lamps", "lights"))  # ids move
    assert cli.main(["eval", str(out), "--json-out", str(tmp_path / "x.json")]) == 2
    assert "data.json" in capsys.readouterr().err
    shutil.rmtree(data)  # generating from the folder needs its vocabulary alone
    assert cli.main(["generate", str(out), *prompt]) == 0
    assert capsys.readouterr().out == sampled


def test_learning_to_execute_round_trip(tiny, tmp_path: Path) -> None:
    settings = {"task_type": "addition", "max_length": 2, "max_nesting": 1, "test_size": 32}
    config = tiny(task=LearnToExecuteConfig(**settings), model="lstm", steps=4, eval_every=2)
    config.checkpoint_every, config.eval_batch, config.cpu_threads = 2, 16, 1
    run_dir = run(config, "lte").run_dir
    out = tmp_path / "lte-out"
    assert export(run_dir, out) == 0
    model, vocabulary, task_name, _ = load_pretrained(out)
    assert task_name == "lte" and vocabulary == list(SYMBOLS)
    assert json.loads((out / "vocab.json").read_text()) == list(SYMBOLS)
    best = ckpt_io.best_checkpoint(run_dir) or ckpt_io.resolve_checkpoint(run_dir)
    assert_bit_identical(model, weights_of(best))
    from_run = eval_record(run_dir, tmp_path / "r.json")
    from_folder = eval_record(out, tmp_path / "f.json")
    for key in ("accuracy", "loss", "breakdown"):
        assert from_folder[key] == from_run[key], key


class _FakeHub(types.ModuleType):
    """A stand-in ``huggingface_hub``: records uploads, serves a local folder as a snapshot."""

    def __init__(self, snapshot: Path | None = None) -> None:
        super().__init__("huggingface_hub")
        self.calls: list[tuple[str, dict]] = []
        hub = self

        class HfApi:
            def create_repo(self, repo_id: str, **kwargs):
                hub.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
                return f"https://huggingface.co/{repo_id}"

            def upload_folder(self, **kwargs):
                hub.calls.append(("upload_folder", kwargs))

        def snapshot_download(repo_id: str, **kwargs) -> str:
            hub.calls.append(("snapshot_download", {"repo_id": repo_id, **kwargs}))
            if snapshot is None:
                raise OSError("We couldn't connect to 'https://huggingface.co'")
            return str(snapshot)

        self.HfApi = HfApi
        self.snapshot_download = snapshot_download


def test_the_hub_through_its_library(nth_run: Path, tmp_path: Path, monkeypatch, capsys):
    out = tmp_path / "hub-out"
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    with pytest.raises(ExportError, match=r"pip install 'relmem\[hub\]'"):
        load_pretrained("someone/nf-rmc")
    assert export(nth_run, out, "--push", "someone/nf-rmc") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "relmem[hub]" in err and "is written" in err
    assert (out / "model.safetensors").is_file()

    hub = _FakeHub(snapshot=out)
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    assert export(nth_run, out, "--force", "--push", "someone/nf-rmc") == 0
    assert "pushed to https://huggingface.co/someone/nf-rmc" in capsys.readouterr().out
    (name, upload) = hub.calls[-1]
    assert name == "upload_folder" and upload["folder_path"] == str(out)
    assert upload["repo_id"] == "someone/nf-rmc" and "model.safetensors" in upload["allow_patterns"]
    loaded = load_pretrained("someone/nf-rmc", revision="main")
    assert hub.calls[-1][1]["revision"] == "main"
    assert_bit_identical(loaded.model, load_file(str(out / "model.safetensors")))

    monkeypatch.setitem(sys.modules, "huggingface_hub", _FakeHub(snapshot=None))  # offline
    with pytest.raises(ExportError, match="couldn't connect.*offline, or no such repository"):
        load_pretrained("someone/nf-rmc")


def test_the_model_spec_round_trips_and_builds_nothing_else(monkeypatch) -> None:
    options = {"lm": LMOptions(softmax="adaptive", tie_weights=False, cutoffs=(2, 5))}
    spec = TaskSpec(9, 4, 9, "per_step", "embedding", 3, DecoderSpec(2, 1), options)
    data = json.loads(json.dumps(spec_to_dict(spec)))
    assert spec_from_dict(data, "spec") == spec

    @dataclasses.dataclass(frozen=True)
    class Initialised:
        size: int = 2
        vectors: Callable[[], torch.Tensor] | None = None

    with pytest.raises(ValueError, match="'x' is a Initialised, not a registered option"):
        spec_to_dict(TaskSpec(1, 1, 1, options={"x": Initialised(3, torch.zeros)}))
    monkeypatch.setattr(relmem.models.spec, "_OPTIONS", dict(relmem.models.spec._OPTIONS))
    register_option(Initialised)  # an option of relmem's
    fields = spec_to_dict(TaskSpec(1, 1, 1, options={"x": Initialised(3, torch.zeros)}))
    assert fields["options"]["x"] == {"type": "Initialised", "fields": {"size": 3, "vectors": None}}

    for name in ("os.system", "relmem.pretrained.export_run", "relmem.nowhere.Thing", 3):
        data["options"]["lm"]["type"] = name
        with pytest.raises(ValueError, match="is not a relmem option class"):
            spec_from_dict(data, "spec")


def test_files_arriving_meanwhile_are_not_replaced(nth_run: Path, tmp_path: Path, monkeypatch):
    """OUT_DIR is checked again just before the rename: a file written there while the export
    was staged (by another process) stays, and the export is refused."""
    out = tmp_path / "out"
    check = relmem.pretrained.load_pretrained

    def meanwhile(folder, **kwargs):
        out.mkdir(exist_ok=True)
        (out / "theirs.txt").write_text("theirs")
        return check(folder, **kwargs)

    monkeypatch.setattr("relmem.pretrained.load_pretrained", meanwhile)
    for extra in ((), ("--force",)):
        assert export(nth_run, out, *extra) == 2
        assert [p.name for p in out.iterdir()] == ["theirs.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
