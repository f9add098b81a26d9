"""The pluggable serializer of the object collectives: one pickle, large buffers out of band.

Which one is in force: [`get_serializer`][hwdist.serialization.serializers.get_serializer]; the
trust model of the restricted one: ``docs/objects.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import copyreg
import io
import pickle
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from .restricted.loader import pair, restricted_loads, torch_safe_pairs
from .tensors import OOB_THRESHOLD, reduce_ndarray, reduce_tensor

__all__ = [
    "Serializer",
    "PickleSerializer",
    "RestrictedPickleSerializer",
    "get_serializer",
    "set_serializer",
    "use_serializer",
]


class Serializer:
    """Turns an object into a pickle-like stream plus out-of-band buffers and back.

    Subclass and override [`dumps`][hwdist.serialization.serializers.PickleSerializer.dumps] and
    [`loads`][hwdist.serialization.serializers.PickleSerializer.loads] to plug in another format;
    install it with [`set_serializer`][hwdist.serialization.serializers.set_serializer] or
    [`use_serializer`][hwdist.serialization.serializers.use_serializer], or pass ``serializer=`` to
    a collective. Every rank must use a compatible serializer.
    """

    def dumps(self, obj: Any) -> tuple[Union[bytes, memoryview], list[memoryview]]:
        """``(stream, buffers)`` for ``obj``; buffers are byte views travelling out of band."""
        raise NotImplementedError

    def loads(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        """The object back from ``stream`` and its out-of-band ``buffers``."""
        raise NotImplementedError


class PickleSerializer(Serializer):
    """Pickle protocol 5; numpy arrays and CPU tensors of ``oob_threshold`` bytes or more travel out of band.

    Args:
        oob_threshold: buffers at least this large are not copied into the stream.
        reducers: extra ``{type: reduce_function}`` entries (copyreg style) for this serializer.
    """

    protocol = 5

    def __init__(
        self, oob_threshold: int = OOB_THRESHOLD, reducers: Optional[dict[type, Callable[..., Any]]] = None
    ) -> None:
        self.oob_threshold = int(oob_threshold)
        self.reducers: dict[type, Callable[..., Any]] = {
            torch.Tensor: reduce_tensor,
            np.ndarray: reduce_ndarray,
        }
        if reducers:
            self.reducers.update(reducers)

    def dumps(self, obj: Any) -> tuple[Union[bytes, memoryview], list[memoryview]]:
        """Pickle ``obj`` once; large buffers are returned, not copied."""
        out = io.BytesIO()
        buffers = self.dump_into(obj, out)
        return out.getbuffer(), buffers

    def dump_into(self, obj: Any, out: io.BytesIO) -> list[memoryview]:
        """Pickle ``obj`` into ``out``; return the large buffers (out of band, not copied)."""
        buffers: list[memoryview] = []
        threshold = self.oob_threshold

        def keep(buf: pickle.PickleBuffer) -> bool:
            view = buf.raw()
            if view.nbytes < threshold:
                return True  # in band
            buffers.append(view)
            return False

        pickler = pickle.Pickler(out, protocol=self.protocol, buffer_callback=keep)
        pickler.dispatch_table = {**copyreg.dispatch_table, **self.reducers}
        pickler.dump(obj)
        return buffers

    def loads(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        """Unpickle ``stream`` with its out-of-band ``buffers`` (arrays alias them)."""
        return pickle.loads(stream, buffers=buffers)  # reads the view itself: no copy of the stream


class RestrictedPickleSerializer(PickleSerializer):
    """A pickle serializer whose loads refuse every global outside the allow-list.

    A [`PickleSerializer`][hwdist.serialization.serializers.PickleSerializer] otherwise.

    Args:
        allow: more classes/functions/``'module.QualName'`` strings allowed by this serializer only.
    """

    def __init__(
        self, allow: Sequence[Union[type, Callable[..., Any], str]] = (), oob_threshold: int = OOB_THRESHOLD
    ) -> None:
        super().__init__(oob_threshold)
        self.extra = tuple(pair("RestrictedPickleSerializer", item) for item in allow)

    def loads(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        """Unpickle through the restricted unpickler.

        Raises:
            UnpicklingRefused: for anything not accepted.
        """
        return restricted_loads(stream, buffers, self.extra + torch_safe_pairs())


_DEFAULT = PickleSerializer()
_process_default: Serializer = _DEFAULT
# The serializer of a use_serializer() block: per thread and per task, never seen by another thread.
_SCOPED: contextvars.ContextVar[Optional[Serializer]] = contextvars.ContextVar(
    "hwdist_serializer", default=None
)


def get_serializer() -> Serializer:
    """The serializer object collectives use when none is passed.

    That is the innermost [`use_serializer`][hwdist.serialization.serializers.use_serializer] block
    of this thread (or task), else the process default
    ([`set_serializer`][hwdist.serialization.serializers.set_serializer]).

    Examples:
        >>> hwdist.serialization.get_serializer()      # every rank: the pickle default
        <hwdist.serialization.serializers.PickleSerializer object at ...>
    """
    scoped = _SCOPED.get()
    return _process_default if scoped is None else scoped


def _check(serializer: Any, where: str) -> None:
    if not isinstance(serializer, Serializer):
        raise TypeError(f"{where}: serializer must be a hwdist Serializer, got {type(serializer).__name__}")


def set_serializer(serializer: Optional[Serializer]) -> Serializer:
    """Install ``serializer`` as the process default (None: pickle); returns the previous default.

    The default applies in every thread that is not inside a
    [`use_serializer`][hwdist.serialization.serializers.use_serializer] block; set it once at
    start-up, on every rank.

    Examples:
        >>> from hwdist.serialization import RestrictedPickleSerializer, set_serializer
        >>> set_serializer(RestrictedPickleSerializer())   # every rank
    """
    global _process_default
    if serializer is not None:
        _check(serializer, "set_serializer")
    previous, _process_default = _process_default, serializer or _DEFAULT
    return previous


@contextlib.contextmanager
def use_serializer(serializer: Optional[Serializer]) -> Iterator[Serializer]:
    """Context manager: collectives in this block use ``serializer`` (None: pickle).

    In this thread or task only: other threads keep theirs; on exit the previous one is restored.

    Examples:
        >>> from hwdist.serialization import RestrictedPickleSerializer, use_serializer
        >>> with use_serializer(RestrictedPickleSerializer()):   # every rank
        ...     outs = hwdist.all_gather_object(obj)
    """
    if serializer is None:  # the pickle default, as before
        serializer = _DEFAULT
    _check(serializer, "use_serializer")
    token = _SCOPED.set(serializer)
    try:
        yield serializer
    finally:
        _SCOPED.reset(token)
