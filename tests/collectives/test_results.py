"""Results collection and create_tmpdir on real ranks (gloo and emu, world sizes 1-3).

Expected orders are computed from the interleaved sampler rule (item i is on
rank i % W at position i // W), independently of hwdist.

Rows of docs/reliability.md's fault table, at the end: the destination of
``gather_object`` / ``collect_results`` that leaves in the middle and stays alive
(a ``KeyboardInterrupt`` while decoding), rank 0 killed in ``collect_results``
(over the network, or through ``tmpdir`` while reading the parts) and a rank
killed half-way through writing its part: every survivor raises within seconds,
far below the process-group timeout, and the survivors of
``collect_results(tmpdir=...)`` remove their part files and the working
directory. Fault injection: ``os.kill(SIGKILL)`` from a patched hwdist-internal
``_objwire.Link.recv`` / ``results._read_part`` / ``results._write_atomic`` in one
rank, and a class whose unpickling raises; torch.distributed is never mocked.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from typing import Any

import numpy as np
import pytest

import hwdist
from hwdist.collectives import results as resmod
from hwdist.testing import RankFailure, run_distributed
from hwdist.testing.pytest_plugin import backends, world_sizes

from tests.programs._faults import FAST, PG_TIMEOUT, notices_need_torch_2_4, read_outcomes, timed
from tests.programs._faults import write_outcome

pytestmark = pytest.mark.dist

# Under `mpiexec ... -m hwdist.testing.mpi_suite` every rank runs its own pytest
# session, so pytest's tmp_path differs per rank: it is not a shared directory.
needs_shared_tmp_path = pytest.mark.skipif(
    os.environ.get("HWDIST_MPI_SUITE") == "1",
    reason="each MPI rank is its own pytest session with its own tmp_path (not shared)",
)


def _item(i: int):
    # genuine None results must survive
    return None if i % 5 == 3 else {"idx": i, "pred": np.full(4, i, dtype=np.float32)}


def _same_item(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a["idx"] == b["idx"] and a["pred"].tolist() == b["pred"].tolist()


def _sampler_part(n_items: int, rank: int, world: int, pad: bool) -> list:
    """What rank ``rank`` holds for a dataset of ``n_items``; ``pad`` mimics DistributedSampler padding."""
    total = -(-n_items // world) * world if pad else n_items
    return [_item(i % n_items) for i in range(rank, total, world)]


def _collect(n_items: int, pad: bool, mode: str, tmp_base: str, chunk_bytes: int) -> list:
    saved, resmod.CHUNK_BYTES = resmod.CHUNK_BYTES, chunk_bytes
    try:
        return _collect_inner(n_items, pad, mode, tmp_base)
    finally:
        resmod.CHUNK_BYTES = saved


def _collect_inner(n_items: int, pad: bool, mode: str, tmp_base: str) -> list:
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    part = _sampler_part(n_items, rank, world, pad)
    if mode == "cpu-tmpdir":
        out = hwdist.collect_results(part, n_items, device="cpu", tmpdir=os.path.join(tmp_base, "shared"))
    elif mode == "cpu-comm":
        out = hwdist.collect_results_cpu(part, n_items)
    else:
        out = hwdist.collect_results_gpu(part, n_items)
    if rank != 0:
        assert out is None
        return []
    expected = [_item(i) for i in range(n_items)]
    assert len(out) == n_items, (len(out), n_items)
    assert all(_same_item(a, b) for a, b in zip(out, expected))
    return [n_items]


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", world_sizes())
@needs_shared_tmp_path
def test_collect_results_order_none_and_unequal_parts(dist, world_size, backend, tmp_path):
    for mode in ("cpu-tmpdir", "cpu-comm", "gpu"):
        # unequal parts (n not divisible by W), padded parts, empty parts, tiny chunks
        cases = ((7, False, 1 << 24), (7, True, 1 << 24), (1, False, 1 << 24), (40, False, 200))
        for n_items, pad, chunk in cases:
            res = dist(_collect, world_size, backend, n_items, pad, mode, str(tmp_path), chunk)
            assert res[0] == [n_items]
    # the shared directory was cleaned up (the user's tmpdir too, since hwdist created it)
    assert not (tmp_path / "shared").exists()


def _collect_big(mode: str, tmp_base: str) -> bool:
    """Chunked transfer with out-of-band arrays (items above the out-of-band threshold)."""
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    saved, resmod.CHUNK_BYTES = resmod.CHUNK_BYTES, 300_000
    n = 12
    part = [{"i": i, "a": np.full(20_000, i, dtype=np.float64)} for i in range(rank, n, world)]
    tmpdir = os.path.join(tmp_base, "big") if mode == "tmpdir" else None
    try:
        out = hwdist.collect_results(part, n, tmpdir=tmpdir)
    finally:
        resmod.CHUNK_BYTES = saved
    if rank == 0:
        assert [o["i"] for o in out] == list(range(n))
        assert all(o["a"][0] == o["i"] and o["a"].flags.writeable for o in out)
    return True


@pytest.mark.parametrize("backend", backends())
@needs_shared_tmp_path
def test_collect_results_chunks_large_items(dist, backend, tmp_path):
    for mode in ("tmpdir", "comm"):
        assert dist(_collect_big, 3, backend, mode, str(tmp_path)) == [True] * 3


def _not_shared(tmp_base: str) -> str:
    rank = hwdist.get_rank()
    own = os.path.join(tmp_base, f"node{rank}")  # a different directory on every rank
    try:
        hwdist.collect_results([rank], 3, tmpdir=own)
    except hwdist.ObjectCollectiveError as exc:
        return str(exc)
    raise AssertionError("no error")


@pytest.mark.parametrize("backend", backends())
def test_unshared_tmpdir_fails_everywhere_before_anything_is_written(dist, backend, tmp_path):
    msgs = dist(_not_shared, 3, backend, str(tmp_path))
    for msg in msgs:
        assert "is not shared with rank 0" in msg and "rank(s) 1, 2" in msg and "before any rank wrote" in msg
    # nothing was written anywhere, and rank 0's working directory is gone
    leftovers = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    assert leftovers == []
    assert not (tmp_path / "node0").exists()


def _bad_inputs(verified: bool) -> list:
    rank = hwdist.get_rank()
    seen: list = []
    cases = [
        lambda: hwdist.collect_results([1], -1 if rank == 1 else 2),
        lambda: hwdist.collect_results("abc" if rank == 0 else [1], 2),
        lambda: hwdist.collect_results([1], 2, device="tpu" if rank == 1 else "cpu"),
        lambda: hwdist.collect_results([1], 2, device="gpu", tmpdir="/tmp/x"),
    ]
    for case in cases:
        try:
            with hwdist.verification(verified):
                case()
        except (hwdist.CollectiveArgumentError, hwdist.CollectiveMismatch) as exc:
            seen.append((type(exc).__name__, str(exc)))
            continue
        raise AssertionError(f"case {len(seen)} raised nothing")
    assert hwdist.collect_results([rank], 2) == ([0, 1] if rank == 0 else None)
    return seen


@pytest.mark.parametrize("backend", backends())
def test_bad_inputs_raise_on_every_rank(dist, backend):
    for msgs in dist(_bad_inputs, 2, backend, False):
        assert "size must be a non-negative int, got int: -1" in msgs[0][1] and "rank 1" in msgs[0][1]
        assert "results must be a list, got str" in msgs[1][1] and "rank 0" in msgs[1][1]
        assert "device must be 'cpu' or 'gpu', got 'tpu'" in msgs[2][1]
        assert "tmpdir must be None when device='gpu'" in msgs[3][1]
    # with verification (the default), a size that differs between the ranks is a mismatch first
    for msgs in dist(_bad_inputs, 2, backend, True):
        assert msgs[0][0] == "CollectiveMismatch" and "size: rank 0: 2; rank 1: -1" in msgs[0][1], msgs[0]
        assert "results must be a list, got str" in msgs[1][1] and "rank 0" in msgs[1][1]
        assert "tpu" in msgs[2][1], msgs[2]
        assert "tmpdir must be None when device='gpu'" in msgs[3][1]


def _tmpdir_on_one_rank(tmp_base: str, verified: bool) -> list:
    """collect_results with tmpdir on one rank only (each rank in turn): every rank raises, naming it."""
    rank, out = hwdist.get_rank(), []
    for who in (1, 0):
        start = time.monotonic()
        try:
            tmpdir = os.path.join(tmp_base, f"one{who}") if rank == who else None
            with hwdist.verification(verified):
                hwdist.collect_results([rank], 2, tmpdir=tmpdir)
        except (TypeError, ValueError) as exc:
            out.append((type(exc).__name__, str(exc), time.monotonic() - start))
        else:
            out.append(None)
    out.append(hwdist.collect_results([rank], 2))  # usable afterwards
    return out


@pytest.mark.parametrize("backend", backends())
@needs_shared_tmp_path
def test_tmpdir_on_one_rank_only_raises_on_every_rank(dist, backend, tmp_path):
    # both transports start with a record exchange of the same size: the opcodes differ, every rank raises
    for r, out in enumerate(dist(_tmpdir_on_one_rank, 2, backend, str(tmp_path), True)):
        assert out[2] == ([0, 1] if r == 0 else None), out
        for who, got in zip((1, 0), out[:2]):  # verification (the default): the transports differ
            assert got is not None and got[2] < 10 and got[0] == "CollectiveMismatch", (r, who, got)
            calls = ["collect_results", "collect_results"]
            calls[who] += "(tmpdir)"
            assert f"op: rank 0: {calls[0]}; rank 1: {calls[1]}" in got[1], (r, who, got)
    for r, out in enumerate(dist(_tmpdir_on_one_rank, 2, backend, str(tmp_path), False)):
        assert out[2] == ([0, 1] if r == 0 else None), out  # results on rank 0 only
        for who, got in zip((1, 0), out[:2]):
            assert got is not None and got[2] < 10, (r, who, got)
            assert got[0] == "CollectiveArgumentError", (r, who, got)
            assert "ranks called different object collectives" in got[1], (r, who, got)
            calls = ["collect_results", "collect_results"]
            calls[who] += "(tmpdir)"
            assert f"(rank 0: {calls[0]}, rank 1: {calls[1]})" in got[1], (r, who, got)


def _tmpdir(tmp_base: str) -> list:
    rank = hwdist.get_rank()
    made = hwdist.create_tmpdir(rank)
    given = hwdist.create_tmpdir(rank, os.path.join(tmp_base, "given"))
    hwdist.barrier()  # rank 0 removes its probe file once every rank has checked it
    ok = os.path.isdir(made) and os.listdir(given) == []
    hwdist.barrier()
    if rank == 0:
        os.rmdir(made)
    try:
        hwdist.create_tmpdir(rank, os.path.join(tmp_base, f"own{rank}"))
    except hwdist.ObjectCollectiveError as exc:
        err = "not shared with rank 0" in str(exc)
    else:
        err = False
    bad = []  # a tmpdir that is not a path on one rank (rank 1, then rank 0): every rank raises, fast
    for who in (1, 0):
        arg = 5 if rank == who else os.path.join(tmp_base, "given")
        start = time.monotonic()
        try:
            hwdist.create_tmpdir(rank, arg)
        except (TypeError, ValueError) as exc:
            bad.append((type(exc).__name__, str(exc), time.monotonic() - start))
        else:
            bad.append(None)
    return [made, given, ok, err, bad]


@pytest.mark.parametrize("backend", backends())
@needs_shared_tmp_path
def test_create_tmpdir_is_shared(dist, backend, tmp_path):
    res = dist(_tmpdir, 2, backend, str(tmp_path))
    assert res[0][0] == res[1][0]
    assert res[0][1] == res[1][1] == str(tmp_path / "given")
    assert all(r[2] and r[3] for r in res)
    for r, out in enumerate(res):
        for who, got in zip((1, 0), out[4]):
            assert got is not None, (r, who)
            name, text, took = got
            assert "tmpdir must be a path (str), got int" in text and f"rank {who}" in text, (r, who, got)
            assert name == "CollectiveArgumentError" and took < 10, (r, who, got)


def test_non_distributed():
    assert hwdist.collect_results([1, None, 3], 2) == [1, None]
    assert hwdist.collect_results_cpu([1, 2], 5) == [1, 2]
    assert hwdist.collect_results_gpu([1, 2], 1) == [1]
    with pytest.raises(hwdist.CollectiveArgumentError, match="device must be 'cpu' or 'gpu'"):
        hwdist.collect_results([1], 1, device="npu")
    with pytest.raises(hwdist.CollectiveArgumentError, match="size must be a non-negative int"):
        hwdist.collect_results([1], "2")


def test_interleave_matches_the_sampler_rule():
    for world in (1, 2, 3, 4):
        for n in (0, 1, 5, 12, 13):
            parts = [list(range(r, n, world)) for r in range(world)]
            assert resmod._interleave(parts, n) == list(range(n))
            assert resmod._interleave(parts, max(0, n - 2)) == list(range(max(0, n - 2)))


# ---------------------------------------------------------------------------
# faults: the destination leaves or dies, a rank dies while writing (survivors raise fast)
# ---------------------------------------------------------------------------
def _explode(pad: bytes) -> bytes:
    if hwdist.get_rank() == 0:
        raise KeyboardInterrupt("interrupted while decoding")
    return pad


class _Interrupts:
    """Unpickling it on rank 0 raises KeyboardInterrupt: rank 0 leaves in the middle and stays alive."""

    def __init__(self, size: int) -> None:
        self.pad = b"z" * size

    def __reduce__(self) -> Any:
        return (_explode, (self.pad,))


def _rank0_leaves(op: str) -> list:
    rank = hwdist.get_rank()
    # over 2 MiB in all: the payloads move point to point (not in one gather), so the senders wait on rank 0
    obj: Any = _Interrupts(800_000) if rank == 1 else {"rank": rank, "pad": np.zeros(50_000)}
    start = time.monotonic()
    try:
        if op == "gather_object":
            hwdist.gather_object(obj, dst=0)
        else:
            hwdist.collect_results([obj], 3)
    except BaseException as exc:  # noqa: BLE001 (KeyboardInterrupt on rank 0 is the point)
        return [type(exc).__name__, str(exc)[:400], time.monotonic() - start]
    return ["no error", "", time.monotonic() - start]


@pytest.mark.slow
@notices_need_torch_2_4
@pytest.mark.parametrize("op", ["gather_object", "collect_results"])
def test_destination_that_leaves_in_the_middle_makes_every_sender_raise_fast(op):
    res = run_distributed(_rank0_leaves, 3, "gloo", op, pg_timeout=PG_TIMEOUT, timeout=90)
    assert res[0][0] == "KeyboardInterrupt", res[0]
    for rank in (1, 2):  # rank 2 was still sending (or about to) when rank 0 left
        kind, msg, secs = res[rank]
        assert kind == "PeerFailure" and "KeyboardInterrupt while decoding the object from rank 1" in msg, (
            res[rank]
        )
        assert secs < FAST, (rank, secs)


def _collect_then_rank0_dies(outdir: str, tmpdir: str, where: str) -> None:
    from hwdist.collectives import _objwire
    from hwdist.collectives import results as resmod

    if hwdist.get_rank() == 0:

        def die(*args: Any, **kwargs: Any) -> Any:
            os.kill(os.getpid(), signal.SIGKILL)

        if where == "reading":
            resmod._read_part = die  # the parts are written; rank 0 dies reading them
        else:
            _objwire.Link.recv = die  # over the network: dies at its first receive
    part = [{"rank": hwdist.get_rank(), "pad": np.zeros(50_000)}]
    write_outcome(outdir, timed(lambda: hwdist.collect_results(part, 3, tmpdir=tmpdir or None)))


@pytest.mark.slow
@pytest.mark.parametrize("where", ["reading", "network"])
def test_rank0_dies_in_collect_results_survivors_raise_fast_and_clean_up(tmp_path, where):
    outdir, collect = tmp_path / "out", tmp_path / "collect"
    outdir.mkdir()
    tmpdir = str(collect) if where == "reading" else ""
    with pytest.raises(RankFailure, match="root cause: rank 0 died"):
        run_distributed(
            _collect_then_rank0_dies, 3, "gloo", str(outdir), tmpdir, where, pg_timeout=PG_TIMEOUT, timeout=90
        )
    got = read_outcomes(outdir, (1, 2))
    assert got.keys() == {1, 2}, got
    for rank, (kind, msg, secs) in got.items():
        assert kind != "no error" and secs < FAST, (rank, kind, msg, secs)
    if where == "reading":  # the survivors removed their parts and rank 0's working directory
        assert [p for p in collect.rglob("*")] == [], list(collect.rglob("*"))


def _die_while_writing(outdir: str, tmpdir: str) -> None:
    rank = hwdist.get_rank()
    if rank == 1:
        original = resmod._write_atomic

        def write_half_then_die(path: str, chunks: list) -> None:  # rank 1 writes its part only
            with open(f"{path}.tmp-{os.getpid()}", "wb") as fh:  # the same temporary name as the real one
                data = memoryview(chunks[0])
                fh.write(data[: len(data) // 2])
                fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        resmod._write_atomic = write_half_then_die
    start = time.monotonic()
    try:
        hwdist.collect_results([{"i": rank, "pad": np.zeros(50_000)}], 3, tmpdir=tmpdir)
    except Exception as exc:  # noqa: BLE001
        write_outcome(outdir, [type(exc).__name__, str(exc)[:300], time.monotonic() - start])
        raise
    finally:
        if rank == 1:
            resmod._write_atomic = original
    write_outcome(outdir, ["no error", "", time.monotonic() - start])


@pytest.mark.slow
def test_rank_killed_while_writing_results(tmp_path):
    outdir, collect = tmp_path / "out", tmp_path / "collect"
    outdir.mkdir()
    with pytest.raises(RankFailure) as info:
        run_distributed(_die_while_writing, 3, "gloo", str(outdir), str(collect), pg_timeout=30, timeout=60)
    text = str(info.value)
    # the harness names the dead rank first
    assert "root cause: rank 1 died: died: killed by signal SIGKILL" in text
    assert text.index("===== rank 1: died") < min(
        text.index(f"===== rank {r}:") if f"===== rank {r}:" in text else len(text) for r in (0, 2)
    )
    # the survivors failed by themselves, fast (well within the 30 s process-group timeout)
    for rank in (0, 2):
        kind, msg, waited = json.loads((outdir / f"outcome{rank}.json").read_text())
        assert kind != "no error" and waited < 10, (rank, kind, msg, waited)
    # no partial result file (nor anything else) left behind: rank 0 removed its working directory
    assert not collect.exists() or [p for p in collect.rglob("*")] == []


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.slow
def test_collect_results_directories_are_private(tmp_path):
    made = hwdist.create_tmpdir(tmpdir=str(tmp_path / "new"))
    assert _mode(made) == 0o700
    assert resmod._PRIVATE == 0o700
