"""The exported model folder (``relmem export``): its format, read back and checked.

An exported folder holds one trained model without its run::

    config.json        # what rebuilds the model: the task's name and config (its paths as
                       # names), the model's name and section, the head and the task's model
                       # spec (shapes, vocabulary size), with "format": "relmem-pretrained/1"
    model.safetensors  # the weights; their metadata repeats config.json's model part
    meta.json          # the step and the SHA-256 of the weights and data files (a checkpoint's)
    data.json          # the task's data identity, when it has one (a corpus's vocabulary)
    vocab.json         # the tokens in id order, when the task reads tokens
    README.md          # the model card

:func:`relmem.train.runs.load_run_config` and :func:`~relmem.train.runs.load_trained` read such
a folder as they read a run directory, so every command that takes a run (``eval``,
``generate``, ``play``, ``plot``) takes a folder too; :func:`relmem.pretrained.load_pretrained`
rebuilds the model from ``config.json`` alone (no task data). Nothing is read with pickle, and
nothing a file names is imported (a spec's option classes come from a closed table,
:func:`relmem.models.spec.register_option`); every file is opened through :mod:`relmem.files`
(a FIFO, a device or an oversized file is refused before it is read).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model
from torch import nn

from relmem.files import FileRefused, MiB, file_digest, open_regular, read_json
from relmem.models.spec import DecoderSpec, TaskSpec, option_class, option_name, option_names
from relmem.tasks.registry import get_task
from relmem.train.checkpoint import META_FILE, MODEL_FILE, unwrap
from relmem.train.config import FREE_MODEL_FIELDS, TrainConfig, config_from_dict, config_to_dict

FORMAT = "relmem-pretrained/1"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
CARD_FILE = "README.md"
DATA_FILE = "data.json"  # the same name as a run's (relmem.train.runs.DATA_FILE)
WEIGHTS_KEY = "relmem_model"  # model.safetensors' metadata: the model part of config.json
HASHED = (MODEL_FILE, DATA_FILE, VOCAB_FILE)  # meta.json's SHA-256s (those present)
_SECTIONS = ("format", "task_name", "task", "model", "head", "spec")
MAX_JSON_BYTES = 16 * MiB  # config.json, meta.json, data.json: a few kilobytes when written
MAX_VOCAB_BYTES = 256 * MiB  # vocab.json: a large corpus's words are tens of megabytes
# the dtypes of model.safetensors' header, by the torch dtype a model's tensor has
_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


class ExportError(ValueError):
    """An exported folder is incomplete, edited or holds another model's weights (the
    message names the file)."""


def sha256(path: Path) -> str:
    """The hex SHA-256 of the regular file at ``path`` (:func:`relmem.files.file_digest`: a
    FIFO or a device is refused, not read).

    Raises:
        ExportError: ``path`` is missing, unreadable or not a regular file (naming it).
    """
    try:
        return file_digest(path, "sha256")
    except FileRefused as exc:
        raise ExportError(f"{exc}; the folder is not a complete exported model") from None


def _open(path: Path) -> int:
    """:func:`relmem.files.open_regular` (any size), its refusal an :class:`ExportError`."""
    try:
        return open_regular(path)
    except FileRefused as exc:
        raise ExportError(f"{exc}; the folder is not a complete exported model") from None


def _read_json(path: Path, max_bytes: int) -> Any:
    """:func:`relmem.files.read_json`, its refusal an :class:`ExportError` (naming the file)."""
    try:
        return read_json(path, max_bytes)
    except FileRefused as exc:
        raise ExportError(f"{exc}; the folder is not a complete exported model") from None


def read_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (at most :data:`MAX_JSON_BYTES`).

    Raises:
        ExportError: the file is missing, not a regular file, too large, not JSON or not an
            object (naming it).
    """
    data = _read_json(path, MAX_JSON_BYTES)
    if not isinstance(data, dict):
        raise ExportError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def is_exported(folder: Path) -> bool:
    """Whether ``folder``'s ``config.json`` is an exported model's (it names the format); a
    run's, a missing one and one that cannot be read (a FIFO, a device, too large, not JSON:
    refused without blocking or reading it whole) are not."""
    try:
        data = read_json(Path(folder) / CONFIG_FILE, MAX_JSON_BYTES)
    except FileRefused:
        return False
    return isinstance(data, dict) and "format" in data


def export_config(config: TrainConfig, task_name: str, spec: TaskSpec | None) -> dict[str, Any]:
    """``config.json`` of an exported model: the format, the task's name and config, the model's
    name and section, the head and the model spec (None for an RL agent, which its task
    builds).

    The task's paths (a corpus's ``data_dir``, the reader's ``train_file``) are recorded as
    their last component only, the name of the file or folder: a shared model does not
    publish its trainer's directory layout, and a user points them at their own copy.
    """
    full = config_to_dict(config)
    for field in dataclasses.fields(config.task):
        value = getattr(config.task, field.name)
        if isinstance(value, Path):
            full["task"][field.name] = value.name
    return {
        "format": FORMAT,
        "task_name": task_name,
        "task": full["task"],
        "model": config.model,
        config.model: full[config.model],
        "head": full["head"],
        "spec": None if spec is None else spec_to_dict(spec),
    }


def weights_fingerprint(data: dict[str, Any]) -> dict[str, Any]:
    """The part of :func:`export_config`'s output that decides the weights' shapes and meaning:
    the model, its section (less its implementation, which computes the same function), the
    head and the spec."""
    name = data["model"]
    section = {k: v for k, v in data[name].items() if k not in FREE_MODEL_FIELDS}
    return {"model": name, name: section, "head": data["head"], "spec": data["spec"]}


def parse_config(folder: Path) -> tuple[str, TrainConfig, dict[str, Any]]:
    """``(task_name, config, normalised config.json)`` of an exported folder: the training
    options it does not hold take their defaults.

    Raises:
        ExportError / ValueError / TypeError: the file is missing or not a valid exported
            config (naming it and the key).
    """
    path = Path(folder) / CONFIG_FILE
    data = read_object(path)
    if data.get("format") != FORMAT:
        raise ExportError(
            f"{path}: format {data.get('format')!r} is not one this relmem reads ({FORMAT!r})"
        )
    task_name = data.get("task_name")
    if not isinstance(task_name, str):
        raise ExportError(f"{path}: task_name must be a string naming a task, got {task_name!r}")
    try:
        entry = get_task(task_name)
    except KeyError as exc:
        raise ExportError(f"{path}: task_name: {exc.args[0]}") from None
    model = data.get("model")
    allowed = {*_SECTIONS, model} if isinstance(model, str) else set(_SECTIONS)
    unknown = sorted(set(data) - allowed)
    if unknown or not isinstance(model, str):
        what = f"unknown keys {unknown}" if unknown else f"model must be a string, got {model!r}"
        raise ExportError(
            f"{path}: {what}; an exported config holds {', '.join(_SECTIONS)} and "
            "the model's section"
        )
    train = {k: data[k] for k in ("task", "model", "head", model) if k in data}
    try:
        config = config_from_dict(TrainConfig[entry.config_cls], train, where=str(path))
        spec = None if data.get("spec") is None else spec_from_dict(data["spec"], f"{path}.spec")
    except (TypeError, ValueError) as exc:
        message = str(exc)
        raise ExportError(message if str(path) in message else f"{path}: {message}") from None
    normal = export_config(config, task_name, spec)
    return task_name, config, normal


def read_spec(folder: Path) -> TaskSpec | None:
    """The model spec in ``folder``'s ``config.json`` (None: an RL agent's, built by its task).

    Raises:
        ExportError: as :func:`parse_config`.
    """
    _, _, data = parse_config(folder)
    spec = data["spec"]
    return None if spec is None else spec_from_dict(spec, f"{Path(folder) / CONFIG_FILE}.spec")


def spec_to_dict(spec: TaskSpec) -> dict[str, Any]:
    """``spec`` as JSON values; each option (a registered config dataclass, such as a language
    model's ``LMOptions``: :func:`relmem.models.spec.register_option`) as
    ``{"type": "LMOptions", "fields": {...}}``, a field holding a callable (an initialiser run
    when the model is built, such as pretrained word vectors) as null: the exported weights
    hold what it made.

    Raises:
        ValueError: an option whose class is not registered.
    """
    data = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    data["decoder"] = None if spec.decoder is None else dataclasses.asdict(spec.decoder)
    options = {}
    for name, value in spec.options.items():
        kind = type(value)
        registered = option_name(kind)
        if registered is None:
            raise ValueError(
                f"the model spec's option {name!r} is a {kind.__name__}, not a registered "
                "option class (relmem.models.spec.register_option): it cannot be written to "
                "config.json"
            )
        fields = config_to_dict(value)
        for field in dataclasses.fields(value):  # an initialiser: the weights hold its result
            if callable(getattr(value, field.name)):
                fields[field.name] = None
        options[name] = {"type": registered, "fields": fields}
    data["options"] = options
    return data


def spec_from_dict(data: Any, where: str) -> TaskSpec:
    """The :class:`TaskSpec` of :func:`spec_to_dict`'s output, strictly (an option's type must
    name a registered option class; nothing is imported, nothing else is built).

    Raises:
        ValueError / TypeError: naming ``where`` and the key.
    """
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected an object, got {data!r}")
    data = dict(data)
    options = data.pop("options", {})
    decoder = data.pop("decoder", None)
    spec = config_from_dict(TaskSpec, data, where)
    if decoder is not None:
        decoder = config_from_dict(DecoderSpec, decoder, f"{where}.decoder")
    if not isinstance(options, dict):
        raise TypeError(f"{where}.options: expected an object, got {options!r}")
    built = {name: _option(value, f"{where}.options.{name}") for name, value in options.items()}
    return dataclasses.replace(spec, decoder=decoder, options=built)


def _option(data: Any, where: str) -> Any:
    """One option of a spec, ``{"type": "LMOptions", "fields": {...}}``, its class looked up
    in the closed table of registered options (:func:`relmem.models.spec.option_class`)."""
    if not isinstance(data, dict) or set(data) != {"type", "fields"}:
        raise TypeError(f"{where}: expected an object with 'type' and 'fields', got {data!r}")
    name = data["type"]
    cls = option_class(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(
            f"{where}.type: {json.dumps(name)[:100]} is not a relmem option class (one of "
            f"{', '.join(option_names())}); config.json names no module to import"
        )
    return config_from_dict(cls, data["fields"], f"{where}.fields")


def check_spec(folder: Path, spec: TaskSpec | None) -> None:
    """Refuse a task whose model spec (``spec``, built from its data) differs from the one the
    folder's weights were exported with.

    Raises:
        ExportError: naming ``config.json`` and the first differing entry.
    """
    path = Path(folder) / CONFIG_FILE
    recorded = parse_config(folder)[2]["spec"]
    now = None if spec is None else spec_to_dict(spec)
    difference = first_difference(recorded, now, "spec")
    if difference is not None:
        key, before, after = difference
        raise ExportError(
            f"{path}: {key} is {json.dumps(before)}, but the task built from its data gives "
            f"{json.dumps(after)}; the weights would read the data wrongly"
        )


def first_difference(a: Any, b: Any, where: str) -> tuple[str, Any, Any] | None:
    """The first dotted key at which two JSON values differ, with both values; None if equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            found = first_difference(a.get(key), b.get(key), f"{where}.{key}")
            if found is not None:
                return found
        return None
    return None if a == b else (where, a, b)


def read_vocabulary(folder: Path, spec: TaskSpec | None) -> list[str] | dict[str, list[str]] | None:
    """``vocab.json``: the tokens in id order, or such lists by name (None: no file), as many
    as the model built from ``spec`` has ids (:func:`vocabulary_sizes`).

    Raises:
        ExportError: the file is not a regular file of at most :data:`MAX_VOCAB_BYTES`, not a
            JSON list of strings (an object of such lists for the reader), or its sizes are
            not the model's (naming it).
    """
    path = Path(folder) / VOCAB_FILE
    if not path.exists() and not path.is_symlink():
        return None
    data = _read_json(path, MAX_VOCAB_BYTES)
    sizes = vocabulary_sizes(spec)
    if isinstance(sizes, dict):
        if not isinstance(data, dict) or set(data) != set(sizes):
            raise ExportError(
                f"{path} must hold an object of the token lists {sorted(sizes)} (each a JSON "
                f"list of strings in id order), got {_kind_of(data)}: it is not this model's "
                "vocabulary"
            )
        found = {name: data[name] for name in sizes}
    else:
        found = {"tokens": data}
    for name, tokens in found.items():
        what = "its tokens" if name == "tokens" else f"its {name!r} list"
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ExportError(
                f"{path}: {what} must be a JSON list of strings in id order, got {_kind_of(tokens)}"
            )
        wanted = sizes[name] if isinstance(sizes, dict) else sizes
        if wanted is not None and len(tokens) != wanted:
            raise ExportError(
                f"{path}: {what} number {len(tokens):,}, but the model has {wanted:,} ids "
                f"({CONFIG_FILE}'s spec): it is not this model's vocabulary; use the one "
                "exported with it"
            )
    return data


def vocabulary_sizes(spec: TaskSpec | None) -> int | dict[str, int] | None:
    """How many tokens the model built from ``spec`` reads: the sizes of several token tables
    by name where one of its options declares them (``vocabulary_sizes``: the reader's words
    and characters), else one token list's size (``spec.input_size``); None when ``spec``
    says nothing (an RL agent's)."""
    if spec is None:
        return None
    for option in spec.options.values():
        sizes = getattr(option, "vocabulary_sizes", None)
        if isinstance(sizes, dict):
            return sizes
    return spec.input_size


def _kind_of(value: Any) -> str:
    """A JSON value's kind, in words (for messages)."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return kinds.get(type(value), "a number" if isinstance(value, (int, float)) else "null")


def check_files(folder: Path) -> dict[str, Any]:
    """``meta.json`` once the files it hashes (the weights, ``data.json``, ``vocab.json``)
    match it.

    Raises:
        ExportError: a file is missing or does not match (naming it).
    """
    folder = Path(folder)
    meta = read_object(folder / META_FILE)
    hashes = meta.get("sha256")
    if not isinstance(hashes, dict) or not isinstance(meta.get("step"), int):
        raise ExportError(f"{folder / META_FILE} must hold the step and the files' sha256")
    for name in HASHED:
        path = folder / name
        if name not in hashes:
            if path.exists():
                raise ExportError(f"{path} is not one of the exported files ({folder / META_FILE})")
            continue
        if sha256(path) != hashes[name]:
            raise ExportError(
                f"{path} is truncated, corrupt or replaced (its SHA-256 does not match "
                f"{folder / META_FILE})"
            )
    return meta


def check_weights(folder: Path) -> None:
    """Refuse ``model.safetensors`` when it is not relmem's export or was saved for another
    model than ``config.json`` describes (read from its header alone).

    Raises:
        ExportError: naming the file and, for another model, the first differing entry.
    """
    folder = Path(folder)
    file = folder / MODEL_FILE
    config = parse_config(folder)[2]
    os.close(_open(file))  # a FIFO or a device (a link to /dev/zero) is refused, not read
    try:
        with safe_open(str(file), framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise ExportError(f"{file} is not a safetensors file ({reason})") from None
    try:
        saved = json.loads(metadata[WEIGHTS_KEY])
    except (KeyError, ValueError):
        raise ExportError(
            f"{file} was not written by relmem export (its header does not describe the model), "
            f"so it cannot be matched with {folder / CONFIG_FILE}"
        ) from None
    difference = first_difference(saved, weights_fingerprint(config), "model")
    if difference is not None:
        key, before, after = difference
        key = key.removeprefix("model.")
        raise ExportError(
            f"{folder / CONFIG_FILE}: {key} is {json.dumps(after)}, but {file} holds the weights "
            f"of a model with {json.dumps(before)} (config.json was edited after the export, or "
            "the weights are another model's)"
        )


def load_weights(folder: Path, model: nn.Module, device: torch.device | str = "cpu") -> int:
    """Load an exported folder's weights into ``model`` (strict), after :func:`check_weights`,
    :func:`check_files` and :func:`check_dtypes`; the step they were saved at (the model's
    sizes are bounded before it is built: :func:`relmem.train.runs.check_model_size`).

    Raises:
        ExportError: naming the file that is wrong.
    """
    folder = Path(folder)
    check_weights(folder)
    step = check_files(folder)["step"]
    file = folder / MODEL_FILE
    check_dtypes(file, model)
    try:
        missing, unexpected = load_model(unwrap(model), str(file), strict=True, device=str(device))
    except (SafetensorError, RuntimeError, OSError) as exc:
        reason = " ".join(str(exc).split())
        raise ExportError(f"cannot load weights from {file}: {reason}") from None
    if missing or unexpected:  # strict=True raises first; kept for older safetensors
        raise ExportError(f"{file}: missing {missing}, unexpected {unexpected}")
    return int(step)


def check_dtypes(file: Path, model: nn.Module) -> None:
    """Refuse weights in ``file`` whose dtypes are not those of ``model``'s tensors of the same
    names (integer weights would be cast silently by loading), read from the header alone.

    Raises:
        ExportError: naming the file, the first tensor and both dtypes.
    """
    state = unwrap(model).state_dict()
    try:
        with safe_open(str(file), framework="pt") as f:
            stored = {name: f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise ExportError(f"{file} is not a safetensors file ({reason})") from None
    for name, dtype in stored.items():
        if name not in state:
            continue  # load_model's strict check names it
        wanted = _SAFETENSORS_DTYPES.get(state[name].dtype, str(state[name].dtype))
        if dtype != wanted:
            raise ExportError(
                f"{file}: {name} is stored as {dtype}, but the model's is {wanted}: these are "
                "not weights relmem exported (re-export the run)"
            )
