"""Hostile pickle payloads for the restricted unpickler, and a child process that loads them.

The payloads reproduce known attacks on an allow-list unpickler: each one
crashed, mutated or bloated a receiver that used the earlier restricted
unpickler (a ``pickle.Unpickler`` with an allow-list). Tests run them with
``python -m tests.programs.restricted_probe`` in a child process, so a crash
fails the test instead of killing the suite, and read one JSON report per
payload from its stdout.

The child checks after every payload that no code ran (a marker file that
``open(marker, "w")`` or ``os.system`` would create is absent), that no global
changed (the dicts of every allow-listed class and module, ``sys.modules``,
and ``Counter()['x'] == 0``, ``Fraction(1, 2) != Fraction(1, 3)``), and how
much Python memory the load allocated at its peak (tracemalloc).
"""

from __future__ import annotations

import builtins
import collections
import datetime
import decimal
import fractions
import json
import os
import pickle
import struct
import subprocess
import sys
import tracemalloc
from typing import Any, Optional

import numpy as np
import torch

_FROMBUFFER = np.arange(3).__reduce_ex__(5)[0]  # numpy's _frombuffer, wherever this numpy keeps it
_RECONSTRUCT = np.arange(3).__reduce__()[0]


class R:
    """Pickles as ``fn(*args)`` (then BUILD ``state``), without ever calling ``fn`` here."""

    def __init__(self, fn: Any, args: tuple, state: Any = None) -> None:
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self) -> tuple:
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


def _g(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _hwdist_stream(obj: Any) -> bytes:
    """``obj`` pickled as hwdist's pickler does (tensors inside in hwdist's form), all in band."""
    from hwdist.serialization import PickleSerializer

    return bytes(PickleSerializer(oob_threshold=1 << 40).dumps(obj)[0])


def _torch_kind_attacks() -> dict[str, bytes]:
    """Sparse and quantized tensors, and a state_dict's OrderedDict state, as a hostile peer forges them."""
    from hwdist.serialization.tensors import rebuild_quantized, rebuild_sparse

    far = torch.tensor([[2**40]])
    return {
        "sparse_out_of_shape": _hwdist_stream(
            R(rebuild_sparse, ("sparse_coo", (far, torch.ones(1)), (2,), False, False))
        ),
        "sparse_false_coalesced": _hwdist_stream(
            R(rebuild_sparse, ("sparse_coo", (torch.tensor([[0, 0]]), torch.ones(2)), (2,), True, False))
        ),
        "quantized_nan_scale": _hwdist_stream(
            R(rebuild_quantized, (torch.ones(2, dtype=torch.uint8), ("per_tensor_affine", float("nan"), 0)))
        ),
        "ordered_dict_int_state": _hwdist_stream(R(collections.OrderedDict, (), {1: 2})),
    }


def attacks(marker: str) -> dict[str, bytes]:
    """The hostile payloads by name (numpy tricks, class state, huge allocations, ...)."""
    obj_field = R(np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 0))
    return {
        **_torch_kind_attacks(),
        # 1a: a V8 dtype claiming an object field with flags 0, then _frombuffer over attacker bytes
        "dtype_object_field": pickle.dumps(R(_FROMBUFFER, (b"AAAAAAAA", obj_field, (1,), "C")), protocol=4),
        # 1a': numpy's own array format with the same dtype
        "reconstruct_object_field": pickle.dumps(
            R(_RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (1,), obj_field, False, b"AAAAAAAA")), protocol=4
        ),
        # 1b: the ndarray constructor with strides whose bounds check overflows
        "ndarray_huge_strides": pickle.dumps(
            R(np.ndarray, ((3, 3), "f8", b"A" * 72, 0, (2**62, 2**62))), protocol=4
        ),
        # 1c: a plain dtype whose BUILD state sets the object flag bits
        "dtype_flags": pickle.dumps(
            R(np.dtype, ("f8", False, True), (3, "<", None, None, None, -1, -1, 63)), protocol=4
        ),
        # 3: BUILD with slot state on an allow-listed class: setattr on the class itself
        "counter_missing": _g("collections", "Counter")
        + b"(N}V__missing__\n"
        + _g("builtins", "bool")
        + b"stb.",
        "fraction_eq": _g("fractions", "Fraction") + b"(N}V__eq__\n" + _g("builtins", "slice") + b"stb.",
        "ndarray_class_state": _g("numpy", "ndarray") + b"(N}Vsum\n" + _g("builtins", "int") + b"stb.",
        # 4: size-driven allocation: bytearray(2**30) from ~30 bytes, and the length opcodes
        "bytearray_1gib": _g("builtins", "bytearray") + b"(J\x00\x00\x00\x40tR.",
        "bytes_1gib": _g("builtins", "bytes") + b"(J\x00\x00\x00\x40tR.",
        "bytearray8_1gib": b"\x80\x05\x96" + struct.pack("<Q", 2**30) + b".",
        "binbytes8_1gib": b"\x80\x04\x8e" + struct.pack("<Q", 2**30) + b".",
        "memo_index_4g": b"\x80\x02Nr\xff\xff\xff\xff.",
        "list_of_range": _g("builtins", "list") + b"(" + _g("builtins", "range") + b"(J\x00\x00\x00\x40tRtR.",
        "tensor_empty_buffer": _g("hwdist.serialization.tensors", "rebuild_tensor")
        + b"(C\x00Vfloat32\n(J\x00\x00\x00\x10tI00\ntR.",
        # code execution through a global off the allow-list
        "open_marker": pickle.dumps(R(open, (marker, "w")), protocol=4),
        "os_system": pickle.dumps(R(os.system, (f"touch {marker}",)), protocol=2),
        # deep nesting CPython hashes / frees recursively in C
        "deep_tuple_hash": b"\x80\x04}" + b")" + b"\x85" * 200_000 + b"K\x01s.",
        "deep_deque": b"\x80\x04"
        + _g("collections", "deque")
        + b"\x94"
        + b"h\x00(]" * 100_000
        + b"h\x00(]tR"
        + b"atR" * 100_000
        + b".",
        "deep_defaultdict": b"\x80\x04"
        + _g("collections", "defaultdict")
        + b"\x94"
        + b"h\x00(NtRK\x01" * 100_000
        + b"h\x00(NtR"
        + b"s" * 100_000
        + b".",
    }


def legit_torch_kinds() -> list[Any]:
    """What torch's weights_only loader accepts beyond dense tensors: a state_dict, sparse, quantized."""
    from tests.programs import torch_kinds

    kinds = torch_kinds.everything(0)
    names = ("state_dict", "coo", "csr", "bsc", "per_tensor_qint8", "per_channel_qint8", "meta")
    return [kinds[k] for k in names]


def legit_objects() -> list[Any]:
    """Objects the restricted unpickler must accept (seeds for the fuzzer too)."""
    return [
        {"rank": 1, "name": "r1", "nested": [1, (2, "x"), {"k": None}], "f": 1.5, "b": b"xy", "c": 1 + 2j},
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        np.arange(10, dtype=np.int16)[::3],
        np.array(2.5, dtype=">f8"),
        np.zeros((0, 3), dtype=np.uint8),
        np.array([True, False]),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
        np.array([1, "a", None], dtype=object),
        np.float64(0.25),
        np.int8(-3),
        torch.arange(6, dtype=torch.float32).reshape(2, 3),
        torch.ones(2, dtype=torch.bool),
        torch.nn.Parameter(torch.ones(2)),
        torch.Size([2, 3]),
        torch.device("cpu"),
        torch.bfloat16,
        collections.OrderedDict(a=1, b=[2]),
        collections.defaultdict(list, {"a": [1]}),
        collections.Counter("abca"),
        collections.deque([1, 2], maxlen=3),
        fractions.Fraction(2, 3),
        decimal.Decimal("1.25"),
        datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        datetime.timedelta(days=2),
        {1, 2, frozenset({3})},
        bytearray(b"ba"),
        range(1, 9, 2),
        slice(1, None, 2),
        Ellipsis,
        (((1,),),),
    ]


# ---- what the child checks ------------------------------------------------------------------

_MODULES = (builtins, collections, datetime, decimal, fractions, np, torch, pickle)


def _watched_classes() -> list[type]:
    from hwdist.serialization.restricted import checks

    classes = {v for v in checks.VALUES.values() if isinstance(v, type)}
    classes |= {
        getattr(builtins, n)
        for n in (
            "bool",
            "bytearray",
            "bytes",
            "complex",
            "dict",
            "float",
            "frozenset",
            "int",
            "list",
            "range",
            "set",
            "slice",
            "str",
            "tuple",
        )
    }
    classes |= {torch.Tensor, np.generic, np.float64, type(np.dtype("f8"))}
    return sorted(classes, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def snapshot() -> dict[str, Any]:
    """Identity of every attribute of the watched modules and classes, and the loaded modules."""
    out: dict[str, Any] = {"sys.modules": frozenset(sys.modules)}
    for owner in (*_MODULES, *_watched_classes()):
        label = getattr(owner, "__qualname__", None) or owner.__name__
        out[f"{getattr(owner, '__module__', '')}.{label}"] = {k: id(v) for k, v in vars(owner).items()}
    return out


def behaviour_changes() -> list[str]:
    bad = []
    if collections.Counter()["never-seen"] != 0:
        bad.append("Counter()['never-seen'] != 0")
    if fractions.Fraction(1, 2) == fractions.Fraction(1, 3):
        bad.append("Fraction(1, 2) == Fraction(1, 3)")
    if np.arange(3).sum() != 3 or str(np.dtype("f8")) != "float64":
        bad.append("numpy behaves differently")
    return bad


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changed = [
        f"{k}: {sorted(set(after[k]) ^ set(before[k]))[:5] or 'an attribute was replaced'}"
        for k in before
        if k != "sys.modules" and before[k] != after[k]
    ]
    # torch and numpy import some of their own submodules on first use (a tensor's repr, say);
    # a payload that made hwdist import one by name would still show in the module's vars above
    new = sorted(
        m for m in after["sys.modules"] - before["sys.modules"] if not m.startswith(("torch.", "numpy."))
    )
    if new:
        changed.append(f"modules imported: {new[:5]}")
    return changed + behaviour_changes()


def load_one(payload: bytes, via_frame: bool = True) -> tuple[str, str, Any]:
    """``(outcome, message, object)``: outcome is 'refused', 'error' (another exception) or 'loaded'."""
    from hwdist import serialization as ser

    try:
        if via_frame:
            obj = ser.decode(ser.Frame(payload, []).to_numpy(), serializer=ser.RestrictedPickleSerializer())
        else:
            obj = ser.restricted_loads(payload)
    except ser.UnpicklingRefused as exc:
        return "refused", str(exc), None
    except BaseException as exc:  # noqa: B036 (reported, not hidden)
        return "error", f"{type(exc).__name__}: {exc}", None
    return "loaded", "", obj


def touch(obj: Any) -> None:
    """What a receiver does with a result: print it, compare it, hash it (the attacks crashed here)."""
    try:
        repr(obj)
        str(obj)
        obj == obj  # noqa: B015
        hash(obj)
    except Exception:  # unhashable, recursion: exceptions, not crashes
        pass


def warm_up() -> None:
    """Load every legit object once, in pickle's and hwdist's format.

    First-use imports are not a payload's doing.
    """
    from hwdist import serialization as ser

    from hwdist.serialization.restricted.checks import TORCH_DTYPES

    inband = ser.PickleSerializer(oob_threshold=1 << 40)
    extra = [torch.zeros(3, dtype=dt) for dt in TORCH_DTYPES.values()] + legit_torch_kinds()
    extra += [np.zeros(3, dtype=c) for c in "?bhilqBHILQefdgFDG"]
    for obj in legit_objects() + extra:
        try:
            streams = (pickle.dumps(obj, protocol=5), bytes(inband.dumps(obj)[0]))
        except (KeyError, RuntimeError, TypeError):  # a dtype this torch cannot pickle (float8 on torch 2.1)
            continue
        for stream in streams:
            touch(load_one(stream, via_frame=False)[2])


def probe(payloads: list[bytes], marker: str) -> list[dict[str, Any]]:
    """Load each payload here; one report each (also printed as a JSON line as soon as it is known)."""
    warm_up()
    reports = []
    for i, payload in enumerate(payloads):
        before = snapshot()
        tracemalloc.start()
        outcome, msg, obj = load_one(payload)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        touch(obj)
        del obj
        rep = {
            "i": i,
            "outcome": outcome,
            "message": msg,
            "peak_bytes": peak,
            "code_ran": os.path.exists(marker),
            "globals_changed": diff(before, snapshot()),
        }
        print(json.dumps(rep), flush=True)
        reports.append(rep)
    return reports


def run_child(
    payloads: list[bytes], marker: str, timeout: float = 120
) -> tuple[subprocess.CompletedProcess, list]:
    """Run :func:`probe` in a child process; returns the process and the reports it printed."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.programs.restricted_probe", marker],
        input=json.dumps([p.hex() for p in payloads]),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=root,
    )
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, reports


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    probe([bytes.fromhex(h) for h in json.loads(sys.stdin.read())], args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
