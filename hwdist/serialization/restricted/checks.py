"""The builders of the restricted unpickler's allow-listed globals, and the allow-list itself.

A payload never reaches a constructor with unchecked values: each handler checks the REDUCE
arguments (or a BUILD state), then builds the object itself; what each accepts is listed in
``docs/objects.md``. ``loader.py`` is the interpreter that calls them.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import math
import pickle
import re
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from ...errors import UnpicklingRefused
from ..tensors import QSCHEMES, QUANTIZED_INTS, SPARSE_LAYOUTS, plain_dtype
from ..tensors import rebuild_quantized, rebuild_sparse, rebuild_tensor

if TYPE_CHECKING:  # the handlers get the running interpreter; never imported at run time
    from .loader import Loader

# ---- what every handler shares ---------------------------------------------------------------

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
        raise refuse(f"{name}: shape must be a tuple of at most {MAX_DIMS} ints, got {type(shape).__name__}")
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


def check_bool_bytes(name: str, view: memoryview, dt: Any) -> None:
    """Refuse ``view`` if ``dt`` (a numpy or torch dtype) is bool and a byte is neither 0 nor 1."""
    is_bool = dt is torch.bool or getattr(dt, "kind", None) == "b"
    if is_bool and view.nbytes and int(np.frombuffer(view, dtype=np.uint8).max()) > 1:
        raise refuse(f"{name}: a bool buffer holds a byte other than 0 or 1")


def sized_buffer(u: Loader, name: str, buf: Any, shape: Any, dt: Any) -> memoryview:
    """``buf``'s bytes, checked to be exactly ``shape`` items of the numpy or torch dtype ``dt`` (of a
    bool one, only bytes 0 and 1), and charged to the payload's budget."""
    view = byte_view(name, buf)
    _, count = shape_of(name, shape)
    if view.nbytes != count * dt.itemsize:
        raise refuse(
            f"{name}: shape {tuple(shape)} of {dt} needs {count * dt.itemsize} bytes, got {view.nbytes}"
        )
    u.charge(view.nbytes)
    check_bool_bytes(name, view, dt)
    return view


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


def _array_dtype(name: str, dt: Any, allow_object: bool = False) -> np.dtype:
    if plain_dtype(dt):
        return dt
    if isinstance(dt, np.dtype):
        fields = dt.fields
        if fields is not None and dt.kind == "V":
            if all(plain_dtype(f[0]) and f[0].kind != "b" and len(f) == 2 for f in fields.values()):
                return dt
        elif allow_object and dt.kind == "O" and fields is None and dt.metadata is None:
            return dt
    raise refuse(
        f"{name}: dtype {dt!r} is not a plain numeric dtype (bool, int, uint, float, complex, or a record of"
        " non-bool numeric fields). HINT: send it as a list, or convert it with .astype()"
    )


# ---- numpy: rebuilt by hwdist from checked descriptions ----------------------------------

_DTYPE_STR = re.compile(r"([biufc])(\d{1,2})|(V)(\d{1,9})|(O)(4|8)")


def _np_dtype(u: Loader, args: tuple) -> Pending:
    arity("numpy.dtype", args, 1, 3)
    spec = args[0]
    if type(spec) is not str or _DTYPE_STR.fullmatch(spec) is None:
        raise refuse(f"numpy.dtype {spec!r} is not a plain numeric, record or object dtype")
    return Pending(lambda _, state: _np_dtype_state(spec, state))


def _np_dtype_state(spec: str, state: Any) -> np.dtype:
    if type(state) is not tuple or len(state) not in (8, 9) or state[0] not in (3, 4):
        raise refuse("numpy.dtype state must be numpy's 8-tuple (version 3 or 4)")
    endian, subarray, names, fields, elsize = state[1:6]
    metadata = state[8] if len(state) == 9 else None
    if endian not in ("<", ">", "|", "=") or subarray is not None or metadata is not None:
        raise refuse(f"numpy.dtype {spec!r}: byte order {endian!r}, sub-arrays and metadata are not accepted")
    if spec[0] == "V":
        if type(names) is not tuple or not names or type(fields) is not dict or len(fields) != len(names):
            raise refuse(f"numpy.dtype {spec!r}: a record needs names and fields")
        itemsize = int_arg("numpy.dtype record size", elsize, 1)
        formats, offsets = [], []
        for key in names:
            entry = fields.get(key) if type(key) is str else None
            if type(entry) is not tuple or len(entry) != 2:
                raise refuse(f"numpy.dtype {spec!r}: field {key!r} must be (dtype, offset)")
            dt = _array_dtype(f"numpy.dtype field {key!r}", entry[0])
            off = int_arg(f"numpy.dtype field {key!r} offset", entry[1])
            if dt.fields is not None or dt.kind == "b" or off + dt.itemsize > itemsize:
                raise refuse(
                    f"numpy.dtype {spec!r}: field {key!r} does not fit a plain field in {itemsize} bytes"
                )
            formats.append(dt)
            offsets.append(off)
        return np.dtype({"names": list(names), "formats": formats, "offsets": offsets, "itemsize": itemsize})
    if names is not None or fields is not None:
        raise refuse(f"numpy.dtype {spec!r} cannot have fields")
    if spec[0] == "O":
        return np.dtype(object)
    dt = np.dtype(spec)
    return dt.newbyteorder(endian) if endian in "<>" and dt.itemsize > 1 else dt


def _np_reconstruct(u: Loader, args: tuple) -> Pending:
    if not (len(args) == 3 and args[0] is np.ndarray and args[1] == (0,) and args[2] == b"b"):
        raise refuse("numpy _reconstruct takes only (numpy.ndarray, (0,), b'b')")
    return Pending(_np_array_state)


def _np_array_state(u: Loader, state: Any) -> np.ndarray:
    if type(state) is not tuple or len(state) != 5 or state[0] != 1:
        raise refuse("numpy array state must be numpy's 5-tuple (version 1)")
    _, shape, dt, fortran, raw = state
    _, count = shape_of("numpy array", shape)
    dt = _array_dtype("numpy array", dt, allow_object=True)
    order = "F" if fortran is True or fortran == 1 else "C"
    if dt.kind == "O":
        if type(raw) is not list or len(raw) != count:
            raise refuse(f"numpy object array: expected a list of {count} items")
        u.charge(count)
        u.check_unsafe_children("numpy object array", raw)
        flat: Any = np.fromiter(raw, dtype=object, count=count)
        out = flat.reshape(shape, order=order)
        u.mark_unsafe(out)
        return out
    out = np.frombuffer(sized_buffer(u, "numpy array", raw, shape, dt), dtype=dt)
    if not out.flags.writeable:
        out = out.copy()
    return out.reshape(shape, order=order)


def _np_frombuffer(u: Loader, args: tuple) -> np.ndarray:
    arity("numpy _frombuffer", args, 4, 4)
    buf, dt, shape, order = args
    dt = _array_dtype("numpy _frombuffer", dt)
    if order not in ("C", "F"):
        raise refuse(f"numpy _frombuffer: order must be 'C' or 'F', got {order!r}")
    view = sized_buffer(u, "numpy _frombuffer", buf, shape, dt)
    return np.frombuffer(view, dtype=dt).reshape(shape, order=order)


def _np_frombuffer_1d(u: Loader, args: tuple) -> np.ndarray:
    """``numpy.frombuffer(buf, dtype)``: a small 1-D array as hwdist sends it (``reduce_ndarray``)."""
    arity("numpy.frombuffer", args, 2, 2)
    view = byte_view("numpy.frombuffer", args[0])
    dt = args[1]
    if not plain_dtype(dt):
        raise refuse(f"numpy.frombuffer: dtype must be a plain numeric dtype, got {dt!r}")
    if not view.nbytes or view.nbytes % dt.itemsize:
        raise refuse(f"numpy.frombuffer: {view.nbytes} bytes is not a whole, non-empty number of {dt} items")
    view = sized_buffer(u, "numpy.frombuffer", view, (view.nbytes // dt.itemsize,), dt)
    return np.frombuffer(view, dtype=dt)


def _np_scalar(u: Loader, args: tuple) -> Any:
    arity("numpy scalar", args, 2, 2)
    dt = _array_dtype("numpy scalar", args[0])
    view = byte_view("numpy scalar", args[1]) if type(args[1]) is bytes else None
    if view is None or view.nbytes != dt.itemsize:
        raise refuse(f"numpy scalar of {dt} needs {dt.itemsize} bytes")
    check_bool_bytes("numpy scalar", view, dt)
    return np.frombuffer(view, dtype=dt)[0]


# ---- the standard library ---------------------------------------------------------------

_PRIMITIVE = (int, float, complex, str, bytes, bool, type(None))
_ENCODINGS = frozenset({"utf-8", "utf8", "latin-1", "latin1", "ascii"})
_ERRORS = frozenset({"strict", "replace", "ignore", "surrogatepass", "surrogateescape", "backslashreplace"})
_SEQUENCES = (tuple, list, set, frozenset, str, bytes, bytearray, dict)
_MAPPINGS = (dict, list, tuple)
_WHEN = (int, float, str, bytes, type(None), datetime.timezone)


def _primitive(name: str, args: tuple, lo: int, hi: int, types: tuple = _PRIMITIVE) -> tuple:
    arity(name, args, lo, hi)
    for a in args:
        if type(a) not in types:
            raise refuse(f"{name}: argument of type {type(a).__name__} is not accepted")
    return args


def _call(cls: type, lo: int, hi: int, types: tuple = _PRIMITIVE) -> Callable[[Loader, tuple], Any]:
    return lambda u, args: cls(*_primitive(cls.__name__, args, lo, hi, types))


def _text(u: Loader, args: tuple) -> str:
    _primitive("str", args, 0, 3, (str, bytes, bytearray))
    if len(args) >= 2 and (args[1] not in _ENCODINGS or args[-1] not in _ENCODINGS | _ERRORS):
        raise refuse(f"str: encoding must be one of {', '.join(sorted(_ENCODINGS))}")
    return str(*args)


def _bytes_like(cls: type) -> Callable[[Loader, tuple], Any]:
    def build(u: Loader, args: tuple) -> Any:
        # Never the size form (bytearray(n)): a few payload bytes must not allocate n bytes.
        _primitive(cls.__name__, args, 0, 3, (bytes, bytearray, memoryview, str, list))
        if args and type(args[0]) is str and (len(args) < 2 or args[1] not in _ENCODINGS):
            raise refuse(f"{cls.__name__}: a str needs an encoding from {', '.join(sorted(_ENCODINGS))}")
        if args:
            u.charge(len(args[0]) * (4 if type(args[0]) in (str, list) else 1))
        return cls(*args)

    return build


def _container(cls: type, types: tuple = _SEQUENCES) -> Callable[[Loader, tuple], Any]:
    def build(u: Loader, args: tuple) -> Any:
        _primitive(cls.__name__, args, 0, 1, types)
        if args:
            u.charge(len(args[0]))
        out = cls(*args)
        return u.track(out) if cls in (tuple, frozenset) else out

    return build


def _defaultdict(u: Loader, args: tuple) -> collections.defaultdict:
    arity("defaultdict", args, 0, 2)
    factory = args[0] if args else None
    if factory is not None and not (hashable_in(factory, _FACTORIES) or u.trusted(factory)):
        raise refuse(f"defaultdict: default factory {factory!r} is not accepted")
    rest = _primitive("defaultdict", args[1:], 0, 1, (dict, list))
    if rest:
        u.charge(len(rest[0]))
        u.check_unsafe_children("defaultdict", rest[0].values() if type(rest[0]) is dict else ())
    out = collections.defaultdict(factory, *rest)
    u.mark_unsafe(out)
    return out


def _deque(u: Loader, args: tuple) -> collections.deque:
    _primitive("deque", args, 0, 2, (list, tuple, int, type(None)))
    maxlen = args[1] if len(args) == 2 else None
    if (args and type(args[0]) is int) or (maxlen is not None and type(maxlen) is not int):
        raise refuse("deque takes (items, maxlen)")
    if args:
        u.charge(len(args[0]))
        u.check_unsafe_children("deque", args[0])
    out: collections.deque[Any] = collections.deque(*args)
    u.mark_unsafe(out)
    return out


_MAX_INT_BITS = 16384
_FRACTION = re.compile(r"\s*[-+]?\d{1,4300}(/\d{1,4300})?\s*")


def _fraction(u: Loader, args: tuple) -> fractions.Fraction:
    _primitive("Fraction", args, 0, 2, (int, str))
    if args and type(args[0]) is str and (len(args) > 1 or not _FRACTION.fullmatch(args[0])):
        raise refuse("Fraction: a string must be 'numerator/denominator' (no exponent)")
    _small_ints("Fraction", args)
    return fractions.Fraction(*args)


def _decimal(u: Loader, args: tuple) -> decimal.Decimal:
    _primitive("Decimal", args, 0, 1, (int, float, str, tuple))
    _small_ints("Decimal", args)
    return decimal.Decimal(*args)


def _small_ints(name: str, args: tuple) -> None:
    # gcd and decimal conversion of huge ints are quadratic: keep them to what a 'n/d' string can hold
    if any(type(a) is int and a.bit_length() > _MAX_INT_BITS for a in args):
        raise refuse(f"{name}: an int of more than {_MAX_INT_BITS} bits is not accepted")


# ---- torch ------------------------------------------------------------------------------

#: The tensor dtypes a payload may name (the float8 kinds and wide unsigned ints where torch has them).
TORCH_DTYPES = {
    name: getattr(torch, name)
    for name in (
        "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 bfloat16 float32 float64 complex64"
        " complex128 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz"
    ).split()
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def _tensor(u: Loader, args: tuple) -> torch.Tensor:
    arity("tensor", args, 4, 4)
    buf, name, shape, requires_grad = args
    dt = TORCH_DTYPES.get(name) if type(name) is str else None
    if dt is None:
        raise refuse(f"tensor dtype {name!r} is not one of {', '.join(sorted(TORCH_DTYPES))}")
    if type(requires_grad) is not bool or (requires_grad and not (dt.is_floating_point or dt.is_complex)):
        raise refuse(
            f"tensor: requires_grad must be a bool (True only for float or complex), got {requires_grad!r}"
        )
    return rebuild_tensor(sized_buffer(u, "tensor", buf, shape, dt), name, tuple(shape), requires_grad)


def _parameter(u: Loader, args: tuple) -> torch.nn.Parameter:
    arity("torch parameter", args, 3, 4)
    data, requires_grad, hooks = args[:3]
    state = args[3] if len(args) == 4 else None
    if type(data) is not torch.Tensor or type(requires_grad) is not bool:
        raise refuse("torch parameter takes (tensor, requires_grad)")
    if hooks or state not in (None, {}, (None, {}), ({}, None)):
        raise refuse("torch parameter: backward hooks and extra state are not accepted")
    return torch.nn.Parameter(data, requires_grad)


def _size(u: Loader, args: tuple) -> torch.Size:
    arity("torch.Size", args, 1, 1)
    shape_of("torch.Size", args[0])
    return torch.Size(args[0])


def _device(u: Loader, args: tuple) -> torch.device:
    arity("torch.device", args, 1, 2)
    index = args[1] if len(args) == 2 else None
    if type(args[0]) is not str or len(args[0]) > 64 or (index is not None and type(index) is not int):
        raise refuse("torch.device takes (type string, index)")
    return torch.device(*args)


_INDEX_DTYPES = (torch.int64, torch.int32)


def _tensor_arg(name: str, x: Any) -> torch.Tensor:
    if type(x) is not torch.Tensor or x.layout != torch.strided or x.is_quantized:
        raise refuse(f"{name} must be a dense tensor, got {type(x).__name__}")
    return x


def _sparse(u: Loader, args: tuple) -> torch.Tensor:
    arity("sparse tensor", args, 5, 5)
    layout, parts, shape, coalesced, requires_grad = args
    if type(layout) is not str or layout not in SPARSE_LAYOUTS:
        raise refuse(f"sparse tensor: layout {layout!r} is not one of {', '.join(SPARSE_LAYOUTS)}")
    want = 2 if layout == "sparse_coo" else 3
    if type(parts) is not tuple or len(parts) != want:
        raise refuse(f"sparse tensor: {layout} takes {want} tensors (indices, values)")
    *indices, values = [_tensor_arg(f"sparse tensor {layout} part", p) for p in parts]
    if any(i.dtype not in _INDEX_DTYPES for i in indices):
        raise refuse(f"sparse tensor: indices must be int64 or int32, got {[str(i.dtype) for i in indices]}")
    shape_of("sparse tensor", shape)
    if type(coalesced) is not bool or type(requires_grad) is not bool:
        raise refuse("sparse tensor: is_coalesced and requires_grad must be bools")
    if requires_grad and not (values.dtype.is_floating_point or values.dtype.is_complex):
        raise refuse("sparse tensor: requires_grad is True only for float or complex values")
    return rebuild_sparse(layout, tuple(parts), tuple(shape), coalesced, requires_grad)  # checks invariants


def _quantized(u: Loader, args: tuple) -> torch.Tensor:
    arity("quantized tensor", args, 2, 2)
    values, params = args
    values = _tensor_arg("quantized tensor values", values)
    if values.dtype not in QUANTIZED_INTS.values() or values.requires_grad:
        raise refuse(f"quantized tensor: values must be uint8, int8 or int32, got {values.dtype}")
    if type(params) is not tuple or not params or params[0] not in QSCHEMES:
        raise refuse(f"quantized tensor: the scheme must be one of {', '.join(QSCHEMES)}")
    if params[0] == "per_tensor_affine":
        if len(params) != 3 or type(params[1]) is not float or type(params[2]) is not int:
            raise refuse("quantized tensor: per_tensor_affine takes (scale, zero_point)")
        if not (math.isfinite(params[1]) and params[1] > 0) or abs(params[2]) > 1 << 31:
            raise refuse("quantized tensor: the scale must be finite and positive, the zero point an int32")
        return rebuild_quantized(values, params)
    if len(params) != 4 or type(params[3]) is not int:
        raise refuse(f"quantized tensor: {params[0]} takes (scales, zero_points, axis)")
    scales = _tensor_arg("quantized scales", params[1])
    zeros = _tensor_arg("quantized zero points", params[2])
    axis = int_arg("quantized tensor axis", params[3])
    want_zero = torch.int64 if params[0] == "per_channel_affine" else scales.dtype
    one_per_entry = axis < values.dim() and scales.dim() == 1 and zeros.dim() == 1
    one_per_entry = one_per_entry and len(scales) == values.shape[axis] == len(zeros)
    if not one_per_entry or not scales.dtype.is_floating_point or zeros.dtype != want_zero:
        raise refuse(
            f"quantized tensor: {params[0]} needs 1-D float scales and {want_zero} zero points,"
            " one per entry of the axis"
        )
    return rebuild_quantized(values, params)


def _meta(u: Loader, args: tuple) -> torch.Tensor:
    """torch's form of a meta tensor (no data): dtype, shape, strides, requires_grad."""
    arity("meta tensor", args, 4, 4)
    dt, shape, stride, requires_grad = args
    if not isinstance(dt, torch.dtype) or dt not in TORCH_DTYPES.values():
        raise refuse(f"meta tensor: dtype {dt!r} is not accepted")
    ndim, _ = shape_of("meta tensor", shape)
    if type(stride) not in (tuple, list) or len(stride) != ndim or any(type(s) is not int for s in stride):
        raise refuse("meta tensor: strides must be a tuple of ints, one per dimension")
    if type(requires_grad) is not bool or (requires_grad and not (dt.is_floating_point or dt.is_complex)):
        raise refuse("meta tensor: requires_grad must be a bool (True only for float or complex)")
    out = torch.empty_strided(tuple(shape), tuple(stride), dtype=dt, device="meta")
    return out.requires_grad_(True) if requires_grad else out


CALLS: dict[Any, Callable[[Loader, tuple], Any]] = {
    bool: _call(bool, 0, 1),
    int: _call(int, 0, 2, (int, float, str, bytes, bool)),
    float: _call(float, 0, 1),
    complex: _call(complex, 0, 2, (int, float, complex, str, bool)),
    str: _text,
    bytes: _bytes_like(bytes),
    bytearray: _bytes_like(bytearray),
    tuple: _container(tuple),
    list: _container(list),
    set: _container(set),
    frozenset: _container(frozenset),
    dict: _container(dict, _MAPPINGS),
    range: _call(range, 1, 3, (int,)),
    slice: _call(slice, 1, 3, (int, type(None))),
    collections.OrderedDict: _container(collections.OrderedDict, _MAPPINGS),
    collections.Counter: _container(collections.Counter, (dict,)),
    collections.defaultdict: _defaultdict,
    collections.deque: _deque,
    datetime.datetime: _call(datetime.datetime, 0, 8, _WHEN),
    datetime.date: _call(datetime.date, 0, 8, _WHEN),
    datetime.time: _call(datetime.time, 0, 8, _WHEN),
    datetime.timedelta: _call(datetime.timedelta, 0, 8, _WHEN),
    datetime.timezone: _call(datetime.timezone, 1, 2, (datetime.timedelta, str)),
    decimal.Decimal: _decimal,
    fractions.Fraction: _fraction,
    np.dtype: _np_dtype,
    torch.Size: _size,
    torch.device: _device,
}
_FACTORIES = frozenset(
    {int, float, complex, str, bytes, bool, list, dict, set, frozenset, tuple}
    | {collections.OrderedDict, collections.Counter, decimal.Decimal, fractions.Fraction}
)
#: Containers whose deallocation recurses in C without CPython's trashcan: never directly nested.
UNSAFE_NESTING = (collections.deque, collections.defaultdict, np.ndarray)
#: The module whose ``rebuild_*`` functions hwdist's tensor streams name.
SERIALIZATION = "hwdist.serialization.tensors"
_HANDLERS: dict[tuple[str, str], Callable[[Loader, tuple], Any]] = {
    ("torch._utils", "_rebuild_parameter"): _parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _parameter,
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): _meta,
    (SERIALIZATION, "rebuild_tensor"): _tensor,
    (SERIALIZATION, "rebuild_sparse"): _sparse,
    (SERIALIZATION, "rebuild_quantized"): _quantized,
    ("numpy", "frombuffer"): _np_frombuffer_1d,
}
for _np_mod in ("numpy.core", "numpy._core"):
    _HANDLERS[(f"{_np_mod}.numeric", "_frombuffer")] = _np_frombuffer
    _HANDLERS[(f"{_np_mod}.multiarray", "_reconstruct")] = _np_reconstruct
    _HANDLERS[(f"{_np_mod}.multiarray", "scalar")] = _np_scalar
# Deliberately one explicit line per allowed global (not built from module/name lists): this is the
# loader's allow-list, audited line by line, and each key must be the exact name a stream uses.
VALUES: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): collections.defaultdict,
    ("collections", "deque"): collections.deque,
    ("collections", "Counter"): collections.Counter,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "date"): datetime.date,
    ("datetime", "time"): datetime.time,
    ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone,
    ("decimal", "Decimal"): decimal.Decimal,
    ("fractions", "Fraction"): fractions.Fraction,
    ("numpy", "dtype"): np.dtype,
    ("numpy", "ndarray"): np.ndarray,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
}
VALUES.update({key: Handler(".".join(key), fn) for key, fn in _HANDLERS.items()})
