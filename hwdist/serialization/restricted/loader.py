"""The restricted unpickler: hwdist's own pickle interpreter for payloads from peers it does not trust.

An allow-list on top of Python's unpickler (``find_class``) is not enough: numpy's reconstructors
trust their arguments, BUILD can ``setattr`` on a class, ``bytearray(n)`` allocates what the
payload asks for. This module reads the opcodes itself; what it accepts, the trust model and the
refusals ([`UnpicklingRefused`][hwdist.errors.UnpicklingRefused]) are in ``docs/objects.md`` and
``docs/reliability.md``.
"""

from __future__ import annotations

import builtins
import collections
import importlib
import pickletools
import struct
import threading
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union, cast

import torch

from ... import _compat
from ...errors import UnpicklingRefused
from .checks import CALLS, MAX_NESTING, UNSAFE_NESTING, VALUES, Handler, Pending, describe, hashable_in
from .checks import refuse
from .opcodes import DISPATCH

__all__ = [
    "UnpicklingRefused",
    "RestrictedUnpickler",
    "register_safe_class",
    "safe_globals",
    "restricted_loads",
    "torch_safe_pairs",
]

# ---- the allow-list -------------------------------------------------------------------

#: The builtins a payload may name (types and constants; their calls go through the handlers).
_SAFE_BUILTINS = frozenset(
    "bool bytearray bytes complex dict float frozenset int list range set slice str tuple"
    " NoneType Ellipsis NotImplemented".split()
)
#: The ``(module, name)`` pairs allowed: hwdist's handled globals, then what ``register_safe_class`` adds.
SAFE: set[tuple[str, str]] = set(VALUES)
_SAFE_LOCK = threading.Lock()
# Read from the module dict: getattr(torch, name) would import torch's lazy submodules.
_TORCH_DTYPE_NAMES = {k: v for k, v in vars(torch).items() if isinstance(v, torch.dtype)}


def register_safe_class(*classes: Union[type, Callable[..., Any], str]) -> None:
    """Allow classes (or functions, or ``'module.QualName'`` strings) in the restricted unpickler.

    Only register what cannot run code you do not want when unpickled: the class's ``__new__``,
    ``__init__`` (when a payload calls it), ``__setstate__`` and the state a payload sets on its
    instances are trusted. Names hwdist already handles (numpy, torch, standard types) keep its checks.

    Examples:
        >>> @dataclasses.dataclass
        ... class Box:
        ...     x: int
        >>> hwdist.serialization.register_safe_class(Box)   # on every rank that receives a Box
    """
    pairs = [pair("register_safe_class", item) for item in classes]
    with _SAFE_LOCK:
        SAFE.update(pairs)


def pair(where: str, item: Union[type, Callable[..., Any], str]) -> tuple[str, str]:
    if isinstance(item, str):
        module, _, name = item.rpartition(".")
        if not module or not name:
            raise ValueError(f"{where}: expected 'module.QualName', got {item!r}")
        return module, name
    owner = getattr(item, "__module__", None)
    qualname = getattr(item, "__qualname__", None)
    if not isinstance(owner, str) or not isinstance(qualname, str) or not owner or not qualname:
        raise TypeError(
            f"{where}: expected a class, function or 'module.QualName' string,"
            f" got {type(item).__name__}: {item!r}"
        )
    return owner, qualname


def safe_globals() -> frozenset[tuple[str, str]]:
    """The ``(module, name)`` pairs the restricted unpickler accepts (besides builtins and torch dtypes)."""
    with _SAFE_LOCK:
        return frozenset(SAFE)


def torch_safe_pairs() -> tuple[tuple[str, str], ...]:
    """``(module, name)`` of every type torch's ``add_safe_globals`` / ``safe_globals`` allow now."""
    out = []
    for entry in _compat.torch_safe_globals():
        named = isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str)
        try:
            out.append(pair("add_safe_globals", entry[1] if named else entry))  # (obj, "module.Name") too
        except (TypeError, ValueError):  # an entry without a name: no payload can name it either
            pass
    return tuple(out)


class Loader:
    """One run of the restricted pickle interpreter over ``data``."""

    def __init__(self, data: bytes, buffers: Optional[Any], extra: Sequence[tuple[str, str]]) -> None:
        self.data = data
        self.pos = 0
        self.stack: list[Any] = []
        # MARKs are stack positions and the memo a list: 8 bytes per MEMOIZE or MARK opcode, no more.
        self.marks: list[int] = []
        self.base = 0  # the position of the innermost MARK (values below it are not the opcode's)
        self.memo: list[Any] = []
        self.memo_sparse: dict[int, Any] = {}  # PUT keys beyond the dense list
        self.pendings: list[Pending] = []
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
            raise refuse(f"it asks for more memory than its {len(self.data)} bytes can describe")

    def trusted(self, obj: Any) -> bool:
        return id(obj) in self.trusted_ids and self.trusted_ids[id(obj)] is obj

    def track(self, obj: Any) -> Any:
        """``obj``, a new tuple or frozenset, whose depth is kept (CPython hashes them recursively)."""
        depth = 0
        nesting = self.nesting
        for c in obj:
            if type(c) is tuple or type(c) is frozenset:
                e = nesting.get(id(c))
                d = e[0] if e is not None and e[1] is c else 1
                if d > depth:
                    depth = d
        if depth:
            if depth >= MAX_NESTING:
                raise refuse(f"tuples or frozensets nested deeper than {MAX_NESTING}")
            nesting[id(obj)] = (depth + 1, obj)
        return obj

    def mark_unsafe(self, obj: Any) -> None:
        self.unsafe[id(obj)] = obj

    def check_unsafe_children(self, where: str, items: Iterable[Any]) -> None:
        for x in items:
            if isinstance(x, UNSAFE_NESTING) and self.unsafe.get(id(x)) is x:
                raise refuse(
                    f"a {type(x).__name__} directly inside a {where} (CPython frees such chains recursively)"
                )

    # -- reading
    def read(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise refuse(f"truncated: {n} bytes wanted at byte {self.pos}, {len(self.data) - self.pos} left")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def readline(self) -> bytes:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise refuse(f"truncated: no end of line after byte {self.pos}")
        out = self.data[self.pos : end]
        self.pos = end + 1
        return out

    def unpack(self, fmt: str, n: int) -> int:
        return struct.unpack(fmt, self.read(n))[0]

    def mark(self) -> None:
        self.base = len(self.stack)
        self.marks.append(self.base)

    def pop_mark(self) -> list[Any]:
        """The values above the innermost MARK (removed from the stack), and that MARK."""
        if not self.marks:
            raise refuse("an opcode needs a MARK that is not there")
        k = self.marks.pop()
        items = self.stack[k:]
        del self.stack[k:]
        self.base = self.marks[-1] if self.marks else 0
        return items

    def pop_n(self, n: int) -> list[Any]:
        """The top ``n`` values (removed from the stack), in stack order."""
        if len(self.stack) - self.base < n:
            raise refuse(f"an opcode needs {n} values on the stack")
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def top(self) -> Any:
        if len(self.stack) <= self.base:
            raise refuse("an opcode needs a value on an empty stack")
        return self.stack[-1]

    def pop(self) -> Any:
        if len(self.stack) <= self.base:
            raise refuse("an opcode needs a value on an empty stack")
        return self.stack.pop()

    # -- globals
    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if module == "builtins":
            if name in _SAFE_BUILTINS and hasattr(builtins, name):
                return getattr(builtins, name)
        elif module == "torch" and name in _TORCH_DTYPE_NAMES:
            return _TORCH_DTYPE_NAMES[name]
        elif key in VALUES:
            return VALUES[key]
        elif key in self.extra or key in SAFE:
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
            f" If every sender is trusted to send it, call"
            f" hwdist.serialization.register_safe_class('{module}.{name}')"
        )

    # -- calls and state
    def call(self, func: Any, args: Any) -> Any:
        if type(args) is not tuple:
            raise refuse(f"REDUCE arguments must be a tuple, got {type(args).__name__}")
        handler = func.fn if type(func) is Handler else CALLS.get(func) if hashable_in(func, CALLS) else None
        if handler is not None:
            out = handler(self, args)
            if type(out) is Pending:  # finished by its BUILD; one left unfinished at STOP is refused
                self.pendings.append(out)
            return out
        if self.trusted(func):
            return func(*args)
        raise refuse(f"calling {describe(func)} is not allowed")

    def new(self, cls: Any, args: Any, kwargs: Any) -> Any:
        if not isinstance(cls, type) or not self.trusted(cls):
            raise refuse(f"creating {describe(cls)} with NEWOBJ is not allowed (only registered classes)")
        if type(args) is not tuple or type(kwargs) is not dict:
            raise refuse("NEWOBJ takes an argument tuple and a keyword dict")
        return cls.__new__(cls, *args, **kwargs)

    def build(self) -> None:
        state = self.pop()
        inst = self.top()
        if type(inst) is Pending:
            if inst.done:
                raise refuse("BUILD twice on one object")
            obj = inst.finish(self, state)
            inst.done = True
            self.stack[-1] = obj
            for key in inst.keys:
                if self.memo_get(key) is inst:
                    self.memo_put(key, obj)
            return
        if isinstance(inst, type):
            raise refuse(
                f"BUILD on the class {describe(inst)}: it would change the class for the whole process"
            )
        if self.trusted(type(inst)):
            _set_state(inst, state)
        elif type(inst) is collections.OrderedDict and state:
            # nn.Module.state_dict() carries its ``_metadata`` this way (torch's loader accepts it too)
            if type(state) is not dict or not all(type(k) is str for k in state):
                raise refuse("the state of an OrderedDict must be a dict with str keys")
            inst.__dict__.update(state)
        elif not (state is None or (type(state) is dict and not state)):
            raise refuse(
                f"setting state on a {describe(type(inst))} is not allowed (only on registered classes)"
            )

    def memo_put(self, key: int, value: Any) -> None:
        memo = self.memo
        if key < len(memo):
            memo[key] = value
        elif key == len(memo) and key not in self.memo_sparse:
            memo.append(value)
        else:
            self.memo_sparse[key] = value

    def memo_get(self, key: int) -> Any:
        if key < len(self.memo):
            return self.memo[key]
        if key in self.memo_sparse:
            return self.memo_sparse[key]
        raise refuse(f"memo entry {key} was never stored")

    def memoize(self, key: int) -> None:
        value = self.top()
        self.memo_put(key, value)
        if type(value) is Pending:
            value.keys.append(key)

    def load(self) -> Any:
        data, end, dispatch = self.data, len(self.data), DISPATCH
        try:
            while True:
                if self.pos >= end:
                    raise refuse("truncated: no STOP opcode")
                op = data[self.pos]
                self.pos += 1
                if op == 0x2E:  # STOP
                    value = self.pop()
                    if type(value) is Pending or any(not p.done for p in self.pendings):
                        raise refuse("an object is missing its state (BUILD)")
                    return value
                fn = dispatch.get(op)
                if fn is None:
                    raise refuse(f"opcode {bytes([op])!r} at byte {self.pos - 1} is not accepted")
                fn(self)
        except UnpicklingRefused:
            raise
        except Exception as exc:  # the payload's data made a check or a constructor fail
            raise refuse(f"at byte {self.pos - 1}: {type(exc).__name__}: {exc}") from None


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
            raise refuse("instance state must be a dict with str keys")
        inst.__dict__.update(state)
    if slots:
        if type(slots) is not dict or not all(type(k) is str and not k.startswith("__") for k in slots):
            raise refuse("slot state must be a dict of attribute names")
        for k, v in slots.items():
            setattr(inst, k, v)


# ---- one pickle from a stream that cannot seek ------------------------------------------------

#: Reads of a length the stream gives are made in pieces of at most this size (bounded by real data).
_CHUNK = 1 << 20


class _Recorder:
    """A stream that cannot seek, as ``genops`` reads it, plus the unread rest of the current FRAME;
    keeps what it read."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.frame = b""
        self.pos = 0
        self.got = bytearray()

    def _from_file(self, n: int) -> bytes:
        parts = []
        while n > 0:
            chunk = self.file.read(min(n, _CHUNK))
            if not chunk:  # end of the stream (or None: nothing there without blocking)
                break
            parts.append(bytes(chunk))
            n -= len(chunk)
        return b"".join(parts)

    def read(self, n: int) -> bytes:
        out = self.frame[self.pos : self.pos + n]
        self.pos += len(out)
        if len(out) < n:
            out += self._from_file(n - len(out))
        self.got += out
        return out

    def readline(self) -> bytes:
        end = self.frame.find(b"\n", self.pos)
        out = self.frame[self.pos : len(self.frame) if end < 0 else end + 1]
        self.pos += len(out)
        if not out.endswith(b"\n"):
            out += self._line_from_file()
        self.got += out
        return out

    def _line_from_file(self) -> bytes:
        readline = getattr(self.file, "readline", None)
        if readline is not None:  # io's readline never reads past the newline
            return bytes(readline())
        parts = []
        while True:
            b = self._from_file(1)
            parts.append(b)
            if not b or b == b"\n":
                return b"".join(parts)

    def start_frame(self, n: int) -> None:
        self.frame = self.frame[self.pos :] + self._from_file(n)
        self.pos = 0


def _read_pickle(file: Any) -> bytes:
    """The bytes of the next pickle in ``file``, up to and including its STOP; what follows stays unread.

    ``pickletools.genops`` walks the opcodes through a ``_Recorder``; nothing is built. A stream
    that ends early, or an unknown opcode, ends the bytes there (the interpreter then refuses them).

    Raises:
        EOFError: the stream is at its end (nothing left to read), as ``pickle.Unpickler`` raises.
    """
    src = _Recorder(file)
    try:
        for op, arg, _ in pickletools.genops(cast(Any, src)):
            if op.name == "FRAME":
                src.start_frame(int(cast(int, arg)))
    except ValueError:  # truncated, an unknown opcode or a malformed argument: the bytes read so far
        pass
    if not src.got:
        raise EOFError("Ran out of input")
    return bytes(src.got)


class RestrictedUnpickler:
    """Reads pickle data with only allow-listed globals, through hwdist's own checked handlers.

    Not a `pickle.Unpickler`: it interprets the opcodes itself (what it accepts: ``docs/objects.md``).

    Args:
        file: a binary file-like object holding the pickle stream.
        buffers: out-of-band buffers (pickle protocol 5).
        extra: more ``(module, name)`` pairs allowed for this unpickler only.

    Examples:
        >>> hwdist.serialization.RestrictedUnpickler(io.BytesIO(pickle.dumps([1, "a"]))).load()
        [1, 'a']
    """

    def __init__(
        self, file: Any, *, buffers: Optional[Any] = None, extra: Sequence[tuple[str, str]] = ()
    ) -> None:
        self._file = file
        self._buffers = buffers
        self._extra = tuple(extra)

    def find_class(self, module: str, name: str) -> Any:
        """What ``module.name`` resolves to.

        Raises:
            UnpicklingRefused: it is not allowed.
        """
        return Loader(b"", None, self._extra).find_class(module, name)

    def load(self) -> Any:
        """The next object in the stream; like ``pickle.Unpickler.load``, it stops at the object's STOP.

        The file is left just after that STOP, so the next ``load`` or ``pickle`` reads the next
        pickle in it (from a seekable file or a stream that cannot seek: ``docs/objects.md``).

        Raises:
            UnpicklingRefused: for anything not accepted.
            EOFError: nothing is left to read.
        """
        file = self._file
        try:
            start: Optional[int] = file.tell() if file.seekable() else None
        except (AttributeError, OSError, ValueError):
            start = None
        if start is None:
            data = _read_pickle(file)
        else:
            data = bytes(file.read())
            if not data:
                raise EOFError("Ran out of input")
        loader = Loader(data, self._buffers, self._extra)
        value = loader.load()
        if start is not None:
            file.seek(start + loader.pos)
        return value


def restricted_loads(data: Any, buffers: Optional[Any] = None, extra: Sequence[tuple[str, str]] = ()) -> Any:
    """``pickle.loads`` through the restricted unpickler.

    See [`RestrictedUnpickler`][hwdist.serialization.restricted.loader.RestrictedUnpickler].

    Examples:
        >>> hwdist.serialization.restricted_loads(pickle.dumps({"a": np.arange(3)}))
        {'a': array([0, 1, 2])}
    """
    return Loader(bytes(data), buffers, extra).load()
