"""Argument checks shared by every constructor and config in relmem.

Two message styles, one per kind of caller, so that an error always names what was wrong:

- library constructors check Python values strictly (``bool`` is not an integer) and name the
  class: ``"DNCCell: memory_size must be an integer >= 1, got 0"`` (:func:`check_int`,
  :func:`check_float`, :func:`check_int_order`);
- config dataclasses, whose values come from the CLI or a ``config.json``, name the dotted
  option: ``"task.num_bits must be >= 1, got 0"`` (:func:`check_at_least`,
  :func:`check_positive`, :func:`check_order`).
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable
from typing import Any, Literal, overload

import torch


def _prefix(owner: str | None) -> str:
    return f"{owner}: " if owner else ""


def as_int(value: Any) -> int | None:
    """``value`` as a Python ``int`` if it is an integer (Python's or NumPy's, anything with
    ``__index__``) and not a ``bool``; else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


@overload
def check_int(
    name: str,
    value: Any,
    minimum: int = 1,
    *,
    owner: str | None = None,
    optional: Literal[False] = False,
    maximum: int | None = None,
) -> int: ...
@overload
def check_int(
    name: str,
    value: Any,
    minimum: int = 1,
    *,
    owner: str | None = None,
    optional: bool,
    maximum: int | None = None,
) -> int | None: ...
def check_int(
    name: str,
    value: Any,
    minimum: int = 1,
    *,
    owner: str | None = None,
    optional: bool = False,
    maximum: int | None = None,
) -> int | None:
    """``value`` as an ``int`` if it is an integer (:func:`as_int`) ``>= minimum`` (and
    ``<= maximum`` when given; or None, if ``optional``).

    Raises:
        ValueError: ``"{owner}: {name} must be an integer >= {minimum}, got {value!r}"``
        (``"must be None or an integer"`` when ``optional``; ``"in {minimum}..{maximum}"``
        when bounded).
    """
    if optional and value is None:
        return None
    number = as_int(value)
    if number is None or number < minimum or (maximum is not None and number > maximum):
        kind = "None or an integer" if optional else "an integer"
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ValueError(f"{_prefix(owner)}{name} must be {kind} {bound}, got {value!r}")
    return number


def check_ints(owner: str | None, /, **values: Any) -> None:
    """:func:`check_int` (minimum 1) of each named value, in order.

    Raises:
        ValueError: for the first that is not an integer >= 1, as :func:`check_int`.
    """
    for name, value in values.items():
        check_int(name, value, owner=owner)


def check_bool(name: str, value: Any, *, owner: str | None = None) -> bool:
    """``value`` if it is a ``bool`` (a flag given as 1 or "yes" is refused, not guessed at).

    Raises:
        TypeError: ``"{owner}: {name} must be True or False, got {value!r}"``.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{_prefix(owner)}{name} must be True or False, got {value!r}")
    return value


def check_float(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    positive: bool = False,
    owner: str | None = None,
    note: str = "",
) -> float:
    """``float(value)`` for a real number that is not NaN, ``> 0`` (``positive``) or
    ``>= minimum`` when asked.

    Raises:
        ValueError: ``"{owner}: {name} must be a float >= {minimum}{note}, got {value!r}"``.
    """
    bound = " > 0" if positive else (f" >= {minimum:g}" if minimum is not None else "")
    message = f"{_prefix(owner)}{name} must be a float{bound}{note}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(message)
    if (positive and not value > 0) or (minimum is not None and value < minimum):
        raise ValueError(message)
    return float(value)


def check_at_least(prefix: str, config: object, **minimums: float) -> None:
    """Each named field of ``config`` is a finite number ``>= `` its minimum (None, an unset
    optional field, passes; NaN and infinities do not).

    Raises:
        ValueError: ``"{prefix}{field} must be >= {minimum}, got {value}"`` for the first one
        that is not (``prefix`` is the option's path, such as ``'task.'``), ``"... must be
        finite, got inf"`` for an infinity.
    """
    for name, minimum in minimums.items():
        value = getattr(config, name)
        if value is not None and not value >= minimum:
            raise ValueError(f"{prefix}{name} must be >= {minimum}, got {value}")
        _check_finite(prefix, name, value)


def check_at_most(prefix: str, config: object, note: str = "", **maximums: float) -> None:
    """Each named field of ``config`` is ``<=`` its maximum (None, an unset optional field,
    passes): for sizes whose cost grows without bound.

    Raises:
        ValueError: ``"{prefix}{field} must be <= {maximum}{note}, got {value}"`` for the first
        one that is not.
    """
    for name, maximum in maximums.items():
        value = getattr(config, name)
        if value is not None and value > maximum:
            raise ValueError(f"{prefix}{name} must be <= {maximum}{note}, got {value}")


def check_positive(prefix: str, config: object, *names: str) -> None:
    """Each named field of ``config`` is a finite number ``> 0`` (None, an unset optional
    field, passes).

    Raises:
        ValueError: ``"{prefix}{field} must be > 0, got {value}"`` for the first one that is
        not, ``"... must be finite, got inf"`` for an infinity.
    """
    for name in names:
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise ValueError(f"{prefix}{name} must be > 0, got {value}")
        _check_finite(prefix, name, value)


def _check_finite(prefix: str, name: str, value: Any) -> None:
    if value is not None and math.isinf(value):
        raise ValueError(f"{prefix}{name} must be finite, got {value}")


def check_order(prefix: str, config: object, low: str, high: str) -> None:
    """Field ``low`` of ``config`` is ``<=`` field ``high``.

    Raises:
        ValueError: ``"{prefix}{low} ({v}) must be <= {prefix}{high} ({w})"``.
    """
    lo, hi = getattr(config, low), getattr(config, high)
    if lo > hi:
        raise ValueError(f"{prefix}{low} ({lo}) must be <= {prefix}{high} ({hi})")


def check_int_order(low: str, low_value: int, high: str, high_value: int, *, owner: str) -> None:
    """Library style of :func:`check_order`: ``low_value <= high_value``.

    Raises:
        ValueError: ``"{owner}: {low} = {v} must be <= {high} = {w}"``.
    """
    if low_value > high_value:
        raise ValueError(f"{owner}: {low} = {low_value} must be <= {high} = {high_value}")


def check_choice(
    name: str, value: Any, choices: tuple[Any, ...], *, owner: str | None = None
) -> Any:
    """``value`` if it is one of ``choices``.

    Raises:
        ValueError: ``"{owner}: {name} must be one of {choices}, got {value!r}"``.
    """
    if value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{_prefix(owner)}{name} must be one of {shown}, got {value!r}")
    return value


def check_factory(device: Any, dtype: Any, *, owner: str) -> dict[str, Any]:
    """``{"device": device, "dtype": dtype}``, the factory arguments of a module's parameters,
    once both are usable.

    Raises:
        TypeError: ``dtype`` is neither None nor a floating-point ``torch.dtype``.
        ValueError: ``device`` is neither None nor a device torch can parse, or names an
            accelerator this machine lacks.
    """
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(
            f"{owner}: dtype must be None or a floating-point torch.dtype (such as "
            f"torch.float32), got {dtype!r}"
        )
    check_device(device, owner=owner)
    return {"device": device, "dtype": dtype}


def check_device(device: Any, *, owner: str) -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None) once it names a device torch knows
    and this machine has.

    Raises:
        ValueError: ``"{owner}: device must be None, a torch.device or a name such as 'cpu' or
            'cuda:0', got 'bogus'"``, or ``"... device 'cuda:3' is not available on this
            machine"``.
    """
    if device is None:
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"{owner}: device must be None, a torch.device or a name such as 'cpu' or "
            f"'cuda:0', got {device!r}"
        ) from None
    available = {
        "cuda": torch.cuda.is_available()
        and (parsed.index is None or parsed.index < torch.cuda.device_count()),
        "mps": torch.backends.mps.is_available(),
    }
    if not available.get(parsed.type, True):
        raise ValueError(f"{owner}: device {device!r} is not available on this machine")
    return parsed


_ALLOCATION_FAILURES = ("can't allocate memory", "out of memory", "overflow", "too large")


def allocation_errors(init: Callable[..., None]) -> Callable[..., None]:
    """Decorate a module's ``__init__``: a failure to allocate its parameters (sizes whose
    weights cannot fit in memory, or whose element count overflows) becomes one
    ``MemoryError`` naming the class and the bytes asked for, in place of torch's allocator
    message.

    Raises:
        MemoryError: ``"{Class}: its parameters at these sizes do not fit in memory (torch
            asked for 372.5 GiB); choose smaller sizes"``.
    """

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except (RuntimeError, MemoryError, OverflowError, TypeError) as exc:
            text = str(exc)
            if not isinstance(exc, MemoryError) and not any(
                failure in text.lower() for failure in _ALLOCATION_FAILURES
            ):
                raise
            if isinstance(exc, MemoryError) and text.endswith("choose smaller sizes"):
                raise  # already said, by a module built inside this one
            asked = re.search(r"allocate (\d+) bytes", text)
            size = f"torch asked for {int(asked.group(1)) / 2**30:,.1f} GiB" if asked else ""
            size = size or text.strip().splitlines()[0][:120]
            raise MemoryError(
                f"{type(self).__name__}: its parameters at these sizes do not fit in memory "
                f"({size}); choose smaller sizes"
            ) from None

    return wrapper
