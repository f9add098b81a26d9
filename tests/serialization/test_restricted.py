"""The restricted unpickler against hostile payloads, and what it must still accept.

Hostile payloads run in a child process (tests/programs/restricted_probe.py): a
crash there fails the test, not the suite. Each child reports, per payload,
the outcome, the message, whether code ran (a marker file), which globals
changed, and the peak Python memory of the load. Every payload here crashed,
changed or bloated a receiver that used the earlier restricted unpickler
(checked by hand against that version; the figures are in docs/reliability.md).

At the end, a hostile peer on real gloo ranks: the restricted serializer's receiver raises instead
of dying. Rank 1 plays the attacker: its serializer emits the raw bytes of a hostile
payload (tests/programs/restricted_probe.py) whatever the object, so they travel
as a well-formed hwdist frame. Rank 0 receives with
``RestrictedPickleSerializer`` in ``gather_object`` and ``collect_results``
and must raise ``UnpicklingRefused``, with its process intact (no signal,
no changed global) and the group still usable. Before the restricted
unpickler was rewritten, the numpy payloads killed rank 0 with SIGSEGV here.
A crash of a rank fails the test through the harness (RankFailure), not the
suite. The attacker learns of the refusal too: every rank raises, the sender with an
``ObjectCollectiveError`` naming the receiver's
decode failure.
"""

from __future__ import annotations

import collections
import fractions
import io
import pickle
import signal
import sys
import threading
from typing import Any

import numpy as np
import pytest
import torch

import hwdist
from hwdist import serialization as ser
from tests.programs.restricted_probe import R, attacks, legit_objects, run_child
import os
import subprocess

#: The message each payload must be refused with.
# pickle names the builtin open 'io.open' before Python 3.12 and '_io.open' from 3.12.
_OPEN = "_io.open" if sys.version_info >= (3, 12) else "io.open"
EXPECTED = {
    # numpy's reconstructors
    "dtype_object_field": "dtype('O') is not a plain numeric dtype",
    "reconstruct_object_field": "dtype('O') is not a plain numeric dtype",
    "ndarray_huge_strides": "calling 'numpy.ndarray' is not allowed",
    # BUILD on a class
    "counter_missing": (
        "BUILD on the class 'collections.Counter': it would change the class for the whole process"
    ),
    "fraction_eq": "BUILD on the class 'fractions.Fraction'",
    "ndarray_class_state": "BUILD on the class 'numpy.ndarray'",
    # allocations the payload's size does not pay for
    "bytearray_1gib": "bytearray: argument of type int is not accepted",
    "bytes_1gib": "bytes: argument of type int is not accepted",
    "bytearray8_1gib": "truncated: 1073741824 bytes wanted",
    "binbytes8_1gib": "truncated: 1073741824 bytes wanted",
    "list_of_range": "list: argument of type range is not accepted",
    "tensor_empty_buffer": "needs 1073741824 bytes, got 0",
    # code execution, and nesting CPython hashes or frees recursively in C
    "open_marker": f"refused global '{_OPEN}': it is not on the allow-list",
    "os_system": "system': it is not on the allow-list",
    "deep_tuple_hash": "tuples or frozensets nested deeper than 1000",
    "deep_deque": "a deque directly inside a deque",
    "deep_defaultdict": "a defaultdict directly inside a defaultdict",
    # torch's kinds beyond dense tensors, forged: torch's own invariant checks, hwdist's parameter checks
    "sparse_out_of_shape": "size is inconsistent with indices",
    "sparse_false_coalesced": "cannot set is_coalesced to true if indices correspond to uncoalesced",
    "quantized_nan_scale": "the scale must be finite and positive",
    "ordered_dict_int_state": "the state of an OrderedDict must be a dict with str keys",
}
GROUPS = {
    "item1_numpy": ["dtype_object_field", "reconstruct_object_field", "ndarray_huge_strides"],
    "item3_class_state": ["counter_missing", "fraction_eq", "ndarray_class_state"],
    "item4_allocation": [
        "bytearray_1gib",
        "bytes_1gib",
        "bytearray8_1gib",
        "binbytes8_1gib",
        "list_of_range",
        "tensor_empty_buffer",
    ],
    "code_and_nesting": ["open_marker", "os_system", "deep_tuple_hash", "deep_deque", "deep_defaultdict"],
    "torch_kinds": [
        "sparse_out_of_shape",
        "sparse_false_coalesced",
        "quantized_nan_scale",
        "ordered_dict_int_state",
    ],
}
PEAK_LIMIT = 64 << 20


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_hostile_payloads_are_refused_in_a_child_process(group, tmp_path):
    marker = str(tmp_path / "pwned")
    payloads = attacks(marker)
    names = GROUPS[group]
    proc, reports = run_child([payloads[n] for n in names], marker)
    crashed = names[len(reports)] if len(reports) < len(names) else None
    assert proc.returncode == 0, (
        f"the child died on payload {crashed!r}: "
        + (
            f"signal {signal.Signals(-proc.returncode).name}"
            if proc.returncode < 0
            else f"exit {proc.returncode}"
        )
        + f"\n{proc.stderr[-3000:]}"
    )
    for name, rep in zip(names, reports):
        assert rep["outcome"] == "refused", (name, rep)
        assert rep["message"].startswith("restricted unpickler refused"), (name, rep)
        assert EXPECTED[name] in rep["message"], (name, rep["message"])
        assert not rep["code_ran"], name
        assert rep["globals_changed"] == [], (name, rep["globals_changed"])
        assert rep["peak_bytes"] < PEAK_LIMIT, (name, rep["peak_bytes"])


def test_harmless_odd_payloads_load_without_effect(tmp_path):
    """A plain dtype whose state claims object flags is rebuilt plain.

    A memo key of 2**32 - 1 costs one entry.
    """
    marker = str(tmp_path / "pwned")
    payloads = attacks(marker)
    proc, reports = run_child([payloads["dtype_flags"], payloads["memo_index_4g"]], marker)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["outcome"] for r in reports] == ["loaded", "loaded"]
    assert all(r["globals_changed"] == [] and r["peak_bytes"] < 1 << 20 for r in reports)
    dt = hwdist.restricted_loads(payloads["dtype_flags"])
    assert dt == np.dtype("<f8") and not dt.hasobject and dt.flags == np.dtype("f8").flags


def test_refusal_messages_are_clear():
    with pytest.raises(
        hwdist.UnpicklingRefused,
        match=r"refused global 'os.getcwd': it is not on the allow-list\. If every sender is trusted to send"
        r" it, call hwdist.serialization.register_safe_class\('os.getcwd'\)",
    ):
        hwdist.restricted_loads(b"cos\ngetcwd\n)R.")
    with pytest.raises(hwdist.UnpicklingRefused, match="truncated: no STOP opcode"):
        hwdist.restricted_loads(b"\x80\x05K\x01")
    with pytest.raises(hwdist.UnpicklingRefused, match="a bool buffer holds a byte other than 0 or 1"):
        hwdist.restricted_loads(
            pickle.dumps(R(np.arange(3).__reduce_ex__(5)[0], (b"\x02", np.dtype(bool), (1,), "C")))
        )
    assert issubclass(hwdist.UnpicklingRefused, pickle.UnpicklingError)


# ---- what must still load --------------------------------------------------------------------

NUMPY_DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.longdouble,
    np.complex64,
    np.complex128,
    np.clongdouble,
]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("size", [6, 40_000], ids=["in_band", "out_of_band"])
def test_numpy_arrays_of_every_plain_dtype_roundtrip(dtype, size):
    base = (np.arange(size) % 3).astype(dtype).reshape(2, -1)
    cases = [
        base,
        base[:, ::2],
        np.asfortranarray(base),
        base.T,
        base[0, 0].copy().reshape(()),
        base[:0],
        base.astype(np.dtype(dtype).newbyteorder(">")),
        base[0, 0],
    ]
    rs = ser.RestrictedPickleSerializer()
    for a in cases:
        data = ser.encode(a, rs).to_numpy()
        back = ser.decode(data, serializer=rs)
        assert type(back) is type(a) and back.dtype == a.dtype and np.shape(back) == np.shape(a)
        assert np.array_equal(back, a)
        if isinstance(a, np.ndarray):
            assert back.flags.writeable and (
                back.flags.f_contiguous or not a.flags.f_contiguous or a.ndim < 2
            )


def test_legit_objects_roundtrip_through_the_restricted_serializer():
    objs = legit_objects()
    rs = ser.RestrictedPickleSerializer()
    back = ser.decode(ser.encode(objs, rs).to_numpy(), serializer=rs)
    for a, b in zip(objs, back):
        assert type(a) is type(b), (a, b)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
        elif isinstance(a, torch.Tensor):
            assert (
                a.dtype == b.dtype
                and torch.equal(a.detach(), b.detach())
                and a.requires_grad == b.requires_grad
            )
        else:
            assert a == b, (a, b)
    # plain pickle data, protocols 3 to 5
    for protocol in (3, 4, 5):
        got = hwdist.restricted_loads(pickle.dumps(objs[:11] + objs[14:], protocol=protocol))
        assert len(got) == len(objs) - 3


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.int16,
    ],
)
def test_tensors_of_every_dtype_roundtrip_restricted(dtype):
    rs = ser.RestrictedPickleSerializer()
    base = (torch.arange(24) % 2).to(dtype).reshape(2, 3, 4)
    for t in (
        base,
        base.transpose(0, 2),
        base[:, 1],
        base.reshape(-1)[0],
        base[:0],
        torch.zeros(70_000, dtype=dtype),
    ):
        got = ser.decode(ser.encode({"t": t}, rs).to_numpy(), serializer=rs)["t"]
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t)


def test_copies_are_bounded_by_the_payload_size():
    # one 50,000-entry dict, counted 200 times through the memo: 10 million entries from ~600 KB
    big = {i: 1 for i in range(50_000)}
    payload = pickle.dumps([R(collections.Counter, (big,)) for _ in range(200)], protocol=4)
    with pytest.raises(hwdist.UnpicklingRefused, match=r"more memory than its \d+ bytes can describe"):
        hwdist.restricted_loads(payload)
    assert len(hwdist.restricted_loads(pickle.dumps([collections.Counter(big)] * 2, protocol=4))) == 2


class _Slotted:
    __slots__ = ("a",)


class _Plain:
    pass


def test_registered_classes_take_instance_state_only():
    extra = [(_Plain.__module__, _Plain.__qualname__), (_Slotted.__module__, _Slotted.__qualname__)]
    p = _Plain()
    p.x = [1]
    assert hwdist.restricted_loads(pickle.dumps(p), extra=extra).x == [1]
    s = _Slotted()
    s.a = 3
    assert hwdist.restricted_loads(pickle.dumps(s, protocol=2), extra=extra).a == 3
    mod = _Plain.__module__.encode()
    # state for the class itself, and a dunder through slot state on an instance: refused
    with pytest.raises(hwdist.UnpicklingRefused, match="BUILD on the class"):
        hwdist.restricted_loads(b"c" + mod + b"\n_Plain\n(N}Vx\nK\x01stb.", extra=extra)
    evil = b"\x80\x02c" + mod + b"\n_Plain\n)\x81(N}V__class__\ncbuiltins\nint\nstb."
    with pytest.raises(hwdist.UnpicklingRefused, match="slot state must be a dict of attribute names"):
        hwdist.restricted_loads(evil, extra=extra)
    assert not hasattr(_Plain, "x") and type(_Plain()) is _Plain


# ---- the serializer in force is per thread -----------------------------------------------------


def test_use_serializer_is_per_thread_and_restored_exactly(tmp_path):
    marker = tmp_path / "pwned"
    hostile = pickle.dumps(R(open, (str(marker), "w")))
    frame = ser.Frame(hostile, []).to_numpy()
    before = hwdist.get_serializer()
    restricted = hwdist.RestrictedPickleSerializer()
    a_in, b_in, a_done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def first() -> None:
        with hwdist.use_serializer(restricted):
            a_in.set()
            b_in.wait(10)  # the other thread is now inside its own plain-pickle block
            seen["a_serializer"] = hwdist.get_serializer()
            try:
                ser.decode(frame.copy())
            except hwdist.UnpicklingRefused as exc:
                seen["a_error"] = str(exc)
            a_done.set()

    def second() -> None:
        a_in.wait(10)
        with hwdist.use_serializer(hwdist.PickleSerializer()) as mine:
            seen["b_serializer_ok"] = hwdist.get_serializer() is mine
            b_in.set()
            a_done.wait(10)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["a_serializer"] is restricted and seen["b_serializer_ok"] is True
    assert f"refused global '{_OPEN}'" in str(seen["a_error"])
    assert not marker.exists()
    assert hwdist.get_serializer() is before and type(before) is hwdist.PickleSerializer
    # a use_serializer block wins over the process default, and both are restored exactly
    previous = hwdist.set_serializer(restricted)
    try:
        with hwdist.use_serializer(hwdist.PickleSerializer()):
            assert not isinstance(hwdist.get_serializer(), hwdist.RestrictedPickleSerializer)
        assert hwdist.get_serializer() is restricted
    finally:
        assert hwdist.set_serializer(previous) is restricted
    assert hwdist.get_serializer() is before
    with pytest.raises(TypeError, match="use_serializer: serializer must be a hwdist Serializer, got int"):
        with hwdist.use_serializer(3):  # type: ignore[arg-type]
            pass


def test_corrupt_frame_headers_raise_value_error():
    good = ser.encode({"a": np.arange(20_000)}).to_numpy()
    assert ser.decode(good.copy())["a"][-1] == 19_999
    bad_fields = [(0, -64), (0, 96), (1, -1), (1, 1 << 40), (2, -1), (2, 1 << 40), (3, 1 << 50), (3, -5)]
    for field, value in bad_fields:
        bad = good.copy()
        bad.view("<i8")[field] = value
        with pytest.raises(ValueError, match="hwdist object payload"):
            ser.decode(bad, serializer=ser.RestrictedPickleSerializer())


# ---- self-reference, huge sizes, opcode floods, several pickles in one file ----------------------


@pytest.mark.parametrize("protocol", [4, 5])
def test_an_object_array_that_contains_itself_is_refused(protocol):
    a = np.empty(2, dtype=object)
    a[0], a[1] = a, 5
    with pytest.raises(hwdist.UnpicklingRefused, match="an object refers to itself before it is built"):
        hwdist.restricted_loads(pickle.dumps(a, protocol=protocol))
    # an unfinished object put in a list, or duplicated, before its state: refused, never a placeholder
    mod = np.arange(2).__reduce__()[0].__module__.encode()
    recon = b"\x80\x04c" + mod + b"\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R"  # no BUILD yet
    for tail in (b"\x85.", b"2.", b"\x94]\x94(h\x00e."):  # in a tuple; DUP; into a list through the memo
        with pytest.raises(hwdist.UnpicklingRefused, match="before (it is built|its BUILD)|missing its"):
            hwdist.restricted_loads(recon + tail)
    b = np.empty(2, dtype=object)
    b[0], b[1] = [1], {"k": np.arange(3)}
    back = hwdist.restricted_loads(pickle.dumps(b, protocol=5))
    assert back[0] == [1] and back[1]["k"].tolist() == [0, 1, 2]


def test_a_size_that_does_not_fit_64_bits_is_refused():
    for size in ((2**70,), (3, 2**63)):
        with pytest.raises(hwdist.UnpicklingRefused, match="does not fit a 64-bit size"):
            hwdist.restricted_loads(pickle.dumps(torch.Size(size)))
    assert hwdist.restricted_loads(pickle.dumps(torch.Size((2**63 - 1, 0)))) == torch.Size((2**63 - 1, 0))


@pytest.mark.parametrize("opcode", ["MEMOIZE", "MARK"])
def test_a_flood_of_memo_or_mark_opcodes_costs_what_pickle_needs(opcode):
    import tracemalloc

    n = 1 << 18  # 256 KiB: the old memo (a dict) and marks (a list each) took 8-9 times pickle's memory
    payload = b"\x80\x04]" + b"\x94" * n + b"." if opcode == "MEMOIZE" else b"\x80\x04" + b"(" * n + b"N."

    def peak(load) -> float:
        tracemalloc.start()
        try:
            load(payload)
        except Exception:  # noqa: BLE001  (MARKs left open: pickle loads it, hwdist may refuse it)
            pass
        got = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return got / 2**20

    base, ours = peak(pickle.loads), peak(hwdist.restricted_loads)
    assert ours < 2 * base + 4, (opcode, base, ours)  # was 68-80 MiB where pickle needs 7-10


class _Trickle(io.RawIOBase):
    """A stream that cannot seek and hands out at most ``step`` bytes per read (as a pipe or socket may)."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.pos, self.step = data, 0, step

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), self.step, len(self.data) - self.pos)
        buf[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def _several_pickles() -> tuple[list, bytes]:
    objs = [
        [1, np.arange(3)],  # protocol 5: framed
        {"a": 2, "b": "x" * 70_000},  # protocol 4: more than one frame's worth
        collections.OrderedDict(k=[1.5, None]),  # protocol 2: no frames
        {"text": "é", "n": 12},  # protocol 0: lines
        (b"raw", 2**70),  # protocol 3: bytes, a long int
    ]
    stream = b"".join(pickle.dumps(o, protocol=p) for o, p in zip(objs, (5, 4, 2, 0, 3)))
    return objs, stream


def _same_objects(got, want) -> bool:
    return pickle.dumps(got, protocol=4) == pickle.dumps(want, protocol=4)  # arrays compare by bytes


def test_restricted_unpickler_stops_at_the_first_stop_of_a_seekable_file():
    first, second = pickle.dumps([1, np.arange(3)], protocol=5), pickle.dumps({"a": 2}, protocol=2)
    f = io.BytesIO(first + second + b"tail")
    assert hwdist.RestrictedUnpickler(f).load()[1].tolist() == [0, 1, 2]
    assert f.tell() == len(first)
    assert hwdist.RestrictedUnpickler(f).load() == {"a": 2}  # a new unpickler reads the next one
    assert f.read() == b"tail"


def test_a_new_restricted_unpickler_per_load_reads_each_pickle_of_a_pipe():
    """As pickle.Unpickler(f).load(): each load reads one pickle of a pipe, the next load the next one."""
    objs, stream = _several_pickles()
    rfd, wfd = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(wfd, stream + b"tail"), os.close(wfd)))
    writer.start()  # the stream is larger than a pipe's buffer: written while it is read
    with os.fdopen(rfd, "rb") as pipe:
        assert not pipe.seekable()
        for want in objs:
            assert _same_objects(hwdist.RestrictedUnpickler(pipe).load(), want)
        assert pipe.read() == b"tail"  # nothing after the last STOP was taken
        with pytest.raises(EOFError):
            hwdist.RestrictedUnpickler(pipe).load()
    writer.join(10)


@pytest.mark.parametrize("step", [1, 3, 4096])
def test_the_restricted_unpickler_leaves_a_stream_where_pickle_does(step):
    """A custom non-seekable io.RawIOBase, with short reads: the same objects as pickle.Unpickler, one per
    load, and the stream left at the same byte after each one (pickle's C unpickler needs whole reads, so
    it reads the same stream without short reads)."""
    objs, stream = _several_pickles()
    theirs = _Trickle(stream + b"rest", 1 << 30)
    where = []
    for want in objs:
        assert _same_objects(pickle.Unpickler(theirs).load(), want)
        where.append(theirs.pos)
    ours = _Trickle(stream + b"rest", step)
    for want, pos in zip(objs, where):
        assert _same_objects(hwdist.RestrictedUnpickler(ours).load(), want)
        assert ours.pos == pos
    assert ours.read() == b"rest"
    with pytest.raises(EOFError):
        hwdist.RestrictedUnpickler(_Trickle(b"", step)).load()


def test_a_stream_that_ends_inside_a_pickle_is_refused_as_truncated():
    stream = pickle.dumps({"a": [1, 2, 3]}, protocol=2)
    for cut in (1, 5, len(stream) - 1):
        with pytest.raises(hwdist.UnpicklingRefused, match="truncated"):
            hwdist.RestrictedUnpickler(_Trickle(stream[:cut], 7)).load()
    with pytest.raises(hwdist.UnpicklingRefused, match="not accepted"):  # an opcode pickle does not have
        hwdist.RestrictedUnpickler(_Trickle(b"\x80\x02\xff.more", 7)).load()


# ---------- fuzzing the restricted loader ----------
# Fuzzing the restricted unpickler for about a minute: no signal, no code run, no global changed.


# The marks of this section's tests (slow ones are skipped by the fast lane, -m 'not slow').
_RESTRICTED_FUZZ_MARKS = pytest.mark.slow
FUZZ_SECONDS = float(os.environ.get("HWDIST_FUZZ_SECONDS", "20"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@_RESTRICTED_FUZZ_MARKS
@pytest.mark.timeout(FUZZ_SECONDS + 180)
def test_fuzzed_payloads_never_crash_run_code_or_change_globals(tmp_path):
    pytest.importorskip("hypothesis", reason="the fuzzer needs hypothesis (in the test extra)")
    marker, current = str(tmp_path / "pwned"), str(tmp_path / "current.bin")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.programs.restricted_fuzz", marker, str(FUZZ_SECONDS), current],
        capture_output=True,
        text=True,
        timeout=FUZZ_SECONDS + 150,
        cwd=ROOT,
    )
    if proc.returncode < 0:
        payload = (
            open(current, "rb").read() if os.path.exists(current) else "(none yet: it died while starting)"
        )
        pytest.fail(
            f"the restricted unpickler died by {signal.Signals(-proc.returncode).name} on payload"
            f" {payload!r}\n{proc.stderr[-3000:]}"
        )
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    assert not os.path.exists(marker)
    examples = int(proc.stdout.split("fuzzed ")[1].split()[0])
    assert examples >= 300, proc.stdout  # at least one round of each kind


# ---------------------------------------------------------------- a hostile peer on real ranks
HOSTILE = [
    "dtype_object_field",
    "ndarray_huge_strides",
    "counter_missing",
    "fraction_eq",
    "bytearray_1gib",
    "deep_tuple_hash",
    "sparse_out_of_shape",
    "quantized_nan_scale",
    "ordered_dict_int_state",
]


class _RawBytes(hwdist.Serializer):
    """A hostile peer's serializer: sends ``payload`` as the pickle stream, whatever the object."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def dumps(self, obj: Any) -> tuple[bytes, list]:
        return self.payload, []

    def loads(self, stream: Any, buffers: Any) -> Any:
        raise AssertionError("the attacker never receives")


def _hostile_peer(payloads_hex: list[str], how: str) -> list[Any]:
    rank = hwdist.get_rank()
    out: list[Any] = []
    for h in payloads_hex:
        ser = _RawBytes(bytes.fromhex(h)) if rank == 1 else hwdist.RestrictedPickleSerializer()
        try:
            if how == "gather_object":
                got = hwdist.gather_object({"rank": rank}, dst=0, serializer=ser)
            else:
                got = hwdist.collect_results([rank], 2, serializer=ser)
            out.append(f"returned {type(got).__name__}")
        except hwdist.UnpicklingRefused as exc:
            out.append(str(exc))
        except hwdist.ObjectCollectiveError as exc:  # the sender: told that rank 0 refused its payload
            out.append(f"{type(exc).__name__}: {exc}")
    out.append([collections.Counter()["never-seen"], fractions.Fraction(1, 2) == fractions.Fraction(1, 3)])
    # the group still works, and legitimate content still passes the restricted serializer
    got = hwdist.gather_object(
        {"rank": rank, "a": np.arange(3)}, dst=0, serializer=hwdist.RestrictedPickleSerializer()
    )
    out.append(None if got is None else [(g["rank"], g["a"].tolist()) for g in got])
    return out


@pytest.mark.parametrize("how", ["gather_object", "collect_results"])
def test_a_hostile_peer_makes_the_receiver_raise_not_die(dist, how, tmp_path):
    payloads = attacks(str(tmp_path / "pwned"))
    receiver, attacker = dist(_hostile_peer, 2, "gloo", [payloads[n].hex() for n in HOSTILE], how, timeout=90)
    for name, msg in zip(HOSTILE, receiver):
        assert msg.startswith("restricted unpickler refused"), (name, msg)
    assert receiver[len(HOSTILE)] == [0, False]  # Counter and Fraction untouched
    assert receiver[-1] == [(0, [0, 1, 2]), (1, [0, 1, 2])]
    for name, msg in zip(HOSTILE, attacker):
        assert (
            msg.startswith("ObjectCollectiveError:") and "could not decode the object from rank 1" in msg
        ), (name, msg)
    assert not (tmp_path / "pwned").exists()
