"""What every handler of the restricted unpickler shares: the refusal, arity, shape and buffer checks.

Each handler takes the REDUCE arguments (or a BUILD state) a payload gives,
checks them with these, and builds the object itself.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from ...errors import UnpicklingRefused

if TYPE_CHECKING:  # the handlers get the running interpreter; never imported at run time
    from .loader import Loader

__all__ = [
    "MAX_NESTING",
    "UnpicklingRefused",
    "refuse",
    "Handler",
    "Pending",
    "arity",
    "int_arg",
    "shape_of",
    "byte_view",
    "check_bool_bytes",
    "hashable_in",
    "describe",
]

#: Deepest chain of tuples/frozensets (hashed recursively by CPython) a payload may build.
MAX_NESTING = 1000
MAX_DIMS = 32


def refuse(msg: str) -> UnpicklingRefused:
    """The error for a payload that is not accepted, saying why."""
    return UnpicklingRefused(f"restricted unpickler refused the payload: {msg}")


class Handler:
    """What a payload gets for a global that only hwdist's own code may act on."""

    __slots__ = ("name", "fn")

    def __init__(self, name: str, fn: Callable[[Loader, tuple], Any]) -> None:
        self.name, self.fn = name, fn

    def __repr__(self) -> str:
        return f"<restricted global {self.name}>"


class Pending:
    """An object whose final value comes with the BUILD that follows (numpy's dtype and array formats)."""

    __slots__ = ("finish", "keys", "done")

    def __init__(self, finish: Callable[[Loader, Any], Any]) -> None:
        self.finish = finish
        self.keys: list[Any] = []
        self.done = False

    def __repr__(self) -> str:
        return "<unfinished restricted object>"


def arity(name: str, args: tuple, lo: int, hi: int) -> None:
    if not lo <= len(args) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise refuse(f"{name} takes {want} arguments, got {len(args)}")


def int_arg(name: str, x: Any, lo: int = 0) -> int:
    if type(x) is not int or x < lo:
        raise refuse(f"{name} must be an int >= {lo}, got {type(x).__name__}")
    return x


_INT64_MAX = (1 << 63) - 1


def shape_of(name: str, shape: Any) -> tuple[int, int]:
    """``(ndim, number of elements)`` of a checked shape."""
    if type(shape) not in (tuple, list, torch.Size) or len(shape) > MAX_DIMS:
        raise refuse(
            f"{name}: shape must be a tuple of at most {MAX_DIMS} ints, got {type(shape).__name__}"
        )
    count = 1
    for d in shape:
        if int_arg(f"{name}: shape entry", d) > _INT64_MAX:
            raise refuse(f"{name}: shape entry {d} does not fit a 64-bit size")
        count *= d
    return len(shape), count


def byte_view(name: str, buf: Any) -> memoryview:
    if type(buf) not in (bytes, bytearray, memoryview, pickle.PickleBuffer):
        raise refuse(f"{name}: expected a buffer, got {type(buf).__name__}")
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def check_bool_bytes(name: str, view: memoryview) -> None:
    if view.nbytes and int(np.frombuffer(view, dtype=np.uint8).max()) > 1:
        raise refuse(f"{name}: a bool buffer holds a byte other than 0 or 1")


def hashable_in(x: Any, table: Any) -> bool:
    try:
        return x in table
    except TypeError:
        return False


def describe(obj: Any) -> str:
    if isinstance(obj, (type, Handler)) or callable(obj):
        module = getattr(obj, "__module__", None)
        name = getattr(obj, "__qualname__", None) or getattr(obj, "name", None) or repr(obj)
        return f"'{module}.{name}'" if module else f"'{name}'"
    return f"a {type(obj).__name__} value"
