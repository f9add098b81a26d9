"""The opcodes of the restricted unpickler (pickle protocols 0 to 5), one small function each.

Every length is checked against the bytes left before anything is allocated; opcodes that call or
look up something outside the payload (persistent ids, the extension registry, INST/OBJ) are refused.
"""

from __future__ import annotations

import codecs
import collections
import struct
from typing import TYPE_CHECKING, Any, Callable, Optional

from .checks import Pending, byte_view, describe, refuse

if TYPE_CHECKING:
    from .loader import Loader


def _push(value_fn: Callable[[Loader], Any]) -> Callable[[Loader], None]:
    return lambda u: u.stack.append(value_fn(u))


def _op_proto(u: Loader) -> None:
    if u.read(1)[0] > 5:
        raise refuse("unsupported pickle protocol")


def _op_frame(u: Loader) -> None:
    if u.unpack("<Q", 8) > len(u.data) - u.pos:
        raise refuse("a FRAME is longer than the payload")


def _op_int(u: Loader) -> None:
    line = u.readline()
    u.stack.append(True if line == b"01" else False if line == b"00" else int(line))


def _op_string(u: Loader) -> None:
    line = u.readline()
    if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b"'", b'"'):
        raise refuse("STRING argument is not quoted")
    u.stack.append(codecs.escape_decode(line[1:-1])[0].decode("ascii"))


def _op_arg(fmt: str, kind: Optional[Callable[[bytes], Any]] = None) -> Callable[[Loader], None]:
    """A fixed-size argument pushed as it is (ints, floats), or with ``kind`` the length of the
    ``kind`` value that follows (strings, bytes); hot, so read() is inlined."""
    st = struct.Struct(fmt)
    n, unpack = st.size, st.unpack_from

    def op(u: Loader) -> None:
        data, pos = u.data, u.pos
        if pos + n > len(data):
            u.read(n)  # raises: truncated
        value = unpack(data, pos)[0]
        pos += n
        u.pos = pos
        if kind is not None:
            end = pos + value
            if end > len(data):  # checked before anything is allocated
                raise refuse(f"truncated: {value} bytes wanted at byte {pos}, {len(data) - pos} left")
            u.pos = end  # before kind(): a decoding error names the byte after the argument
            value = kind(data[pos:end])
        u.stack.append(value)

    return op


def _utf8(b: bytes) -> str:
    return str(b, "utf-8", "surrogatepass")


def _op_next_buffer(u: Loader) -> None:
    try:
        u.stack.append(next(u.buffers))
    except StopIteration:
        raise refuse("NEXT_BUFFER with no out-of-band buffer left") from None


def _op_readonly(u: Loader) -> None:
    u.stack[-1] = memoryview(byte_view("READONLY_BUFFER", u.top())).toreadonly()


def _op_dict(u: Loader) -> None:
    items = u.pop_mark()
    if len(items) % 2:
        raise refuse("DICT needs key/value pairs")
    u.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})


def _extend(u: Loader, items: list[Any]) -> None:
    target = u.top()
    if type(target) is list:
        target.extend(items)
    elif type(target) is collections.deque:  # deque's reduce sends its items this way
        u.check_unsafe_children("deque", items)
        target.extend(items)
    elif u.trusted(type(target)):
        extend = getattr(target, "extend", None)
        if extend is not None:
            extend(items)
        else:
            for x in items:
                target.append(x)
    else:
        raise refuse(f"APPEND to {describe(target)} is not allowed")


def _set_items(u: Loader, items: list[Any]) -> None:
    if len(items) % 2:
        raise refuse("SETITEMS needs key/value pairs")
    target = u.top()
    kind = type(target)
    if kind is dict or kind is collections.OrderedDict or kind is collections.Counter:
        pass
    elif kind is collections.defaultdict:
        u.check_unsafe_children("defaultdict", items[1::2])
    elif not u.trusted(kind) or isinstance(target, type):
        raise refuse(f"setting items on {describe(target)} is not allowed")
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]


def _op_additems(u: Loader) -> None:
    items = u.pop_mark()
    target = u.top()
    if type(target) is set:
        target.update(items)
    elif u.trusted(type(target)):
        for x in items:
            target.add(x)
    else:
        raise refuse(f"ADDITEMS to {describe(target)} is not allowed")


def _op_pop(u: Loader) -> None:
    if len(u.stack) > u.base:  # a value above the innermost MARK, else that MARK
        u.stack.pop()
    else:
        u.pop_mark()


def _op_dup(u: Loader) -> None:
    value = u.top()
    if type(value) is Pending:
        raise refuse("DUP of an object before its BUILD is not accepted")
    u.stack.append(value)


def _op_get(read_key: Callable[[Loader], int]) -> Callable[[Loader], None]:
    def op(u: Loader) -> None:
        value = u.memo_get(read_key(u))
        if type(value) is Pending and not value.done:
            raise refuse(
                "an object refers to itself before it is built (e.g. a numpy object array that contains"
                " itself); such cycles are not accepted"
            )
        u.stack.append(value)

    return op


def _op_put(read_key: Callable[[Loader], int]) -> Callable[[Loader], None]:
    def op(u: Loader) -> None:
        key = read_key(u)
        if key < 0:
            raise refuse("negative memo key")
        u.memoize(key)

    return op


def _op_stack_global(u: Loader) -> None:
    module, name = u.pop_n(2)
    if type(module) is not str or type(name) is not str:
        raise refuse("STACK_GLOBAL needs two strings")
    u.stack.append(u.find_class(module, name))


def _op_reduce(u: Loader) -> None:
    args = u.pop()
    u.stack[-1] = u.call(u.top(), args)


def _refused_op(what: str) -> Callable[[Loader], None]:
    def op(u: Loader) -> None:
        raise refuse(f"{what} is not accepted")

    return op


DISPATCH: dict[int, Callable[[Loader], None]] = {
    ord(k): v
    for k, v in {
        "\x80": _op_proto,
        "\x95": _op_frame,
        "N": _push(lambda u: None),
        "\x88": _push(lambda u: True),
        "\x89": _push(lambda u: False),
        "I": _op_int,
        "J": _op_arg("<i"),
        "K": _op_arg("<B"),
        "M": _op_arg("<H"),
        "L": _push(lambda u: int(u.readline().removesuffix(b"L"))),
        "\x8a": _push(lambda u: int.from_bytes(u.read(u.unpack("<B", 1)), "little", signed=True)),
        "\x8b": _push(lambda u: int.from_bytes(u.read(u.unpack("<I", 4)), "little", signed=True)),
        "F": _push(lambda u: float(u.readline())),
        "G": _op_arg(">d"),
        "S": _op_string,
        "T": _op_arg("<I", lambda b: b.decode("ascii")),
        "U": _op_arg("<B", lambda b: b.decode("ascii")),
        "B": _op_arg("<I", bytes),
        "C": _op_arg("<B", bytes),
        "\x8e": _op_arg("<Q", bytes),
        "\x96": _op_arg("<Q", bytearray),
        "V": _push(lambda u: codecs.raw_unicode_escape_decode(u.readline())[0]),  # no codec lookup
        "X": _op_arg("<I", _utf8),
        "\x8c": _op_arg("<B", _utf8),
        "\x8d": _op_arg("<Q", _utf8),
        "\x97": _op_next_buffer,
        "\x98": _op_readonly,
        ")": _push(lambda u: ()),
        "t": _push(lambda u: u.track(tuple(u.pop_mark()))),
        "\x85": _push(lambda u: u.track(tuple(u.pop_n(1)))),
        "\x86": _push(lambda u: u.track(tuple(u.pop_n(2)))),
        "\x87": _push(lambda u: u.track(tuple(u.pop_n(3)))),
        "]": _push(lambda u: []),
        "l": _push(lambda u: u.pop_mark()),
        "}": _push(lambda u: {}),
        "d": _op_dict,
        "\x8f": _push(lambda u: set()),
        "\x91": _push(lambda u: u.track(frozenset(u.pop_mark()))),
        "a": lambda u: _extend(u, [u.pop()]),
        "e": lambda u: _extend(u, u.pop_mark()),
        "s": lambda u: _set_items(u, u.pop_n(2)),
        "u": lambda u: _set_items(u, u.pop_mark()),
        "\x90": _op_additems,
        "0": _op_pop,
        "1": lambda u: u.pop_mark().clear(),
        "2": _op_dup,
        "(": lambda u: u.mark(),
        "g": _op_get(lambda u: int(u.readline())),
        "h": _op_get(lambda u: u.read(1)[0]),
        "j": _op_get(lambda u: u.unpack("<I", 4)),
        "p": _op_put(lambda u: int(u.readline())),
        "q": _op_put(lambda u: u.read(1)[0]),
        "r": _op_put(lambda u: u.unpack("<I", 4)),
        "\x94": lambda u: u.memoize(len(u.memo) + len(u.memo_sparse)),
        "c": _push(lambda u: u.find_class(u.readline().decode("utf-8"), u.readline().decode("utf-8"))),
        "\x93": _op_stack_global,
        "R": _op_reduce,
        "\x81": _push(lambda u: u.new(*[*u.pop_n(2), {}])),  # no keywords
        "\x92": _push(lambda u: u.new(*u.pop_n(3))),
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
