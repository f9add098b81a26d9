"""Fuzzes the restricted unpickler in this (child) process.

Run as ``python -m tests.programs.restricted_fuzz MARKER SECONDS CURRENT``.

hypothesis generates two kinds of payloads: valid pickles (legit objects,
hwdist frames' streams, the hostile payloads of restricted_probe.py) with a
few mutations (bit flips, opcode bytes, inserted/deleted/duplicated/spliced
slices, lengths and memo keys set to extreme values), and random sequences
of opcodes with well-formed arguments (globals drawn from allowed and
forbidden names). Each payload is loaded here; the checks after each one:
the only exception is ``UnpicklingRefused``, no marker file appeared (no code
ran), no watched global changed, and the load's peak Python memory stayed
under a bound. The payload being loaded is written to CURRENT first, so a
crash of this process names it. Runs of a few hundred examples repeat until
SECONDS have passed; the exit status is 0 when no check failed.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import time
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwdist import serialization as ser
from tests.programs.restricted_probe import attacks, diff, legit_objects, legit_torch_kinds, load_one
from tests.programs.restricted_probe import snapshot, touch, warm_up

PEAK_LIMIT = 32 << 20
_EXTREMES = [
    0,
    1,
    2,
    0x7F,
    0x80,
    0xFF,
    0x7FFF,
    0xFFFF,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**62,
    2**63 - 1,
    2**64 - 1,
]
_GLOBALS = [
    ("builtins", "bytearray"),
    ("builtins", "bytes"),
    ("builtins", "list"),
    ("builtins", "dict"),
    ("builtins", "set"),
    ("builtins", "tuple"),
    ("builtins", "frozenset"),
    ("builtins", "range"),
    ("builtins", "slice"),
    ("builtins", "int"),
    ("builtins", "str"),
    ("builtins", "complex"),
    ("builtins", "float"),
    ("builtins", "bool"),
    ("builtins", "eval"),
    ("builtins", "getattr"),
    ("builtins", "open"),
    ("os", "system"),
    ("io", "open"),
    ("collections", "Counter"),
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("collections", "deque"),
    ("datetime", "datetime"),
    ("datetime", "timedelta"),
    ("datetime", "timezone"),
    ("decimal", "Decimal"),
    ("fractions", "Fraction"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch", "float32"),
    ("torch", "_dynamo"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch.nn.parameter", "Parameter"),
    ("hwdist.serialization.tensors", "rebuild_tensor"),
    ("hwdist.serialization.tensors", "rebuild_sparse"),
    ("hwdist.serialization.tensors", "rebuild_quantized"),
    ("torch._utils", "_rebuild_meta_tensor_no_storage"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("copyreg", "_reconstructor"),
]


def _seeds(marker: str) -> list[bytes]:
    objs = legit_objects()
    out = [pickle.dumps(o, protocol=p) for o in objs for p in (2, 4, 5)]
    inband = ser.PickleSerializer(oob_threshold=1 << 40)
    out += [bytes(inband.dumps(o)[0]) for o in objs + legit_torch_kinds()]
    out += [pickle.dumps(objs, protocol=5)]
    out += [p for p in attacks(marker).values() if len(p) < 4096]
    return out


def _mutate(data: st.DataObject, seeds: list[bytes]) -> bytes:
    buf = bytearray(data.draw(st.sampled_from(seeds), label="seed"))
    for _ in range(data.draw(st.integers(0, 6), label="mutations")):
        kind = data.draw(st.integers(0, 6))
        pos = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == 0 and buf:
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == 1 and buf:
            buf[pos] = data.draw(st.sampled_from(sorted(set(pickle_opcodes()))))
        elif kind == 2:
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=12))
        elif kind == 3:
            del buf[pos : pos + data.draw(st.integers(1, 16))]
        elif kind == 4:
            end = pos + data.draw(st.integers(1, 32))
            buf[pos:pos] = buf[pos:end] * data.draw(st.integers(1, 4))
        elif kind == 5:
            other = data.draw(st.sampled_from(seeds))
            start = data.draw(st.integers(0, max(len(other) - 1, 0)))
            buf[pos:pos] = other[start : start + data.draw(st.integers(1, 64))]
        else:
            width = data.draw(st.sampled_from([1, 2, 4, 8]))
            value = data.draw(st.sampled_from(_EXTREMES)) % (1 << (8 * width))
            buf[pos : pos + width] = value.to_bytes(width, "little")
    return bytes(buf)


def pickle_opcodes() -> bytes:
    import pickletools

    return bytes(ord(op.code) for op in pickletools.opcodes)


def _op_tokens() -> st.SearchStrategy[bytes]:
    import pickletools

    by_arg: dict[str, st.SearchStrategy[bytes]] = {
        "uint1": st.integers(0, 255).map(lambda v: bytes([v])),
        "uint2": st.integers(0, 0xFFFF).map(lambda v: struct.pack("<H", v)),
        "int4": st.sampled_from(_EXTREMES[:10]).map(lambda v: struct.pack("<I", v % 2**32)),
        "uint4": st.integers(0, 64).map(lambda v: struct.pack("<I", v)),
        "uint8": st.integers(0, 64).map(lambda v: struct.pack("<Q", v)),
        "float8": st.floats(allow_nan=True).map(lambda v: struct.pack(">d", v)),
        "long1": st.integers(0, 8).map(lambda n: bytes([n]) + b"\x01" * n),
        "long4": st.integers(0, 8).map(lambda n: struct.pack("<i", n) + b"\x02" * n),
        "decimalnl_short": st.sampled_from([b"0\n", b"1\n", b"00\n", b"01\n", b"-7\n", b"99999999999\n"]),
        "decimalnl_long": st.sampled_from([b"0L\n", b"12L\n", b"-3\n"]),
        "floatnl": st.sampled_from([b"1.5\n", b"nan\n", b"-inf\n"]),
        "stringnl": st.sampled_from([b"'abc'\n", b'"x\\x00"\n', b"'\n"]),
        "stringnl_noescape": st.sampled_from([f"{m}\n".encode() for m, _ in _GLOBALS]),
        "stringnl_noescape_pair": st.sampled_from([f"{m}\n{n}\n".encode() for m, n in _GLOBALS]),
        "unicodestringnl": st.sampled_from([b"abc\n", b"\\u1234\n", b"__missing__\n"]),
        "string1": st.binary(max_size=8).map(lambda b: bytes([len(b)]) + b),
        "string4": st.binary(max_size=8).map(lambda b: struct.pack("<i", len(b)) + b),
        "bytes1": st.binary(max_size=16).map(lambda b: bytes([len(b)]) + b),
        "bytes4": st.binary(max_size=16).map(lambda b: struct.pack("<I", len(b)) + b),
        "bytes8": st.binary(max_size=16).map(lambda b: struct.pack("<Q", len(b)) + b),
        "bytearray8": st.binary(max_size=16).map(lambda b: struct.pack("<Q", len(b)) + b),
        "unicodestring1": st.sampled_from(
            [n for pair in _GLOBALS for n in pair] + ["__class__", "f8", "V8", "<", "|"]
        ).map(lambda s: bytes([len(s.encode())]) + s.encode()),
        "unicodestring4": st.text(max_size=8).map(
            lambda s: (
                struct.pack("<I", len(s.encode("utf-8", "surrogatepass")))
                + s.encode("utf-8", "surrogatepass")
            )
        ),
        "unicodestring8": st.text(max_size=8).map(
            lambda s: (
                struct.pack("<Q", len(s.encode("utf-8", "surrogatepass")))
                + s.encode("utf-8", "surrogatepass")
            )
        ),
    }
    tokens = []
    for op in pickletools.opcodes:
        code = op.code.encode("latin-1")
        if op.arg is None:
            tokens.append(st.just(code))
        elif op.arg.name in by_arg:
            tokens.append(by_arg[op.arg.name].map(lambda a, c=code: c + a))
    return st.one_of(tokens)


class Fuzzer:
    def __init__(self, marker: str, current: str) -> None:
        self.marker, self.current = marker, current
        self.seeds = _seeds(marker)
        self.examples = 0
        import numpy.random  # noqa: F401 (hypothesis seeds it; that import is not a payload's doing)

        warm_up()

    def check(self, payload: bytes) -> None:
        with open(self.current, "wb") as f:
            f.write(payload)
        before = snapshot()  # taken here: hypothesis imports its own modules as it goes
        tracemalloc.start()
        outcome, msg, obj = load_one(payload, via_frame=False)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        touch(obj)
        del obj
        self.examples += 1
        assert outcome in ("refused", "loaded"), f"{outcome}: {msg}"
        assert not os.path.exists(self.marker), "the payload ran code (the marker file exists)"
        assert peak < PEAK_LIMIT + 64 * len(payload), (
            f"peak memory {peak} bytes for a {len(payload)}-byte payload"
        )
        changed = diff(before, snapshot())
        assert not changed, f"globals changed: {changed}"

    def run(self, seconds: float) -> int:
        tokens = _op_tokens()
        opts = settings(
            max_examples=150,
            deadline=None,
            database=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
        )
        end = time.monotonic() + seconds
        runs = 0
        while time.monotonic() < end:

            @opts
            @given(st.data())
            def mutated(data: st.DataObject) -> None:
                self.check(_mutate(data, self.seeds))

            @opts
            @given(st.lists(tokens, max_size=40))
            def sequences(ops: list[bytes]) -> None:
                self.check(b"".join(ops) + b".")

            mutated()
            sequences()
            runs += 1
        print(f"fuzzed {self.examples} payloads in {runs} rounds", flush=True)
        return 0


def main(argv: list[str]) -> int:
    marker, seconds, current = argv[0], float(argv[1]), argv[2]
    return Fuzzer(marker, current).run(seconds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
