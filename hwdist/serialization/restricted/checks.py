"""The allow-list of the restricted unpickler, and the handlers of numpy and the standard library.

A payload never reaches a constructor with unchecked values: each handler
takes the REDUCE arguments (or a BUILD state), checks types, sizes and
ranges, and builds the object itself. numpy arrays come only from a plain
numeric (or record, or object-by-element) dtype, a shape and a buffer of
exactly the right size; torch's types are in ``torchtypes.py``. See
``loader.py`` for the interpreter that calls them.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import re
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..tensors import plain_dtype
from .base import Handler, Pending, arity, byte_view, check_bool_bytes, hashable_in, int_arg, refuse, shape_of
from .torchtypes import TORCH_CALLS, TORCH_HANDLERS, TORCH_VALUES

if TYPE_CHECKING:  # the handlers get the running interpreter; never imported at run time
    from .loader import Loader


def _array_dtype(name: str, dt: Any, allow_object: bool = False) -> np.dtype:
    if plain_dtype(dt):
        return dt
    if isinstance(dt, np.dtype) and dt.fields is not None and dt.kind == "V":
        if all(plain_dtype(f[0]) and f[0].kind != "b" and len(f) == 2 for f in dt.fields.values()):
            return dt
    if (
        allow_object
        and isinstance(dt, np.dtype)
        and dt.kind == "O"
        and dt.fields is None
        and dt.metadata is None
    ):
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
    match = _DTYPE_STR.fullmatch(spec) if type(spec) is str else None
    if match is None:
        raise refuse(f"numpy.dtype {spec!r} is not a plain numeric, record or object dtype")
    return Pending(lambda u2, state: _np_dtype_state(spec, state))


def _np_dtype_state(spec: str, state: Any) -> np.dtype:
    if type(state) is not tuple or len(state) not in (8, 9) or state[0] not in (3, 4):
        raise refuse("numpy.dtype state must be numpy's 8-tuple (version 3 or 4)")
    endian, subarray, names, fields, elsize = state[1:6]
    if (
        endian not in ("<", ">", "|", "=")
        or subarray is not None
        or (len(state) == 9 and state[8] is not None)
    ):
        raise refuse(
            f"numpy.dtype {spec!r}: byte order {endian!r}, sub-arrays and metadata are not accepted"
        )
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
        for x in raw:
            u.check_unsafe_child("numpy object array", x)
        flat: Any = np.fromiter(raw, dtype=object, count=count)
        out = flat.reshape(shape, order=order)
        u.mark_unsafe(out)
        return out
    view = byte_view("numpy array data", raw)
    if view.nbytes != count * dt.itemsize:
        raise refuse(
            f"numpy array: shape {tuple(shape)} of {dt} needs {count * dt.itemsize} bytes, got {view.nbytes}"
        )
    u.charge(view.nbytes)
    if dt.kind == "b":
        check_bool_bytes("numpy array", view)
    out = np.frombuffer(view, dtype=dt)
    if not out.flags.writeable:
        out = out.copy()
    return out.reshape(shape, order=order)


def _np_frombuffer(u: Loader, args: tuple) -> np.ndarray:
    arity("numpy _frombuffer", args, 4, 4)
    buf, dt, shape, order = args
    view = byte_view("numpy _frombuffer", buf)
    dt = _array_dtype("numpy _frombuffer", dt)
    _, count = shape_of("numpy _frombuffer", shape)
    if order not in ("C", "F"):
        raise refuse(f"numpy _frombuffer: order must be 'C' or 'F', got {order!r}")
    if view.nbytes != count * dt.itemsize:
        raise refuse(
            f"numpy _frombuffer: shape {tuple(shape)} of {dt} needs {count * dt.itemsize} bytes,"
            f" got {view.nbytes}"
        )
    u.charge(view.nbytes)
    if dt.kind == "b":
        check_bool_bytes("numpy _frombuffer", view)
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
    u.charge(view.nbytes)
    if dt.kind == "b":
        check_bool_bytes("numpy.frombuffer", view)
    return np.frombuffer(view, dtype=dt)


def _np_scalar(u: Loader, args: tuple) -> Any:
    arity("numpy scalar", args, 2, 2)
    dt = _array_dtype("numpy scalar", args[0])
    view = byte_view("numpy scalar", args[1]) if type(args[1]) is bytes else None
    if view is None or view.nbytes != dt.itemsize:
        raise refuse(f"numpy scalar of {dt} needs {dt.itemsize} bytes")
    if dt.kind == "b":
        check_bool_bytes("numpy scalar", view)
    return np.frombuffer(view, dtype=dt)[0]


# ---- torch ------------------------------------------------------------------------------

# ---- the standard library ---------------------------------------------------------------

_PRIMITIVE = (int, float, complex, str, bytes, bool, type(None))
_ENCODINGS = frozenset({"utf-8", "utf8", "latin-1", "latin1", "ascii"})
_ERRORS = frozenset({"strict", "replace", "ignore", "surrogatepass", "surrogateescape", "backslashreplace"})
_SEQUENCES = (tuple, list, set, frozenset, str, bytes, bytearray, dict)


def _primitive(name: str, args: tuple, lo: int, hi: int, types: tuple = _PRIMITIVE) -> tuple:
    arity(name, args, lo, hi)
    for a in args:
        if type(a) not in types:
            raise refuse(f"{name}: argument of type {type(a).__name__} is not accepted")
    return args


def _call_primitive(cls: type, lo: int, hi: int) -> Callable[[Loader, tuple], Any]:
    return lambda u, args: cls(*_primitive(cls.__name__, args, lo, hi))


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


def _container(cls: type) -> Callable[[Loader, tuple], Any]:
    def build(u: Loader, args: tuple) -> Any:
        _primitive(cls.__name__, args, 0, 1, _SEQUENCES)
        if args:
            u.charge(len(args[0]))
        out = cls(*args)
        if cls in (tuple, frozenset):
            u.track(out, out)
        return out

    return build


def _range(u: Loader, args: tuple) -> range:
    return range(*_primitive("range", args, 1, 3, (int,)))


def _slice(u: Loader, args: tuple) -> slice:
    return slice(*_primitive("slice", args, 1, 3, (int, type(None))))


def _mapping(cls: type) -> Callable[[Loader, tuple], Any]:
    def build(u: Loader, args: tuple) -> Any:
        _primitive(
            cls.__name__, args, 0, 1, (dict, list, tuple) if cls is not collections.Counter else (dict,)
        )
        if args:
            u.charge(len(args[0]))
        return cls(*args)

    return build


def _defaultdict(u: Loader, args: tuple) -> collections.defaultdict:
    arity("defaultdict", args, 0, 2)
    factory = args[0] if args else None
    if factory is not None and not (hashable_in(factory, _FACTORIES) or u.trusted(factory)):
        raise refuse(f"defaultdict: default factory {factory!r} is not accepted")
    rest = _primitive("defaultdict", args[1:], 0, 1, (dict, list))
    if rest:
        u.charge(len(rest[0]))
        for v in rest[0].values() if type(rest[0]) is dict else ():
            u.check_unsafe_child("defaultdict", v)
    out = collections.defaultdict(factory, *rest)
    u.mark_unsafe(out)
    return out


def _deque(u: Loader, args: tuple) -> collections.deque:
    _primitive("deque", args, 0, 2, (list, tuple, int, type(None)))
    if (args and type(args[0]) is int) or (
        len(args) == 2 and type(args[1]) is not int and args[1] is not None
    ):
        raise refuse("deque takes (items, maxlen)")
    if args:
        u.charge(len(args[0]))
        for x in args[0]:
            u.check_unsafe_child("deque", x)
    out: collections.deque[Any] = collections.deque(*args)
    u.mark_unsafe(out)
    return out


def _timezone(u: Loader, args: tuple) -> datetime.timezone:
    return datetime.timezone(*_primitive("timezone", args, 1, 2, (datetime.timedelta, str)))


def _when(cls: type) -> Callable[[Loader, tuple], Any]:
    types = (int, float, str, bytes, type(None), datetime.timezone)
    return lambda u, args: cls(*_primitive(cls.__name__, args, 0, 8, types))


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


CALLS: dict[Any, Callable[[Loader, tuple], Any]] = {
    bool: _call_primitive(bool, 0, 1),
    int: lambda u, args: int(*_primitive("int", args, 0, 2, (int, float, str, bytes, bool))),
    float: _call_primitive(float, 0, 1),
    complex: lambda u, args: complex(*_primitive("complex", args, 0, 2, (int, float, complex, str, bool))),
    str: _text,
    bytes: _bytes_like(bytes),
    bytearray: _bytes_like(bytearray),
    tuple: _container(tuple),
    list: _container(list),
    set: _container(set),
    frozenset: _container(frozenset),
    dict: _mapping(dict),
    range: _range,
    slice: _slice,
    collections.OrderedDict: _mapping(collections.OrderedDict),
    collections.Counter: _mapping(collections.Counter),
    collections.defaultdict: _defaultdict,
    collections.deque: _deque,
    datetime.datetime: _when(datetime.datetime),
    datetime.date: _when(datetime.date),
    datetime.time: _when(datetime.time),
    datetime.timedelta: _when(datetime.timedelta),
    datetime.timezone: _timezone,
    decimal.Decimal: _decimal,
    fractions.Fraction: _fraction,
    np.dtype: _np_dtype,
    **TORCH_CALLS,
}
_FACTORIES = frozenset(
    {
        int,
        float,
        complex,
        str,
        bytes,
        bool,
        list,
        dict,
        set,
        frozenset,
        tuple,
        collections.OrderedDict,
        collections.Counter,
        decimal.Decimal,
        fractions.Fraction,
    }
)
#: Containers whose deallocation recurses in C without CPython's trashcan: never directly nested.
UNSAFE_NESTING = (collections.deque, collections.defaultdict, np.ndarray)
_HANDLERS: dict[tuple[str, str], Callable[[Loader, tuple], Any]] = dict(TORCH_HANDLERS)
_HANDLERS[("numpy", "frombuffer")] = _np_frombuffer_1d
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
    **TORCH_VALUES,
}
VALUES.update({key: Handler(".".join(key), fn) for key, fn in _HANDLERS.items()})
