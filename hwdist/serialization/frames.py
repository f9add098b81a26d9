"""Frames: one serialized object as 64-byte-aligned bytes, and the tensors the object collectives move.

A frame is a header of lengths, the pickle stream, then every large buffer out of band, each
section 64-byte aligned (the layout and why: ``docs/objects.md``). It has no magic of its own:
decoding checks that its lengths describe the bytes given. Tensors are rebuilt on the CPU (or a
``map_location``), never on the device they left.
"""

from __future__ import annotations

import gc
import io
from typing import Any, Optional, Sequence, Union, cast

import numpy as np
import torch

from .serializers import PickleSerializer, Serializer, get_serializer
from .tensors import MAP_LOCATION, MapLocation

__all__ = [
    "ALIGN",
    "Frame",
    "frame_length",
    "encode",
    "decode",
    "object_to_tensor",
    "tensor_to_object",
    "obj2tensor",
    "tensor2obj",
]

#: Alignment (bytes) of every frame section and of frame lengths.
ALIGN = 64
_FIXED = 3  # total length, stream length, number of buffers


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


#: Room for the header of a frame without out-of-band buffers (zeros until the header is written).
_BARE_HEAD = bytes(_aligned(8 * _FIXED))


class Frame:
    """One serialized object: header + stream + out-of-band buffers, 64-byte aligned.

    ``nbytes`` is the frame length; [`write_into`][hwdist.serialization.frames.Frame.write_into]
    copies it into a byte array (the one copy of the buffers);
    [`to_numpy`][hwdist.serialization.frames.Frame.to_numpy] allocates and fills one, or, for a
    frame pickled where it lies (``laid_out``: no out-of-band buffers), returns its bytes.
    """

    __slots__ = ("stream", "buffers", "header", "nbytes", "_offsets", "_whole")

    def __init__(self, stream: Union[bytes, memoryview], buffers: Sequence[memoryview]) -> None:
        self.stream = _byte_view(stream)
        self.buffers = [_byte_view(b) for b in buffers]
        n = len(self.buffers)
        self._offsets, pos = [], _aligned(8 * (_FIXED + n))
        for sec in [self.stream, *self.buffers]:
            self._offsets.append(pos)
            pos = _aligned(pos + sec.nbytes)
        self.nbytes = pos
        self.header = np.array([pos, self.stream.nbytes, n, *(b.nbytes for b in self.buffers)], dtype="<i8")
        self._whole: Optional[np.ndarray] = None  #: the frame's bytes where it is laid out already

    @classmethod
    def laid_out(cls, whole: memoryview, stream_len: int) -> "Frame":
        """A frame without out-of-band buffers whose stream ``whole`` holds after the header's room, up
        to its aligned length (``encode`` with a pickle serializer); the header is written here."""
        self = cls.__new__(cls)
        start = len(_BARE_HEAD)
        self.stream, self.buffers = whole[start : start + stream_len], []
        self.nbytes, self._offsets = whole.nbytes, [start]
        self._whole = np.frombuffer(whole, dtype=np.uint8)
        self.header = self._whole[: 8 * _FIXED].view("<i8")
        self.header[:] = whole.nbytes, stream_len, 0
        return self

    def write_into(self, out: np.ndarray) -> None:
        """Copy the frame into ``out`` (a uint8 array of at least ``nbytes``)."""
        if self._whole is not None:
            out[: self.nbytes] = self._whole
            return
        # Every section after the last one's end, the alignment gaps zeroed so frames are deterministic.
        pos, sections = 0, [self.header, self.stream, *self.buffers]
        for off, sec in zip([0, *self._offsets], cast(list[Any], sections)):
            data = np.frombuffer(sec, dtype=np.uint8)
            out[pos:off] = 0
            out[off : off + data.size] = data
            pos = off + data.size
        out[pos : self.nbytes] = 0

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
    """The length of the frame starting at ``data[offset]``, from its header (checked, not trusted).

    Raises:
        ValueError: the bytes there are not the start of a frame.
    """
    return _head(data, offset)[0]


def _head(data: np.ndarray, offset: int) -> tuple[int, int, int]:
    """(frame length, stream length, buffer count) of the frame at ``data[offset]``, checked."""
    given = data.size - offset
    if given < 8 * _FIXED:
        raise ValueError(f"not an hwdist object payload: {given} bytes is shorter than a frame header")
    total, stream_len, n = np.frombuffer(data, dtype="<i8", count=_FIXED, offset=offset).tolist()
    if total < ALIGN or total % ALIGN or stream_len < 0 or not 0 <= n <= total // 8 - _FIXED:
        raise ValueError(
            f"not an hwdist object payload: expected a frame header (a length that is a positive multiple"
            f" of {ALIGN}, a stream length, a buffer count), got {total}, {stream_len}, {n};"
            " was it made by hwdist.serialization.object_to_tensor?"
        )
    return total, stream_len, n


def encode(obj: Any, serializer: Optional[Serializer] = None) -> Frame:
    """Serialize ``obj`` once into a [`Frame`][hwdist.serialization.frames.Frame].

    A pickle serializer writes the stream after room for the header of a frame without out-of-band
    buffers; when nothing went out of band the frame is then complete where it lies (no copy).
    """
    ser = serializer or get_serializer()
    collecting = _pause_gc()
    try:
        if not isinstance(ser, PickleSerializer):
            stream, buffers = ser.dumps(obj)
            return Frame(stream, buffers)
        out = io.BytesIO()
        out.write(_BARE_HEAD)
        buffers = ser.dump_into(obj, out)
        if buffers:
            return Frame(out.getbuffer()[len(_BARE_HEAD) :], buffers)
        n = out.tell() - len(_BARE_HEAD)
        total = _aligned(len(_BARE_HEAD) + n)
        out.write(bytes(total - len(_BARE_HEAD) - n))  # the alignment gap, zeroed as write_into does
        return Frame.laid_out(out.getbuffer(), n)
    finally:
        if collecting:
            gc.enable()


def _pause_gc() -> bool:
    """Pause Python's cyclic garbage collector; returns whether it was on (the caller turns it back on).

    Pickling and unpickling many small objects otherwise runs collections that free nothing
    (docs/objects.md). A plain pair of calls, not a context manager: this runs on every object call.
    """
    collecting = gc.isenabled()
    gc.disable()
    return collecting


def decode(
    data: np.ndarray,
    offset: int = 0,
    serializer: Optional[Serializer] = None,
    map_location: MapLocation = None,
) -> Any:
    """The object in the frame that fills ``data[offset:]`` (a writable uint8 array; buffers alias it).

    Raises:
        ValueError: the bytes are not one whole frame (its lengths do not fit them).
    """
    total, stream_len, n = _head(data, offset)
    if data.size - offset != total:
        raise ValueError(
            f"not an hwdist object payload: the frame header says {total} bytes, {data.size - offset} given"
        )
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
    try:
        loc = None if map_location is None else torch.device(map_location)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"map_location must be a torch.device, a device string or None, got {map_location!r}"
        ) from exc
    token = MAP_LOCATION.set(loc)
    collecting = _pause_gc()
    try:
        return (serializer or get_serializer()).loads(sections[0], sections[1:])
    finally:
        if collecting:
            gc.enable()
        MAP_LOCATION.reset(token)


def object_to_tensor(
    obj: Any, device: Union[None, str, torch.device] = None, serializer: Optional[Serializer] = None
) -> torch.Tensor:
    """Serialize ``obj`` into a 1-D uint8 tensor (the vis4d ``obj2tensor``).

    Args:
        obj: any object the serializer accepts.
        device: where the tensor goes; default: the default group's communication device (CPU
            when not distributed).
        serializer: default: the current one ([`get_serializer`][hwdist.serialization.frames.get_serializer]).

    Examples:
        >>> from hwdist.serialization import object_to_tensor, tensor_to_object
        >>> t = object_to_tensor({"a": 1})      # tensor([...], dtype=torch.uint8)
        >>> tensor_to_object(t)
        {'a': 1}
    """
    out = torch.from_numpy(encode(obj, serializer).to_numpy())
    if device is None:
        from ..info import get_comm_device

        device = get_comm_device()
    return out.to(device)


def tensor_to_object(
    tensor: torch.Tensor, map_location: MapLocation = None, serializer: Optional[Serializer] = None
) -> Any:
    """The object in a tensor made by [`object_to_tensor`][hwdist.serialization.frames.object_to_tensor].

    The vis4d ``tensor2obj``. Trailing padding is ignored; tensors inside land on CPU, or ``map_location``.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8:
        got = f"{tensor.dtype} tensor" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise TypeError(f"tensor_to_object: expected a uint8 tensor from object_to_tensor, got {got}")
    flat = tensor.detach().reshape(-1)
    # Own the bytes: the rebuilt objects alias them, and must not alias the caller's tensor.
    data = flat.numpy().copy() if flat.device.type == "cpu" else flat.cpu().numpy()
    return decode(data[: frame_length(data)], 0, serializer, map_location)


obj2tensor = object_to_tensor
"""vis4d name of [`object_to_tensor`][hwdist.serialization.frames.object_to_tensor]."""
tensor2obj = tensor_to_object
"""vis4d name of [`tensor_to_object`][hwdist.serialization.frames.tensor_to_object]."""
