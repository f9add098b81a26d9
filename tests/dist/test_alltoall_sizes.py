"""all_to_all with uneven splits on real ranks: the piece sizes agreed by prediction.

On a backend with its own all_to_all (gloo, nccl, mpi) a call is torch's: one collective, no
agreement (each rank's outputs give its sizes); the prediction serves backends without one
(``emu``) and verification mode. The counts below follow the backend.

Every rank sends piece ``j -> r`` of a size that depends on the pattern, the
call, ``j`` and ``r`` (repeating, growing, shrinking, alternating, equal), with
values that name the sender, the receiver and the call, so each rank checks
what it got against what the sender says it gave. The collectives hwdist issues
are counted at the engine's issue table (every torch.distributed call hwdist
makes goes through it; the real collective still runs): one per call once the
history predicts the sizes. One rank whose split table disagrees with its
peers' (in the steady state and on the first call) makes every rank raise the
same error, after which the group still works.
"""

from __future__ import annotations

import pytest
import torch

import hwdist
from hwdist import registry
from hwdist.collectives import engine, _sizes
from hwdist.testing.pytest_plugin import backends, world_sizes

PATTERNS = {
    "repeat": lambda call, j, r: 3 + 2 * j + r,
    "growing": lambda call, j, r: 5 + 40 * call + j + 3 * r,
    "shrinking": lambda call, j, r: max(600 - 60 * call - j - r, 0),
    "alternate": lambda call, j, r: (700 + j + r) if call % 2 else (2 + j * r),
    "equal": lambda call, j, r: 8,
    "big": lambda call, j, r: 20_000 + j + r,  # 80 KB pieces: over the in-band limit, explicit every call
}
CALLS = 8


class Issued:
    """Counts the collectives hwdist issues (each runs for real) by wrapping the engine's issue table."""

    def __enter__(self) -> "Issued":
        self.n = 0
        self._saved = dict(engine._ISSUE)

        def counting(fn):
            def call(c, a):
                self.n += 1
                return fn(c, a)

            return call

        for k, fn in self._saved.items():
            engine._ISSUE[k] = counting(fn)
        return self

    def __exit__(self, *exc) -> None:
        engine._ISSUE.update(self._saved)


def _piece(pattern: str, call: int, j: int, r: int) -> torch.Tensor:
    n = PATTERNS[pattern](call, j, r)
    return torch.arange(n, dtype=torch.float32) + 1000 * j + 100 * r + 10_000 * call


def _catch(fn, *args) -> object:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the test compares type and text
        return (type(exc).__name__, isinstance(exc, ValueError), str(exc))
    return None


def _a2a_rank(patterns: list[str]) -> dict:
    rank, ws = hwdist.get_rank(), hwdist.get_world_size()
    # a backend with its own all_to_all: torch's contract (each rank's outputs give the sizes), no agreement
    native = registry.resolve(None).plan("all_to_all", torch.float32).native_op == "all_to_all"
    out: dict = {"native": native}
    for pattern in patterns:
        group = torch.distributed.new_group(list(range(ws)))  # a fresh history per pattern
        steps = []
        for call in range(CALLS):
            ins = [_piece(pattern, call, rank, r) for r in range(ws)]
            outs = [torch.full((PATTERNS[pattern](call, j, rank),), -1.0) for j in range(ws)]
            with Issued() as counted:
                hwdist.all_to_all(outs, ins, group)
            ok = all(torch.equal(outs[j], _piece(pattern, call, j, rank)) for j in range(ws))
            steps.append((ok, counted.n))
        hist = _sizes.history(group, "all_to_all")
        out[pattern] = {"steps": steps, "hist": (hist.hits, hist.redos, hist.explicit)}
    # async: the same result through the handle
    ins = [_piece("repeat", 0, rank, r) for r in range(ws)]
    outs = [torch.empty(PATTERNS["repeat"](0, j, rank)) for j in range(ws)]
    for _ in range(3):
        hwdist.all_to_all(outs, ins, async_op=True).wait()
    out["async"] = all(torch.equal(outs[j], _piece("repeat", 0, j, rank)) for j in range(ws))
    # one rank's split table disagrees with its peers': in the steady state and on a fresh history
    out["errors"] = {}
    for case in () if native else ("steady", "first", "dtype"):
        group = torch.distributed.new_group(list(range(ws)))
        if case != "first":
            for _ in range(3):
                hwdist.all_to_all([torch.empty(4) for _ in range(ws)], [torch.ones(4)] * ws, group)
        ins = [torch.ones(5 if (rank == ws - 1 and r == 0) else 4) for r in range(ws)]
        outs = [torch.empty(4) for _ in range(ws)]
        if case == "dtype":
            ins = [torch.ones(4, dtype=torch.float64 if rank == ws - 1 else torch.float32) for _ in range(ws)]
            outs = [torch.empty(4, dtype=ins[0].dtype) for _ in range(ws)]
        with Issued() as counted:
            err = _catch(hwdist.all_to_all, outs, ins, group)
        # the group still works afterwards
        o2 = [torch.empty(2) for _ in range(ws)]
        hwdist.all_to_all(o2, [torch.full((2,), float(rank)) for _ in range(ws)], group)
        out["errors"][case] = (err, counted.n, [t.tolist() for t in o2])
    with hwdist.verification():
        ins = [torch.ones(5 if (rank == ws - 1 and r == 0) else 4) for r in range(ws)]
        out["errors"]["verification"] = (_catch(hwdist.all_to_all, [torch.empty(4)] * ws, ins), None, None)
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_all_to_all_uneven_splits_agreed_by_prediction(dist, world_size, backend):
    ws = world_size
    results = dist(_a2a_rank, ws, backend, list(PATTERNS))
    for pattern in PATTERNS:
        hists = {r[pattern]["hist"] for r in results}
        assert len(hists) == 1, (pattern, hists)  # every rank's history moved the same way
        counts = [[n for _, n in r[pattern]["steps"]] for r in results]
        assert all(c == counts[0] for c in counts), (pattern, counts)
        for res in results:
            assert all(ok for ok, _ in res[pattern]["steps"]), (pattern, res[pattern]["steps"])
        n = counts[0]
        if results[0]["native"]:  # torch's own all_to_all: one collective on every call, no history
            assert n == [1] * CALLS, (pattern, n)
            assert hists == {(0, 0, 0)}, hists
            continue
        assert n[0] == 2, (pattern, n)  # no history: the table, then the data
        assert all(k <= 2 for k in n), (pattern, n)  # never more than the explicit exchange's two
        if pattern in ("repeat", "equal", "shrinking"):
            assert n[1:] == [1] * (CALLS - 1), (pattern, n)  # one collective per call after the first
        if pattern == "big":
            assert n == [2] * CALLS, n
        if pattern in ("growing", "alternate"):  # the history learns the growth or the period
            assert n[-4:] == [1, 1, 1, 1], n
    last = ws - 1
    for res in results:
        assert res["async"]
        errs = res["errors"]
        err = errs["verification"][0]
        assert err[0] == "CollectiveMismatch" and "verification mode" in err[2], err
        if res["native"]:  # mismatched splits are the caller's contract there (verification checks them)
            continue
        for case in ("steady", "first"):
            err, _n, after = errs[case]
            assert err is not None and err[1], (case, err)  # a ValueError on every rank
            assert f"rank {last} sends 5 elements to rank 0, which expects 4" in err[2], (case, err)
            assert err[2].startswith("all_to_all: piece sizes do not match across ranks"), err
            assert after == [[float(j)] * 2 for j in range(ws)]
        assert errs["steady"][1] == 2  # the predicted call, then the table that names the ranks
        assert errs["first"][1] == 1  # no history: the table alone (no data moves)
        err, _n, after = errs["dtype"]
        assert err is not None and "every rank must pass the same dtype" in err[2], err
        assert f"rank {last}: float64" in err[2] and after == [[float(j)] * 2 for j in range(ws)]
        err = errs["verification"][0]
        assert err[0] == "CollectiveMismatch" and "verification mode" in err[2], err
