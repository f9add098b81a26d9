"""The restricted unpickler: hwdist's own pickle interpreter for payloads from peers it does not trust.

Python's unpickler calls whatever a payload names and lets BUILD set state on
any object, so an allow-list of globals on top of it is not enough (numpy's
reconstructors trust their arguments, BUILD can ``setattr`` on a class, and
``bytearray(n)`` or a BYTEARRAY8 opcode allocate what the payload asks for).
This module reads the opcode stream itself and never hands the payload's
values to a constructor unchecked:

* every global resolves through an allow-list to a value or to one of
  hwdist's handlers, which checks the arguments and builds the object itself
  (numpy arrays from a plain numeric dtype, a shape and a buffer of exactly
  the right size; tensors likewise);
* BUILD sets state only on instances of classes the user registered, never
  on a class; allow-listed standard types take no state;
* every length is checked against the bytes left before anything is
  allocated, and size-driven copies are charged against a budget
  proportional to the payload;
* nesting that CPython cannot hash or free without deep C recursion is
  refused.

Everything that is not accepted raises :class:`UnpicklingRefused`. The trust
model is described in ``docs/objects.md`` and ``docs/reliability.md``.
"""

from __future__ import annotations

import builtins
import codecs
import collections
import datetime
import decimal
import fractions
import importlib
import pickle
import re
import struct
import threading
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np
import torch

__all__ = ["UnpicklingRefused", "RestrictedUnpickler", "register_safe_class", "safe_globals", "restricted_loads"]

_SERIALIZATION = "hwdist.collectives.serialization"
#: Deepest chain of tuples/frozensets (hashed recursively by CPython) a payload may build.
MAX_NESTING = 1000
_MAX_DIMS = 32


class UnpicklingRefused(pickle.UnpicklingError):
    """The restricted unpickler refused a payload (a global off the allow-list, a bad description, ...).

    Nothing the payload named was called, and no object outside the payload was changed.
    """


def _refuse(msg: str) -> UnpicklingRefused:
    return UnpicklingRefused(f"restricted unpickler refused the payload: {msg}")


# ---- the allow-list -------------------------------------------------------------------

_SAFE_BUILTINS = frozenset(
    {
        "bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int",
        "list", "range", "set", "slice", "str", "tuple", "NoneType", "Ellipsis",
        "NotImplemented",
    }
)
_SAFE: set[tuple[str, str]] = {
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("collections", "deque"),
    ("collections", "Counter"),
    ("datetime", "datetime"),
    ("datetime", "date"),
    ("datetime", "time"),
    ("datetime", "timedelta"),
    ("datetime", "timezone"),
    ("decimal", "Decimal"),
    ("fractions", "Fraction"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch.nn.parameter", "Parameter"),
    (_SERIALIZATION, "_rebuild_tensor"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
}
for _np_mod in ("numpy.core", "numpy._core"):
    _SAFE |= {
        (f"{_np_mod}.numeric", "_frombuffer"),
        (f"{_np_mod}.multiarray", "_reconstruct"),
        (f"{_np_mod}.multiarray", "scalar"),
    }
_SAFE_LOCK = threading.Lock()


def register_safe_class(*classes: Union[type, Callable[..., Any], str]) -> None:
    """Allow classes (or functions, or ``'module.QualName'`` strings) in the restricted unpickler.

    Only register what cannot run code you do not want when unpickled: the
    class's ``__new__``, ``__init__`` (when a payload calls it),
    ``__setstate__`` and the state a payload sets on its instances are trusted.
    Names hwdist already handles (numpy, torch, standard types) keep hwdist's
    checks.

    Example:
        >>> @dataclasses.dataclass
        ... class Box:
        ...     x: int
        >>> hwdist.register_safe_class(Box)         # on every rank that receives a Box
    """
    pairs = [_pair("register_safe_class", item) for item in classes]
    with _SAFE_LOCK:
        _SAFE.update(pairs)


def _pair(where: str, item: Union[type, Callable[..., Any], str]) -> tuple[str, str]:
    if isinstance(item, str):
        module, _, name = item.rpartition(".")
        if not module or not name:
            raise ValueError(f"{where}: expected 'module.QualName', got {item!r}")
        return module, name
    module = getattr(item, "__module__", None)
    name = getattr(item, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str) or not module or not name:
        raise TypeError(f"{where}: expected a class, function or 'module.QualName' string, got {type(item).__name__}: {item!r}")
    return module, name


def safe_globals() -> frozenset[tuple[str, str]]:
    """The ``(module, name)`` pairs the restricted unpickler accepts (besides builtins and torch dtypes)."""
    with _SAFE_LOCK:
        return frozenset(_SAFE)


# ---- checks shared by the handlers ------------------------------------------------------


class _Handler:
    """What a payload gets for a global that only hwdist's own code may act on."""

    __slots__ = ("name", "fn")

    def __init__(self, name: str, fn: Callable[[_Loader, tuple], Any]) -> None:
        self.name, self.fn = name, fn

    def __repr__(self) -> str:
        return f"<restricted global {self.name}>"


class _Pending:
    """An object whose final value comes with the BUILD that follows (numpy's dtype and array formats)."""

    __slots__ = ("finish", "keys", "done")

    def __init__(self, finish: Callable[[_Loader, Any], Any]) -> None:
        self.finish, self.keys, self.done = finish, [], False

    def __repr__(self) -> str:
        return "<unfinished restricted object>"


def _arity(name: str, args: tuple, lo: int, hi: int) -> None:
    if not lo <= len(args) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise _refuse(f"{name} takes {want} arguments, got {len(args)}")


def _int(name: str, x: Any, lo: int = 0) -> int:
    if type(x) is not int or x < lo:
        raise _refuse(f"{name} must be an int >= {lo}, got {type(x).__name__}")
    return x


def _shape(name: str, shape: Any) -> tuple[int, int]:
    """``(ndim, number of elements)`` of a checked shape."""
    if type(shape) not in (tuple, list, torch.Size) or len(shape) > _MAX_DIMS:
        raise _refuse(f"{name}: shape must be a tuple of at most {_MAX_DIMS} ints, got {type(shape).__name__}")
    count = 1
    for d in shape:
        count *= _int(f"{name}: shape entry", d)
    return len(shape), count


def _byte_view(name: str, buf: Any) -> memoryview:
    if type(buf) not in (bytes, bytearray, memoryview, pickle.PickleBuffer):
        raise _refuse(f"{name}: expected a buffer, got {type(buf).__name__}")
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _check_bool_bytes(name: str, view: memoryview) -> None:
    if view.nbytes and int(np.frombuffer(view, dtype=np.uint8).max()) > 1:
        raise _refuse(f"{name}: a bool buffer holds a byte other than 0 or 1")


_PLAIN_KINDS = "biufc"


def _plain_dtype(dt: Any) -> bool:
    """A numpy dtype that any bytes are a valid value of: bool, ints, floats, complex, one element."""
    return (
        isinstance(dt, np.dtype)
        and dt.kind in _PLAIN_KINDS
        and dt.fields is None
        and dt.subdtype is None
        and dt.metadata is None
    )


def _array_dtype(name: str, dt: Any, allow_object: bool = False) -> np.dtype:
    if _plain_dtype(dt):
        return dt
    if isinstance(dt, np.dtype) and dt.fields is not None and dt.kind == "V":
        if all(_plain_dtype(f[0]) and f[0].kind != "b" and len(f) == 2 for f in dt.fields.values()):
            return dt
    if allow_object and isinstance(dt, np.dtype) and dt.kind == "O" and dt.fields is None and dt.metadata is None:
        return dt
    raise _refuse(
        f"{name}: dtype {dt!r} is not a plain numeric dtype (bool, int, uint, float, complex, or a record of"
        " non-bool numeric fields). HINT: send it as a list, or convert it with .astype()"
    )


# ---- numpy: rebuilt by hwdist from checked descriptions ----------------------------------

_DTYPE_STR = re.compile(r"([biufc])(\d{1,2})|(V)(\d{1,9})|(O)(4|8)")


def _np_dtype(u: _Loader, args: tuple) -> _Pending:
    _arity("numpy.dtype", args, 1, 3)
    spec = args[0]
    match = _DTYPE_STR.fullmatch(spec) if type(spec) is str else None
    if match is None:
        raise _refuse(f"numpy.dtype {spec!r} is not a plain numeric, record or object dtype")
    return _Pending(lambda u2, state: _np_dtype_state(spec, state))


def _np_dtype_state(spec: str, state: Any) -> np.dtype:
    if type(state) is not tuple or len(state) not in (8, 9) or state[0] not in (3, 4):
        raise _refuse("numpy.dtype state must be numpy's 8-tuple (version 3 or 4)")
    endian, subarray, names, fields, elsize = state[1:6]
    if endian not in ("<", ">", "|", "=") or subarray is not None or (len(state) == 9 and state[8] is not None):
        raise _refuse(f"numpy.dtype {spec!r}: byte order {endian!r}, sub-arrays and metadata are not accepted")
    if spec[0] == "V":
        if type(names) is not tuple or not names or type(fields) is not dict or len(fields) != len(names):
            raise _refuse(f"numpy.dtype {spec!r}: a record needs names and fields")
        itemsize = _int("numpy.dtype record size", elsize, 1)
        formats, offsets = [], []
        for key in names:
            entry = fields.get(key) if type(key) is str else None
            if type(entry) is not tuple or len(entry) != 2:
                raise _refuse(f"numpy.dtype {spec!r}: field {key!r} must be (dtype, offset)")
            dt = _array_dtype(f"numpy.dtype field {key!r}", entry[0])
            off = _int(f"numpy.dtype field {key!r} offset", entry[1])
            if dt.fields is not None or dt.kind == "b" or off + dt.itemsize > itemsize:
                raise _refuse(f"numpy.dtype {spec!r}: field {key!r} does not fit a plain field in {itemsize} bytes")
            formats.append(dt)
            offsets.append(off)
        return np.dtype({"names": list(names), "formats": formats, "offsets": offsets, "itemsize": itemsize})
    if names is not None or fields is not None:
        raise _refuse(f"numpy.dtype {spec!r} cannot have fields")
    if spec[0] == "O":
        return np.dtype(object)
    dt = np.dtype(spec)
    return dt.newbyteorder(endian) if endian in "<>" and dt.itemsize > 1 else dt


def _np_reconstruct(u: _Loader, args: tuple) -> _Pending:
    if not (len(args) == 3 and args[0] is np.ndarray and args[1] == (0,) and args[2] == b"b"):
        raise _refuse("numpy _reconstruct takes only (numpy.ndarray, (0,), b'b')")
    return _Pending(_np_array_state)


def _np_array_state(u: _Loader, state: Any) -> np.ndarray:
    if type(state) is not tuple or len(state) != 5 or state[0] != 1:
        raise _refuse("numpy array state must be numpy's 5-tuple (version 1)")
    _, shape, dt, fortran, raw = state
    _, count = _shape("numpy array", shape)
    dt = _array_dtype("numpy array", dt, allow_object=True)
    order = "F" if fortran is True or fortran == 1 else "C"
    if dt.kind == "O":
        if type(raw) is not list or len(raw) != count:
            raise _refuse(f"numpy object array: expected a list of {count} items")
        u.charge(count)
        for x in raw:
            u.check_unsafe_child("numpy object array", x)
        out = np.fromiter(raw, dtype=object, count=count).reshape(shape, order=order)
        u.mark_unsafe(out)
        return out
    view = _byte_view("numpy array data", raw)
    if view.nbytes != count * dt.itemsize:
        raise _refuse(f"numpy array: shape {tuple(shape)} of {dt} needs {count * dt.itemsize} bytes, got {view.nbytes}")
    u.charge(view.nbytes)
    if dt.kind == "b":
        _check_bool_bytes("numpy array", view)
    out = np.frombuffer(view, dtype=dt)
    if not out.flags.writeable:
        out = out.copy()
    return out.reshape(shape, order=order)


def _np_frombuffer(u: _Loader, args: tuple) -> np.ndarray:
    _arity("numpy _frombuffer", args, 4, 4)
    buf, dt, shape, order = args
    view = _byte_view("numpy _frombuffer", buf)
    dt = _array_dtype("numpy _frombuffer", dt)
    _, count = _shape("numpy _frombuffer", shape)
    if order not in ("C", "F"):
        raise _refuse(f"numpy _frombuffer: order must be 'C' or 'F', got {order!r}")
    if view.nbytes != count * dt.itemsize:
        raise _refuse(f"numpy _frombuffer: shape {tuple(shape)} of {dt} needs {count * dt.itemsize} bytes, got {view.nbytes}")
    u.charge(view.nbytes)
    if dt.kind == "b":
        _check_bool_bytes("numpy _frombuffer", view)
    return np.frombuffer(view, dtype=dt).reshape(shape, order=order)


def _np_scalar(u: _Loader, args: tuple) -> Any:
    _arity("numpy scalar", args, 2, 2)
    dt = _array_dtype("numpy scalar", args[0])
    view = _byte_view("numpy scalar", args[1]) if type(args[1]) is bytes else None
    if view is None or view.nbytes != dt.itemsize:
        raise _refuse(f"numpy scalar of {dt} needs {dt.itemsize} bytes")
    if dt.kind == "b":
        _check_bool_bytes("numpy scalar", view)
    return np.frombuffer(view, dtype=dt)[0]


# ---- torch ------------------------------------------------------------------------------

_TORCH_DTYPES = {
    name: getattr(torch, name)
    for name in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def _tensor(u: _Loader, args: tuple) -> torch.Tensor:
    _arity("tensor", args, 4, 4)
    buf, name, shape, requires_grad = args
    view = _byte_view("tensor", buf)
    dt = _TORCH_DTYPES.get(name) if type(name) is str else None
    if dt is None:
        raise _refuse(f"tensor dtype {name!r} is not one of {', '.join(sorted(_TORCH_DTYPES))}")
    _, count = _shape("tensor", shape)
    if view.nbytes != count * dt.itemsize:
        raise _refuse(f"tensor: shape {tuple(shape)} of {name} needs {count * dt.itemsize} bytes, got {view.nbytes}")
    if type(requires_grad) is not bool or (requires_grad and not (dt.is_floating_point or dt.is_complex)):
        raise _refuse(f"tensor: requires_grad must be a bool (True only for float or complex), got {requires_grad!r}")
    u.charge(view.nbytes)
    if dt is torch.bool:
        _check_bool_bytes("tensor", view)
    from .serialization import _rebuild_tensor

    return _rebuild_tensor(view, name, tuple(shape), requires_grad)


def _parameter(u: _Loader, args: tuple) -> torch.nn.Parameter:
    _arity("torch parameter", args, 3, 4)
    data, requires_grad, hooks = args[:3]
    state = args[3] if len(args) == 4 else None
    if type(data) is not torch.Tensor or type(requires_grad) is not bool:
        raise _refuse("torch parameter takes (tensor, requires_grad)")
    if hooks or state not in (None, {}, (None, {}), ({}, None)):
        raise _refuse("torch parameter: backward hooks and extra state are not accepted")
    return torch.nn.Parameter(data, requires_grad)


def _size(u: _Loader, args: tuple) -> torch.Size:
    _arity("torch.Size", args, 1, 1)
    _shape("torch.Size", args[0])
    return torch.Size(args[0])


def _device(u: _Loader, args: tuple) -> torch.device:
    _arity("torch.device", args, 1, 2)
    if type(args[0]) is not str or len(args[0]) > 64 or (len(args) == 2 and args[1] is not None and type(args[1]) is not int):
        raise _refuse("torch.device takes (type string, index)")
    return torch.device(*args)


# ---- the standard library ---------------------------------------------------------------

_PRIMITIVE = (int, float, complex, str, bytes, bool, type(None))
_ENCODINGS = frozenset({"utf-8", "utf8", "latin-1", "latin1", "ascii"})
_ERRORS = frozenset({"strict", "replace", "ignore", "surrogatepass", "surrogateescape", "backslashreplace"})
_SEQUENCES = (tuple, list, set, frozenset, str, bytes, bytearray, dict)


def _primitive(name: str, args: tuple, lo: int, hi: int, types: tuple = _PRIMITIVE) -> tuple:
    _arity(name, args, lo, hi)
    for a in args:
        if type(a) not in types:
            raise _refuse(f"{name}: argument of type {type(a).__name__} is not accepted")
    return args


def _call_primitive(cls: type, lo: int, hi: int) -> Callable[[_Loader, tuple], Any]:
    return lambda u, args: cls(*_primitive(cls.__name__, args, lo, hi))


def _text(u: _Loader, args: tuple) -> str:
    _primitive("str", args, 0, 3, (str, bytes, bytearray))
    if len(args) >= 2 and (args[1] not in _ENCODINGS or args[-1] not in _ENCODINGS | _ERRORS):
        raise _refuse(f"str: encoding must be one of {', '.join(sorted(_ENCODINGS))}")
    return str(*args)


def _bytes_like(cls: type) -> Callable[[_Loader, tuple], Any]:
    def build(u: _Loader, args: tuple) -> Any:
        # Never the size form (bytearray(n)): a few payload bytes must not allocate n bytes.
        _primitive(cls.__name__, args, 0, 3, (bytes, bytearray, memoryview, str, list))
        if args and type(args[0]) is str and (len(args) < 2 or args[1] not in _ENCODINGS):
            raise _refuse(f"{cls.__name__}: a str needs an encoding from {', '.join(sorted(_ENCODINGS))}")
        if args:
            u.charge(len(args[0]) * (4 if type(args[0]) in (str, list) else 1))
        return cls(*args)

    return build


def _container(cls: type) -> Callable[[_Loader, tuple], Any]:
    def build(u: _Loader, args: tuple) -> Any:
        _primitive(cls.__name__, args, 0, 1, _SEQUENCES)
        if args:
            u.charge(len(args[0]))
        out = cls(*args)
        if cls in (tuple, frozenset):
            u.track(out, out)
        return out

    return build


def _range(u: _Loader, args: tuple) -> range:
    return range(*_primitive("range", args, 1, 3, (int,)))


def _slice(u: _Loader, args: tuple) -> slice:
    return slice(*_primitive("slice", args, 1, 3, (int, type(None))))


def _mapping(cls: type) -> Callable[[_Loader, tuple], Any]:
    def build(u: _Loader, args: tuple) -> Any:
        _primitive(cls.__name__, args, 0, 1, (dict, list, tuple) if cls is not collections.Counter else (dict,))
        if args:
            u.charge(len(args[0]))
        return cls(*args)

    return build


def _defaultdict(u: _Loader, args: tuple) -> collections.defaultdict:
    _arity("defaultdict", args, 0, 2)
    factory = args[0] if args else None
    if factory is not None and not (_hashable_in(factory, _FACTORIES) or u.trusted(factory)):
        raise _refuse(f"defaultdict: default factory {factory!r} is not accepted")
    rest = _primitive("defaultdict", args[1:], 0, 1, (dict, list))
    if rest:
        u.charge(len(rest[0]))
        for v in (rest[0].values() if type(rest[0]) is dict else ()):
            u.check_unsafe_child("defaultdict", v)
    out = collections.defaultdict(factory, *rest)
    u.mark_unsafe(out)
    return out


def _deque(u: _Loader, args: tuple) -> collections.deque:
    _primitive("deque", args, 0, 2, (list, tuple, int, type(None)))
    if (args and type(args[0]) is int) or (len(args) == 2 and type(args[1]) is not int and args[1] is not None):
        raise _refuse("deque takes (items, maxlen)")
    if args:
        u.charge(len(args[0]))
        for x in args[0]:
            u.check_unsafe_child("deque", x)
    out = collections.deque(*args)
    u.mark_unsafe(out)
    return out


def _timezone(u: _Loader, args: tuple) -> datetime.timezone:
    return datetime.timezone(*_primitive("timezone", args, 1, 2, (datetime.timedelta, str)))


def _when(cls: type) -> Callable[[_Loader, tuple], Any]:
    types = (int, float, str, bytes, type(None), datetime.timezone)
    return lambda u, args: cls(*_primitive(cls.__name__, args, 0, 8, types))


_FRACTION = re.compile(r"\s*[-+]?\d{1,4300}(/\d{1,4300})?\s*")


def _fraction(u: _Loader, args: tuple) -> fractions.Fraction:
    _primitive("Fraction", args, 0, 2, (int, str))
    if args and type(args[0]) is str and (len(args) > 1 or not _FRACTION.fullmatch(args[0])):
        raise _refuse("Fraction: a string must be 'numerator/denominator' (no exponent)")
    return fractions.Fraction(*args)


def _decimal(u: _Loader, args: tuple) -> decimal.Decimal:
    return decimal.Decimal(*_primitive("Decimal", args, 0, 1, (int, float, str, tuple)))


_CALLS: dict[Any, Callable[[_Loader, tuple], Any]] = {
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
    torch.Size: _size,
    torch.device: _device,
    np.dtype: _np_dtype,
}
_FACTORIES = frozenset(
    {int, float, complex, str, bytes, bool, list, dict, set, frozenset, tuple, collections.OrderedDict,
     collections.Counter, decimal.Decimal, fractions.Fraction}
)
#: Containers whose deallocation recurses in C without CPython's trashcan: never directly nested.
_UNSAFE_NESTING = (collections.deque, collections.defaultdict, np.ndarray)
_HANDLERS = {
    ("torch._utils", "_rebuild_parameter"): _parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _parameter,
    (_SERIALIZATION, "_rebuild_tensor"): _tensor,
}
for _np_mod in ("numpy.core", "numpy._core"):
    _HANDLERS[(f"{_np_mod}.numeric", "_frombuffer")] = _np_frombuffer
    _HANDLERS[(f"{_np_mod}.multiarray", "_reconstruct")] = _np_reconstruct
    _HANDLERS[(f"{_np_mod}.multiarray", "scalar")] = _np_scalar
_VALUES: dict[tuple[str, str], Any] = {
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
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
    ("numpy", "dtype"): np.dtype,
    ("numpy", "ndarray"): np.ndarray,
}
_VALUES.update({key: _Handler(".".join(key), fn) for key, fn in _HANDLERS.items()})


def _hashable_in(x: Any, table: Any) -> bool:
    try:
        return x in table
    except TypeError:
        return False


# ---- the interpreter ------------------------------------------------------------------------

_MARK = object()


class _Loader:
    """One run of the restricted pickle interpreter over ``data``."""

    def __init__(self, data: bytes, buffers: Optional[Any], extra: Sequence[tuple[str, str]]) -> None:
        self.data = data
        self.pos = 0
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.extra = frozenset(extra)
        views = [] if buffers is None else list(buffers)
        self.buffers: Iterator[Any] = iter(views)
        total = len(data) + sum(memoryview(b).nbytes for b in views)
        # Copies whose size the payload chooses are charged here: linear in what was sent.
        self.budget = 2 * total + 65536
        self.trusted_ids: dict[int, Any] = {}
        self.nesting: dict[int, tuple[int, Any]] = {}
        self.unsafe: dict[int, Any] = {}

    # -- bookkeeping used by the handlers
    def charge(self, n: int) -> None:
        self.budget -= n
        if self.budget < 0:
            raise _refuse(f"it asks for more memory than its {len(self.data)} bytes can describe")

    def trusted(self, obj: Any) -> bool:
        return id(obj) in self.trusted_ids and self.trusted_ids[id(obj)] is obj

    def track(self, obj: Any, items: Any) -> None:
        """Depth of a new tuple/frozenset (CPython hashes them recursively, with no depth check)."""
        depth = 0
        nesting = self.nesting
        for c in items:
            if type(c) is tuple or type(c) is frozenset:
                e = nesting.get(id(c))
                d = e[0] if e is not None and e[1] is c else 1
                if d > depth:
                    depth = d
        if depth:
            if depth >= MAX_NESTING:
                raise _refuse(f"tuples or frozensets nested deeper than {MAX_NESTING}")
            nesting[id(obj)] = (depth + 1, obj)

    def mark_unsafe(self, obj: Any) -> None:
        self.unsafe[id(obj)] = obj

    def check_unsafe_child(self, where: str, x: Any) -> None:
        if isinstance(x, _UNSAFE_NESTING) and self.unsafe.get(id(x)) is x:
            raise _refuse(f"a {type(x).__name__} directly inside a {where} (CPython frees such chains recursively)")

    # -- reading
    def read(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise _refuse(f"truncated: {n} bytes wanted at byte {self.pos}, {len(self.data) - self.pos} left")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def readline(self) -> bytes:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise _refuse(f"truncated: no end of line after byte {self.pos}")
        out = self.data[self.pos : end]
        self.pos = end + 1
        return out

    def unpack(self, fmt: str, n: int) -> int:
        return struct.unpack(fmt, self.read(n))[0]

    def pop_mark(self) -> list[Any]:
        if not self.metastack:
            raise _refuse("an opcode needs a MARK that is not there")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def top(self) -> Any:
        if not self.stack:
            raise _refuse("an opcode needs a value on an empty stack")
        return self.stack[-1]

    def pop(self) -> Any:
        if not self.stack:
            raise _refuse("an opcode needs a value on an empty stack")
        return self.stack.pop()

    # -- globals
    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if module == "builtins":
            if name in _SAFE_BUILTINS and hasattr(builtins, name):
                return getattr(builtins, name)
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        elif key in _VALUES:
            return _VALUES[key]
        elif key in self.extra or key in _SAFE:
            obj: Any = importlib.import_module(module)
            for part in name.split("."):
                if part.startswith("<"):
                    break
                obj = getattr(obj, part)
            else:
                self.trusted_ids[id(obj)] = obj
                return obj
        raise UnpicklingRefused(
            f"restricted unpickler refused global '{module}.{name}': it is not on the allow-list."
            f" If every sender is trusted to send it, call hwdist.register_safe_class('{module}.{name}')"
        )

    # -- calls and state
    def call(self, func: Any, args: Any) -> Any:
        if type(args) is not tuple:
            raise _refuse(f"REDUCE arguments must be a tuple, got {type(args).__name__}")
        if type(func) is _Handler:
            return func.fn(self, args)
        handler = _CALLS.get(func) if _hashable_in(func, _CALLS) else None
        if handler is not None:
            return handler(self, args)
        if self.trusted(func):
            return func(*args)
        raise _refuse(f"calling {_describe(func)} is not allowed")

    def new(self, cls: Any, args: Any, kwargs: Any) -> Any:
        if not isinstance(cls, type) or not self.trusted(cls):
            raise _refuse(f"creating {_describe(cls)} with NEWOBJ is not allowed (only registered classes)")
        if type(args) is not tuple or type(kwargs) is not dict:
            raise _refuse("NEWOBJ takes an argument tuple and a keyword dict")
        return cls.__new__(cls, *args, **kwargs)

    def build(self) -> None:
        state = self.pop()
        inst = self.top()
        if type(inst) is _Pending:
            if inst.done:
                raise _refuse("BUILD twice on one object")
            obj = inst.finish(self, state)
            inst.done = True
            self.stack[-1] = obj
            for key in inst.keys:
                if self.memo.get(key) is inst:
                    self.memo[key] = obj
            return
        if isinstance(inst, type):
            raise _refuse(f"BUILD on the class {_describe(inst)}: it would change the class for the whole process")
        if self.trusted(type(inst)):
            _set_state(inst, state)
        elif not (state is None or (type(state) is dict and not state)):
            raise _refuse(f"setting state on a {_describe(type(inst))} is not allowed (only on registered classes)")

    def memoize(self, key: int) -> None:
        value = self.top()
        self.memo[key] = value
        if type(value) is _Pending:
            value.keys.append(key)

    def load(self) -> Any:
        data = self.data
        end = len(data)
        dispatch = _DISPATCH
        try:
            while True:
                if self.pos >= end:
                    raise _refuse("truncated: no STOP opcode")
                op = data[self.pos]
                self.pos += 1
                if op == 0x2E:  # STOP
                    value = self.pop()
                    if type(value) is _Pending:
                        raise _refuse("an object is missing its state (BUILD)")
                    return value
                fn = dispatch.get(op)
                if fn is None:
                    raise _refuse(f"opcode {bytes([op])!r} at byte {self.pos - 1} is not accepted")
                fn(self)
        except UnpicklingRefused:
            raise
        except Exception as exc:  # the payload's data made a check or a constructor fail
            raise _refuse(f"at byte {self.pos - 1}: {type(exc).__name__}: {exc}") from None


def _describe(obj: Any) -> str:
    if isinstance(obj, (type, _Handler)) or callable(obj):
        module = getattr(obj, "__module__", None)
        name = getattr(obj, "__qualname__", None) or getattr(obj, "name", None) or repr(obj)
        return f"'{module}.{name}'" if module else f"'{name}'"
    return f"a {type(obj).__name__} value"


def _set_state(inst: Any, state: Any) -> None:
    """BUILD on an instance of a registered class: its ``__setstate__``, else pickle's default rules."""
    setstate = getattr(type(inst), "__setstate__", None)
    if setstate is not None:
        inst.__setstate__(state)
        return
    slots = None
    if type(state) is tuple and len(state) == 2:
        state, slots = state
    if state:
        if type(state) is not dict or not all(type(k) is str for k in state):
            raise _refuse("instance state must be a dict with str keys")
        inst.__dict__.update(state)
    if slots:
        if type(slots) is not dict or not all(type(k) is str and not k.startswith("__") for k in slots):
            raise _refuse("slot state must be a dict of attribute names")
        for k, v in slots.items():
            setattr(inst, k, v)


# ---- opcodes ------------------------------------------------------------------------------


def _push(value_fn: Callable[[_Loader], Any]) -> Callable[[_Loader], None]:
    return lambda u: u.stack.append(value_fn(u))


def _op_proto(u: _Loader) -> None:
    if u.read(1)[0] > 5:
        raise _refuse("unsupported pickle protocol")


def _op_frame(u: _Loader) -> None:
    if u.unpack("<Q", 8) > len(u.data) - u.pos:
        raise _refuse("a FRAME is longer than the payload")


def _op_int(u: _Loader) -> None:
    line = u.readline()
    u.stack.append(True if line == b"01" else False if line == b"00" else int(line))


def _op_long(u: _Loader) -> None:
    line = u.readline()
    u.stack.append(int(line[:-1] if line.endswith(b"L") else line))


def _op_long_n(fmt: str, n: int) -> Callable[[_Loader], None]:
    def op(u: _Loader) -> None:
        size = u.unpack(fmt, n)
        u.stack.append(int.from_bytes(u.read(size), "little", signed=True))

    return op


def _op_string(u: _Loader) -> None:
    line = u.readline()
    if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b"'", b'"'):
        raise _refuse("STRING argument is not quoted")
    u.stack.append(codecs.escape_decode(line[1:-1])[0].decode("ascii"))


def _op_counted(fmt: str, n: int, kind: Callable[[bytes], Any]) -> Callable[[_Loader], None]:
    def op(u: _Loader) -> None:
        size = u.unpack(fmt, n) if fmt else u.read(1)[0]
        u.stack.append(kind(u.read(size)))  # read() checks the length before anything is allocated

    return op


def _utf8(b: bytes) -> str:
    return str(b, "utf-8", "surrogatepass")


def _op_next_buffer(u: _Loader) -> None:
    try:
        u.stack.append(next(u.buffers))
    except StopIteration:
        raise _refuse("NEXT_BUFFER with no out-of-band buffer left") from None


def _op_readonly(u: _Loader) -> None:
    u.stack[-1] = memoryview(_byte_view("READONLY_BUFFER", u.top())).toreadonly()


def _tuple_of(items: list[Any], u: _Loader) -> tuple:
    out = tuple(items)
    u.track(out, out)
    return out


def _op_tuple(u: _Loader) -> None:
    out = _tuple_of(u.pop_mark(), u)  # pop_mark() replaces u.stack
    u.stack.append(out)


def _op_tuple_n(n: int) -> Callable[[_Loader], None]:
    def op(u: _Loader) -> None:
        if len(u.stack) < n:
            raise _refuse(f"TUPLE{n} needs {n} values on the stack")
        items = u.stack[-n:]
        del u.stack[-n:]
        u.stack.append(_tuple_of(items, u))

    return op


def _op_list(u: _Loader) -> None:
    items = u.pop_mark()
    u.stack.append(items)


def _op_dict(u: _Loader) -> None:
    items = u.pop_mark()
    if len(items) % 2:
        raise _refuse("DICT needs key/value pairs")
    u.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})


def _op_frozenset(u: _Loader) -> None:
    out = frozenset(u.pop_mark())
    u.track(out, out)
    u.stack.append(out)


def _extend(u: _Loader, items: list[Any]) -> None:
    target = u.top()
    if type(target) is list:
        target.extend(items)
    elif u.trusted(type(target)):
        extend = getattr(target, "extend", None)
        if extend is not None:
            extend(items)
        else:
            for x in items:
                target.append(x)
    else:
        raise _refuse(f"APPEND to {_describe(target)} is not allowed")


def _op_append(u: _Loader) -> None:
    value = u.pop()
    _extend(u, [value])


def _op_appends(u: _Loader) -> None:
    items = u.pop_mark()
    _extend(u, items)


def _set_items(u: _Loader, items: list[Any]) -> None:
    if len(items) % 2:
        raise _refuse("SETITEMS needs key/value pairs")
    target = u.top()
    kind = type(target)
    if kind is dict or kind is collections.OrderedDict or kind is collections.Counter:
        pass
    elif kind is collections.defaultdict:
        for v in items[1::2]:
            u.check_unsafe_child("defaultdict", v)
    elif not u.trusted(kind) or isinstance(target, type):
        raise _refuse(f"setting items on {_describe(target)} is not allowed")
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]


def _op_setitem(u: _Loader) -> None:
    value = u.pop()
    key = u.pop()
    _set_items(u, [key, value])


def _op_setitems(u: _Loader) -> None:
    _set_items(u, u.pop_mark())


def _op_additems(u: _Loader) -> None:
    items = u.pop_mark()
    target = u.top()
    if type(target) is set:
        target.update(items)
    elif u.trusted(type(target)):
        for x in items:
            target.add(x)
    else:
        raise _refuse(f"ADDITEMS to {_describe(target)} is not allowed")


def _op_pop(u: _Loader) -> None:
    if u.stack:
        u.stack.pop()
    else:
        u.pop_mark()


def _op_mark(u: _Loader) -> None:
    u.metastack.append(u.stack)
    u.stack = []


def _op_get(read_key: Callable[[_Loader], int]) -> Callable[[_Loader], None]:
    def op(u: _Loader) -> None:
        key = read_key(u)
        if key not in u.memo:
            raise _refuse(f"memo entry {key} was never stored")
        u.stack.append(u.memo[key])

    return op


def _op_put(read_key: Callable[[_Loader], int]) -> Callable[[_Loader], None]:
    def op(u: _Loader) -> None:
        key = read_key(u)
        if key < 0:
            raise _refuse("negative memo key")
        u.memoize(key)

    return op


def _op_global(u: _Loader) -> None:
    module = u.readline().decode("utf-8")
    name = u.readline().decode("utf-8")
    u.stack.append(u.find_class(module, name))


def _op_stack_global(u: _Loader) -> None:
    name = u.pop()
    module = u.pop()
    if type(module) is not str or type(name) is not str:
        raise _refuse("STACK_GLOBAL needs two strings")
    u.stack.append(u.find_class(module, name))


def _op_reduce(u: _Loader) -> None:
    args = u.pop()
    u.stack[-1] = u.call(u.top(), args)


def _op_newobj(u: _Loader) -> None:
    args = u.pop()
    cls = u.pop()
    u.stack.append(u.new(cls, args, {}))


def _op_newobj_ex(u: _Loader) -> None:
    kwargs = u.pop()
    args = u.pop()
    cls = u.pop()
    u.stack.append(u.new(cls, args, kwargs))


def _refused_op(what: str) -> Callable[[_Loader], None]:
    def op(u: _Loader) -> None:
        raise _refuse(f"{what} is not accepted")

    return op


def _line_int(u: _Loader) -> int:
    return int(u.readline())


_DISPATCH: dict[int, Callable[[_Loader], None]] = {
    ord(k): v
    for k, v in {
        "\x80": _op_proto,
        "\x95": _op_frame,
        "N": _push(lambda u: None),
        "\x88": _push(lambda u: True),
        "\x89": _push(lambda u: False),
        "I": _op_int,
        "J": _push(lambda u: u.unpack("<i", 4)),
        "K": _push(lambda u: u.read(1)[0]),
        "M": _push(lambda u: u.unpack("<H", 2)),
        "L": _op_long,
        "\x8a": _op_long_n("<B", 1),
        "\x8b": _op_long_n("<I", 4),
        "F": _push(lambda u: float(u.readline())),
        "G": _push(lambda u: u.unpack(">d", 8)),
        "S": _op_string,
        "T": _op_counted("<I", 4, lambda b: b.decode("ascii")),
        "U": _op_counted("", 1, lambda b: b.decode("ascii")),
        "B": _op_counted("<I", 4, bytes),
        "C": _op_counted("", 1, bytes),
        "\x8e": _op_counted("<Q", 8, bytes),
        "\x96": _op_counted("<Q", 8, bytearray),
        "V": _push(lambda u: u.readline().decode("raw-unicode-escape")),
        "X": _op_counted("<I", 4, _utf8),
        "\x8c": _op_counted("", 1, _utf8),
        "\x8d": _op_counted("<Q", 8, _utf8),
        "\x97": _op_next_buffer,
        "\x98": _op_readonly,
        ")": _push(lambda u: ()),
        "t": _op_tuple,
        "\x85": _op_tuple_n(1),
        "\x86": _op_tuple_n(2),
        "\x87": _op_tuple_n(3),
        "]": _push(lambda u: []),
        "l": _op_list,
        "}": _push(lambda u: {}),
        "d": _op_dict,
        "\x8f": _push(lambda u: set()),
        "\x91": _op_frozenset,
        "a": _op_append,
        "e": _op_appends,
        "s": _op_setitem,
        "u": _op_setitems,
        "\x90": _op_additems,
        "0": _op_pop,
        "1": lambda u: u.pop_mark().clear(),
        "2": lambda u: u.stack.append(u.top()),
        "(": _op_mark,
        "g": _op_get(_line_int),
        "h": _op_get(lambda u: u.read(1)[0]),
        "j": _op_get(lambda u: u.unpack("<I", 4)),
        "p": _op_put(_line_int),
        "q": _op_put(lambda u: u.read(1)[0]),
        "r": _op_put(lambda u: u.unpack("<I", 4)),
        "\x94": lambda u: u.memoize(len(u.memo)),
        "c": _op_global,
        "\x93": _op_stack_global,
        "R": _op_reduce,
        "\x81": _op_newobj,
        "\x92": _op_newobj_ex,
        "b": lambda u: u.build(),
        "P": _refused_op("a persistent id (PERSID)"),
        "Q": _refused_op("a persistent id (BINPERSID)"),
        "\x82": _refused_op("the extension registry (EXT1)"),
        "\x83": _refused_op("the extension registry (EXT2)"),
        "\x84": _refused_op("the extension registry (EXT4)"),
        "i": _refused_op("INST (calls a class named in the payload)"),
        "o": _refused_op("OBJ (calls a class from the stack)"),
    }.items()
}


# ---- public entry points ------------------------------------------------------------------


class RestrictedUnpickler:
    """Reads pickle data with only allow-listed globals, through hwdist's own checked handlers.

    Not a :class:`pickle.Unpickler`: it interprets the opcodes itself (see
    ``docs/objects.md`` for what it accepts).

    Args:
        file: a binary file-like object holding the pickle stream.
        buffers: out-of-band buffers (pickle protocol 5).
        extra: more ``(module, name)`` pairs allowed for this unpickler only.

    Example:
        >>> hwdist.RestrictedUnpickler(io.BytesIO(pickle.dumps([1, "a"]))).load()
        [1, 'a']
    """

    def __init__(self, file: Any, *, buffers: Optional[Any] = None, extra: Sequence[tuple[str, str]] = ()) -> None:
        self._file = file
        self._buffers = buffers
        self._extra = tuple(extra)

    def find_class(self, module: str, name: str) -> Any:
        """What ``module.name`` resolves to, or :class:`UnpicklingRefused` when it is not allowed."""
        return _Loader(b"", None, self._extra).find_class(module, name)

    def load(self) -> Any:
        """The object in the stream; :class:`UnpicklingRefused` for anything not accepted."""
        return _Loader(bytes(self._file.read()), self._buffers, self._extra).load()


def restricted_loads(data: Any, buffers: Optional[Any] = None, extra: Sequence[tuple[str, str]] = ()) -> Any:
    """``pickle.loads`` through the restricted unpickler (:class:`RestrictedUnpickler`).

    Example:
        >>> hwdist.restricted_loads(pickle.dumps({"a": np.arange(3)}))
        {'a': array([0, 1, 2])}
    """
    return _Loader(bytes(data), buffers, extra).load()
