"""The public PyTorch port's ``RelationalMemory``, loaded from a copy the user supplies.

``relmem bench --against-port PATH`` times L0SG/relational-rnn-pytorch's
``relational_rnn_general.py`` (``docs/targets.md`` §3.2) beside relmem's cores. Its code is not
part of relmem: the user points at their own copy, and this module loads it as it is.

The port was written for PyTorch 0.4–1.0. One line of it no longer runs: ``q *= scale`` on an
output of ``torch.split``, which current autograd refuses (in-place on one of several views).
The loader does not edit the file; it runs it against a ``torch`` whose ``split`` returns
views autograd lets it modify in place (``torch.unsafe_split``), the behaviour the port was
written for. Nothing else is changed.
"""

from __future__ import annotations

import importlib.util
import inspect
import types
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from relmem.files import file_digest

PORT_FILE = "relational_rnn_general.py"
PORT_CLASS = "RelationalMemory"


def _split(tensor: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.split`` as the port's PyTorch had it: outputs may be modified in place."""
    if isinstance(split_size_or_sections, int):
        return tuple(torch.unsafe_split(tensor, split_size_or_sections, dim))
    return tuple(torch.unsafe_split_with_sizes(tensor, list(split_size_or_sections), dim))


class _PortTorch(types.ModuleType):
    """The ``torch`` module as the loaded port sees it: ``torch`` itself but for ``split``."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.split = _split

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class PortError(ValueError):
    """The file is not a usable copy of the port (the message says why)."""


def load_port_class(path: Path) -> type[nn.Module]:
    """Import the port's file and return its ``RelationalMemory`` class.

    Args:
        path: the user's copy of ``relational_rnn_general.py``.

    Raises:
        PortError: the file is missing, is not a ``.py`` file, does not import, or has no
            ``RelationalMemory`` ``nn.Module`` taking ``mem_slots, head_size, input_size``.
    """
    path = Path(path)
    expected = f"give your copy of L0SG/relational-rnn-pytorch's {PORT_FILE}"
    if not path.is_file():
        raise PortError(f"--against-port: no such file: {path}; {expected}")
    if path.suffix != ".py":
        raise PortError(f"--against-port: {path} is not a Python (.py) file; {expected}")
    spec = importlib.util.spec_from_file_location("relmem_port_under_test", path)
    assert spec is not None and spec.loader is not None  # a .py file has a source loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: report any failure in one line
        raise PortError(f"--against-port: {path} failed to import: {exc!r}") from exc
    port = getattr(module, PORT_CLASS, None)
    if not (isinstance(port, type) and issubclass(port, nn.Module)):
        raise PortError(f"--against-port: {path} defines no nn.Module named {PORT_CLASS}")
    needed = {"mem_slots", "head_size", "input_size", "return_all_outputs"}
    missing = needed - set(inspect.signature(port).parameters)
    if missing:
        raise PortError(
            f"--against-port: {path}'s {PORT_CLASS} lacks the port's arguments {sorted(missing)}"
        )
    module.torch = _PortTorch()  # read at call time by every function of the module
    return port


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of the file, recorded so a result names the exact copy timed."""
    return file_digest(path, "sha256")


def port_arguments(port: type[nn.Module], rmc: dict[str, Any]) -> dict[str, Any] | None:
    """The port's constructor arguments for a bench configuration's ``RelationalMemory`` ones.

    The port names its arguments as relmem does; None when the configuration uses an option
    the port does not have (its row is then left out).
    """
    accepted = set(inspect.signature(port).parameters)
    if not set(rmc) <= accepted:
        return None
    return {**rmc, "return_all_outputs": True}


class PortCore(nn.Module):
    """The port behind relmem's sequence call: ``inputs [T, B, F] -> (outputs, memory)``.

    The port is batch-first and takes its initial memory; its outputs are the per-step memories
    concatenated over time, ``[T·B, N·M]``, and the final memory ``[B, N, M]``.
    """

    def __init__(self, port: nn.Module) -> None:
        super().__init__()
        self.port = port

    def forward(self, inputs: Tensor) -> tuple[Tensor, tuple[Tensor]]:
        memory = self.port.initial_state(inputs.shape[1]).to(inputs)
        outputs, final = self.port(inputs.transpose(0, 1), memory)
        return outputs, (final,)
