"""Object serialization for the object collectives: one pickle, out-of-band buffers, framed bytes.

An object becomes one *frame*: a small header, the pickle stream, then every
large buffer (numpy array data, CPU tensor data) appended out of band with
pickle protocol 5, so a 32 MiB array is copied once (into the frame) instead
of three or four times. Frames are multiples of 64 bytes and every section
is 64-byte aligned, so a frame can travel as any byte-view dtype a driver
asks for and tensors rebuilt from it need no copy.

Tensors are rebuilt on the CPU (or a ``map_location``), never on the device
they left. The serializer is pluggable
([`Serializer`][hwdist.collectives.serialization.Serializer]); the one in
force is a ``serializer=`` argument, else the calling thread's
[`use_serializer`][hwdist.collectives.serialization.use_serializer] block (a
context variable), else the process default
([`set_serializer`][hwdist.collectives.serialization.set_serializer]).
[`RestrictedPickleSerializer`][hwdist.collectives.serialization.RestrictedPickleSerializer] reads payloads
with hwdist's own pickle interpreter (``restricted/loader.py``), which builds only
allow-listed objects with checked arguments, for jobs that do not trust
every peer. See ``docs/objects.md`` for the trust model.
"""

from __future__ import annotations

import contextlib
import contextvars
import copyreg
import gc
import io
import pickle
from typing import Any, Callable, Iterator, Optional, Sequence, Union, cast

import numpy as np
import torch

from .restricted import (
    RestrictedUnpickler,
    UnpicklingRefused,
    pair,
    plain_dtype,
    register_safe_class,
    restricted_loads,
    safe_globals,
)
from ._wire import byte_view


__all__ = [
    "Serializer",
    "PickleSerializer",
    "RestrictedPickleSerializer",
    "RestrictedUnpickler",
    "UnpicklingRefused",
    "Frame",
    "get_serializer",
    "set_serializer",
    "use_serializer",
    "register_safe_class",
    "safe_globals",
    "restricted_loads",
    "encode",
    "decode",
    "object_to_tensor",
    "tensor_to_object",
    "obj2tensor",
    "tensor2obj",
]

#: Alignment (bytes) of every frame section and of frame lengths.
ALIGN = 64
#: First int64 of every frame header ("HWDOBJ01" little-endian).
MAGIC = int.from_bytes(b"HWDOBJ01", "little")
_FIXED = 4  # magic, total length, stream length, number of buffers
#: Buffers at least this large travel out of band (not copied into the pickle stream).
OOB_THRESHOLD = 64 * 1024

MapLocation = Union[None, str, torch.device]
_MAP_LOCATION: contextvars.ContextVar[Optional[torch.device]] = contextvars.ContextVar(
    "hwdist_map_location", default=None
)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


#: Room for the header of a frame without out-of-band buffers (zeros until the header is written).
_BARE_HEAD = bytes(_aligned(8 * _FIXED))


# ---- tensors and arrays ----------------------------------------------------------


#: torch dtype -> (its name in streams, whether ``Tensor.numpy()`` takes it)
_TENSOR_KINDS: dict[torch.dtype, tuple[str, bool]] = {}


def _rebuild_tensor(buf: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool) -> torch.Tensor:
    """Rebuild a tensor from its bytes (no copy when the buffer is writable)."""
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise pickle.UnpicklingError(f"tensor payload names an unknown dtype {dtype!r}")
    if type(buf) is not bytearray:  # in band, the encoder sends a bytearray: writable, this tensor's own
        buf = memoryview(buf).cast("B")
        if buf.readonly and buf.nbytes:
            buf = bytearray(buf)
    if len(buf) == 0:
        out = torch.empty(shape, dtype=dt)
    else:
        out = torch.frombuffer(buf, dtype=dt)
        if len(shape) != 1 or out.shape[0] != shape[0]:
            out = out.reshape(shape)
    loc = _MAP_LOCATION.get()
    if loc is not None and out.device != loc:
        out = out.to(loc)
    if requires_grad:
        out.requires_grad_(True)
    return out


def _tensor_kind(dt: torch.dtype) -> tuple[str, bool]:
    kind = _TENSOR_KINDS.get(dt)
    if kind is None:
        try:
            torch.empty(0, dtype=dt).numpy()
            numpy_ok = True
        except (TypeError, RuntimeError):  # bfloat16, complex32, float8 kinds: no numpy dtype
            numpy_ok = False
        kind = _TENSOR_KINDS[dt] = (str(dt).replace("torch.", ""), numpy_ok)
    return kind


def _reduce_tensor(t: torch.Tensor) -> Any:
    if t.layout != torch.strided or t.is_quantized or t.is_meta or t.is_nested:
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)  # torch's own format
    d = t.detach() if t.requires_grad else t
    if not d.is_cpu:
        d = d.cpu()  # tensors land on CPU (or map_location) on the other side
    if d.is_conj():
        d = d.resolve_conj()
    if d.is_neg():
        d = d.resolve_neg()
    name, numpy_ok = _tensor_kind(d.dtype)
    shape = tuple(t.shape)
    if numpy_ok and d.numel() * d.element_size() < OOB_THRESHOLD:
        # small: a bytearray copy of the elements in C order (any strides; through a memoryview: a
        # 0-d integer array would be taken as a length), in band; no per-tensor
        # buffer callback, and the loader's tensor owns it (docs/objects.md, "Performance")
        small = bytearray(memoryview(cast(Any, d.numpy())))
        return _rebuild_tensor, (small, name, shape, bool(t.requires_grad))
    data: Any = byte_view(d).numpy()  # any strides (Any: numpy's stubs on 3.9)
    return _rebuild_tensor, (pickle.PickleBuffer(data), name, shape, bool(t.requires_grad))


# The loader's name for it. Streams keep naming ``_rebuild_tensor`` (the pickled reducer and the
# allow-list entry), so the wire format does not change.
rebuild_tensor = _rebuild_tensor


#: dtype -> whether numpy.frombuffer rebuilds it exactly (a plain one: bool, int, uint, float, complex)
_PLAIN: dict[np.dtype, bool] = {}


def _reduce_ndarray(a: np.ndarray) -> Any:
    nbytes = a.nbytes
    if nbytes >= OOB_THRESHOLD:
        return a.__reduce_ex__(5)  # numpy's own: the buffer out of band
    if nbytes and a.ndim == 1:
        dt = a.dtype
        plain = _PLAIN.get(dt)
        if plain is None:  # kept per dtype: the test alone is about 15 % of a small array's encoding
            plain = _PLAIN[dt] = plain_dtype(dt)  # the restricted loader's own test of the dtype
        if plain:
            # A small 1-D array (a prediction, a score row, a column): numpy.frombuffer over a copy of
            # its elements, a bytearray (writable and owned on load, as numpy's own form gives).
            # Stock pickle and the restricted loader both read it; costs in docs/objects.md.
            return np.frombuffer, (bytearray(memoryview(cast(Any, a))), dt)
    if not a.dtype.isnative:
        # numpy's protocol-2 form loses a non-native byte order (``>i4`` comes back ``<i4`` through
        # pickle.loads): numpy's protocol-5 form of a C-ordered copy keeps the dtype, in band
        return (a if a.flags.c_contiguous else a.copy(order="C")).__reduce_ex__(5)
    return a.__reduce__()  # in band; loads faster than protocol 5's small buffers


# ---- the pluggable serializer ------------------------------------------------------


class Serializer:
    """Turns an object into a pickle-like stream plus out-of-band buffers and back.

    Subclass and override [`dumps`][hwdist.collectives.serialization.PickleSerializer.dumps] and
    [`loads`][hwdist.collectives.serialization.PickleSerializer.loads] to plug in another
    format; install it with [`set_serializer`][hwdist.collectives.serialization.set_serializer] or
    [`use_serializer`][hwdist.collectives.serialization.use_serializer],
    or pass ``serializer=`` to a collective. Every rank must use a compatible
    serializer.
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
            torch.Tensor: _reduce_tensor,
            np.ndarray: _reduce_ndarray,
        }
        if reducers:
            self.reducers.update(reducers)

    def dumps(self, obj: Any) -> tuple[Union[bytes, memoryview], list[memoryview]]:
        """Pickle ``obj`` once; large buffers are returned, not copied."""
        out = io.BytesIO()
        buffers = self._dump(obj, out)
        return out.getbuffer(), buffers

    def frame(self, obj: Any) -> "Frame":
        """``obj``'s [`Frame`][hwdist.collectives.serialization.Frame], pickled straight into it.

        The stream is written after room for the header of a frame without out-of-band buffers; when
        nothing went out of band the frame is then complete where it lies (no copy of the stream).
        """
        out = io.BytesIO()
        out.write(_BARE_HEAD)
        buffers = self._dump(obj, out)
        if buffers:
            return Frame(out.getbuffer()[len(_BARE_HEAD) :], buffers)
        n = out.tell() - len(_BARE_HEAD)
        total = _aligned(len(_BARE_HEAD) + n)
        out.write(bytes(total - len(_BARE_HEAD) - n))  # the alignment gap, zeroed as write_into does
        return Frame.laid_out(out.getbuffer(), n)

    def _dump(self, obj: Any, out: io.BytesIO) -> list[memoryview]:
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
        table = dict(copyreg.dispatch_table)
        table.update(self.reducers)
        pickler.dispatch_table = table
        pickler.dump(obj)
        return buffers

    def loads(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        """Unpickle ``stream`` with its out-of-band ``buffers`` (arrays alias them)."""
        return pickle.loads(stream, buffers=buffers)  # reads the view itself: no copy of the stream


# ---- the restricted unpickler (hwdist's own pickle interpreter: restricted/) ------------


class RestrictedPickleSerializer(PickleSerializer):
    """A pickle serializer whose loads refuse every global outside the allow-list.

    A [`PickleSerializer`][hwdist.collectives.serialization.PickleSerializer] otherwise.

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
        from ._weights_only import torch_safe_pairs  # torch's add_safe_globals count too (a cycle at import)

        return restricted_loads(stream, buffers, self.extra + torch_safe_pairs())


_DEFAULT = PickleSerializer()
_process_default: Serializer = _DEFAULT
# The serializer of a use_serializer() block: per thread and per task (a context variable), so one
# thread's block never changes what another thread's collectives use.
_SCOPED: contextvars.ContextVar[Optional[Serializer]] = contextvars.ContextVar(
    "hwdist_serializer", default=None
)


def get_serializer() -> Serializer:
    """The serializer object collectives use when none is passed.

    That is the innermost [`use_serializer`][hwdist.collectives.serialization.use_serializer] block
    of this thread (or task), else the process default
    ([`set_serializer`][hwdist.collectives.serialization.set_serializer]).

    Examples:
        >>> hwdist.get_serializer()                  # every rank: the pickle default
        <hwdist.collectives.serialization.PickleSerializer object at ...>
    """
    scoped = _SCOPED.get()
    return _process_default if scoped is None else scoped


def _check(serializer: Any, where: str) -> None:
    if not isinstance(serializer, Serializer):
        raise TypeError(f"{where}: serializer must be a hwdist Serializer, got {type(serializer).__name__}")


def set_serializer(serializer: Optional[Serializer]) -> Serializer:
    """Install ``serializer`` as the process default (None: pickle); returns the previous default.

    The default applies in every thread that is not inside a
    [`use_serializer`][hwdist.collectives.serialization.use_serializer] block; set it once at
    start-up, on every rank.

    Examples:
        >>> hwdist.set_serializer(hwdist.RestrictedPickleSerializer())   # every rank
    """
    global _process_default
    if serializer is not None:
        _check(serializer, "set_serializer")
    previous, _process_default = _process_default, serializer or _DEFAULT
    return previous


@contextlib.contextmanager
def use_serializer(serializer: Optional[Serializer]) -> Iterator[Serializer]:
    """Context manager: collectives in this block use ``serializer`` (None: pickle).

    In this thread or task only.

    Other threads keep theirs; on exit the previous one is restored exactly.

    Examples:
        >>> with hwdist.use_serializer(hwdist.RestrictedPickleSerializer()):   # every rank
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


def is_default_serializer(serializer: Optional[Serializer]) -> bool:
    """Whether ``serializer`` (None: the one in force) is plain pickle."""
    return (serializer or get_serializer()) is _DEFAULT


# ---- frames ---------------------------------------------------------------------------


class Frame:
    """One serialized object: header + stream + out-of-band buffers, 64-byte aligned.

    ``nbytes`` is the frame length;
    [`write_into`][hwdist.collectives.serialization.Frame.write_into] copies it into a byte
    array (the one copy of the buffers);
    [`to_numpy`][hwdist.collectives.serialization.Frame.to_numpy] allocates and fills one, or,
    for a frame pickled where it lies (``laid_out``: no out-of-band buffers), returns its bytes.
    """

    __slots__ = ("stream", "buffers", "header", "nbytes", "_offsets", "_whole")

    def __init__(self, stream: Union[bytes, memoryview], buffers: Sequence[memoryview]) -> None:
        self.stream = _byte_view(stream)
        self.buffers = [_byte_view(b) for b in buffers]
        n = len(self.buffers)
        head = np.empty(_FIXED + n, dtype="<i8")
        offsets = []
        pos = _aligned(8 * (_FIXED + n))
        offsets.append(pos)
        pos = _aligned(pos + self.stream.nbytes)
        for b in self.buffers:
            offsets.append(pos)
            pos = _aligned(pos + b.nbytes)
        head[0], head[1], head[2], head[3] = MAGIC, pos, self.stream.nbytes, n
        for i, b in enumerate(self.buffers):
            head[_FIXED + i] = b.nbytes
        self.header = head
        self.nbytes = pos
        self._offsets = offsets
        self._whole: Optional[np.ndarray] = None  #: the frame's bytes where it is laid out already

    @classmethod
    def laid_out(cls, whole: memoryview, stream_len: int) -> "Frame":
        """A frame without out-of-band buffers whose stream ``whole`` holds after the header's room, up
        to its aligned length (``PickleSerializer.frame``); the header is written here."""
        self = cls.__new__(cls)
        start = len(_BARE_HEAD)
        self.stream, self.buffers, self.nbytes, self._offsets = (
            whole[start : start + stream_len],
            [],
            whole.nbytes,
            [start],
        )
        self._whole = np.frombuffer(whole, dtype=np.uint8)
        head = self._whole[: 8 * _FIXED].view("<i8")
        head[0], head[1], head[2], head[3] = MAGIC, whole.nbytes, stream_len, 0
        self.header = head
        return self

    def write_into(self, out: np.ndarray) -> None:
        """Copy the frame into ``out`` (a uint8 array of at least ``nbytes``)."""
        if self._whole is not None:
            out[: self.nbytes] = self._whole
            return
        hb = self.header.view(np.uint8)
        out[: hb.size] = hb
        out[hb.size : self._offsets[0]] = 0
        sections = [self.stream, *self.buffers]
        for off, sec in zip(self._offsets, sections):
            n = sec.nbytes
            if n:
                out[off : off + n] = np.frombuffer(sec, dtype=np.uint8)
        # Zero the alignment gaps so frames are deterministic.
        ends = [off + sec.nbytes for off, sec in zip(self._offsets, sections)]
        starts = self._offsets[1:] + [self.nbytes]
        for end, start in zip(ends, starts):
            if start > end:
                out[end:start] = 0

    def to_numpy(self) -> np.ndarray:
        """A uint8 array holding the frame: the frame's own bytes where it is laid out already (the
        caller must not write into it), else a new array."""
        if self._whole is not None:
            return self._whole
        out = np.empty(self.nbytes, dtype=np.uint8)
        self.write_into(out)
        return out


def _byte_view(buf: Any) -> memoryview:
    view = memoryview(buf)
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B")


def frame_length(data: np.ndarray, offset: int = 0) -> int:
    """The length of the frame starting at ``data[offset]`` (checks the magic)."""
    if data.size - offset < 8 * _FIXED:
        raise ValueError(
            f"not an hwdist object payload: {data.size - offset} bytes is shorter than a frame header"
        )
    head = np.frombuffer(data, dtype="<i8", count=_FIXED, offset=offset)
    if int(head[0]) != MAGIC:
        raise ValueError("not an hwdist object payload (bad magic); was it made by hwdist.object_to_tensor?")
    return int(head[1])


def _device(map_location: Any) -> torch.device:
    try:
        return torch.device(map_location)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"map_location must be a torch.device, a device string or None, got {map_location!r}"
        ) from exc


def encode(obj: Any, serializer: Optional[Serializer] = None) -> Frame:
    """Serialize ``obj`` once into a [`Frame`][hwdist.collectives.serialization.Frame]."""
    ser = serializer or get_serializer()
    if isinstance(ser, PickleSerializer):
        return cast(Frame, _gc_paused(ser.frame, obj))
    stream, buffers = _gc_paused(ser.dumps, obj)
    return Frame(stream, buffers)


def _gc_paused(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with Python's cyclic garbage collector paused (if it was on), then restored.

    Unpickling many small objects (20k result dicts) otherwise runs dozens of collections that
    find nothing to free: about a quarter of the decoding time (docs/objects.md).
    """
    if not gc.isenabled():
        return fn(*args)
    gc.disable()
    try:
        return fn(*args)
    finally:
        gc.enable()


def decode(
    data: np.ndarray,
    offset: int = 0,
    serializer: Optional[Serializer] = None,
    map_location: MapLocation = None,
) -> Any:
    """The object in the frame at ``data[offset]`` (a writable uint8 array; buffers alias it)."""
    total = frame_length(data, offset)
    if data.size - offset < total:
        raise ValueError(f"truncated hwdist object payload: {data.size - offset} of {total} bytes")
    head = np.frombuffer(data, dtype="<i8", offset=offset, count=_FIXED)
    stream_len, n = int(head[2]), int(head[3])
    if total < 8 * _FIXED or not 0 <= n <= (total - 8 * _FIXED) // 8:
        raise ValueError(f"corrupt hwdist object payload: header says {n} buffers in {total} bytes")
    lens = np.frombuffer(data, dtype="<i8", offset=offset + 8 * _FIXED, count=n).tolist() if n else []
    view = memoryview(cast(Any, data))  # numpy's stubs miss the buffer protocol on 3.9
    pos = offset + _aligned(8 * (_FIXED + n))
    sections = []
    for ln in [stream_len, *lens]:
        if ln < 0 or pos + ln > offset + total:
            raise ValueError(
                f"corrupt hwdist object payload: a section of {ln} bytes at byte {pos - offset}"
                f" does not fit its {total}-byte frame"
            )
        sections.append(view[pos : pos + ln])
        pos = _aligned(pos + ln)
    stream, buffers = sections[0], sections[1:]
    token = _MAP_LOCATION.set(None if map_location is None else _device(map_location))
    try:
        return _gc_paused((serializer or get_serializer()).loads, stream, buffers)
    finally:
        _MAP_LOCATION.reset(token)


def object_to_tensor(
    obj: Any, device: Union[None, str, torch.device] = None, serializer: Optional[Serializer] = None
) -> torch.Tensor:
    """Serialize ``obj`` into a 1-D uint8 tensor (the vis4d ``obj2tensor``).

    Args:
        obj: any object the serializer accepts.
        device: where the tensor goes; default: the communication device of
            the default group (CPU when not distributed).
        serializer: default: the current one
            ([`get_serializer`][hwdist.collectives.serialization.get_serializer]).

    Examples:
        >>> t = hwdist.object_to_tensor({"a": 1})      # tensor([...], dtype=torch.uint8)
        >>> hwdist.tensor_to_object(t)
        {'a': 1}
    """
    frame = encode(obj, serializer)
    out = torch.from_numpy(frame.to_numpy())
    if device is None:
        from ..info import get_comm_device

        device = get_comm_device()
    return out.to(device)


def tensor_to_object(
    tensor: torch.Tensor, map_location: MapLocation = None, serializer: Optional[Serializer] = None
) -> Any:
    """The object in a tensor made by [`object_to_tensor`][hwdist.collectives.serialization.object_to_tensor].

    The vis4d ``tensor2obj``.

    Trailing padding is ignored; tensors inside land on CPU, or ``map_location``.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8:
        got = f"{tensor.dtype} tensor" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise TypeError(f"tensor_to_object: expected a uint8 tensor from object_to_tensor, got {got}")
    flat = tensor.detach().reshape(-1)
    # Own the bytes: the rebuilt objects alias them, and must not alias the caller's tensor.
    data = flat.numpy().copy() if flat.device.type == "cpu" else flat.cpu().numpy()
    return decode(data, 0, serializer, map_location)


obj2tensor = object_to_tensor
"""vis4d name of [`object_to_tensor`][hwdist.collectives.serialization.object_to_tensor]."""
tensor2obj = tensor_to_object
"""vis4d name of [`tensor_to_object`][hwdist.collectives.serialization.tensor_to_object]."""
