"""all_to_all on real ranks: even and uneven splits, every dtype, and the torch calls each call issues.

Every rank sends piece ``j -> r`` of a size that depends on the pattern, the
call, ``j`` and ``r``, with values that name the sender, the receiver and the
call; each rank returns what it got and the test computes what it should have
got from the rank numbers alone. The torch.distributed calls hwdist issues are
counted by name around torch's real functions (nothing faked):

* gloo claims all_to_all on every torch (``all_to_all_single`` works on all of
  them; the list form from 2.12, pieces of one size only): one torch call per
  all_to_all, no size exchange (each rank's outputs give what it receives, as
  torch requires). Uneven: ``all_to_all_single``; even: the list form from
  2.12, ``all_to_all_single`` before (also when only some ranks' pieces are
  all of one size: the two forms meet on the wire).
* the emulated accelerator has no all_to_all: one small all_gather of every
  rank's split table, then one all_gather of every rank's pieces.

A split table that disagrees across ranks raises the same ValueError naming the
ranks on every rank where the table is exchanged (no all_to_all), and the
verification mode's CollectiveMismatch on every backend; the group works
afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hwdist
from hwdist.testing.pytest_plugin import backends, world_sizes

pytestmark = pytest.mark.dist

PATTERNS = {
    "uneven": lambda call, j, r: 3 + 2 * j + r,
    "changing": lambda call, j, r: 5 + 40 * call + j + 3 * r,
    "empty": lambda call, j, r: (j + r) % 2 * 7,  # some pieces have no elements
    "equal": lambda call, j, r: 8,
    # rank 0's pieces all have one size, the others' do not: torch's list form there, the flat one elsewhere
    "rank0_even": lambda call, j, r: 4 if 0 in (j, r) or j == r else 5 + call,
}
DTYPES = ("float32", "float64", "int64", "uint8", "bool", "float16", "bfloat16", "complex64")
CALLS = 3
# every collective torch.distributed offers that hwdist might issue here
COUNTED = (
    "all_to_all",
    "all_to_all_single",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "all_reduce",
    "gather",
    "scatter",
)


class Calls:
    """Counts the torch.distributed calls issued, by name, around the real functions."""

    def __enter__(self) -> "Calls":
        import torch.distributed as tdist

        from hwdist import _compat

        self.seen: dict[str, int] = {}
        self._real = {n: getattr(tdist, n) for n in COUNTED if hasattr(tdist, n)}
        for name, fn in self._real.items():
            setattr(tdist, name, self._wrap(name, fn))
        self._compat = _compat.all_gather_into_tensor  # the flat all_gather picked at import
        if self._compat is not None:
            _compat.all_gather_into_tensor = self._wrap("all_gather_into_tensor", self._compat)
        return self

    def _wrap(self, name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.seen[name] = self.seen.get(name, 0) + 1
            return fn(*args, **kwargs)

        return counted

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as tdist

        from hwdist import _compat

        for name, fn in self._real.items():
            setattr(tdist, name, fn)
        _compat.all_gather_into_tensor = self._compat


def _piece(pattern: str, call: int, j: int, r: int, dtype: str = "float32") -> torch.Tensor:
    n = PATTERNS[pattern](call, j, r)
    base = (torch.arange(n, dtype=torch.float64) + 97 * j + 31 * r + 7 * call) % 251
    if dtype == "bool":
        return base.to(torch.int64) % 2 == 1
    if dtype == "complex64":
        return torch.complex(base.float(), -base.float() - j)
    return base.to(getattr(torch, dtype))


def _catch(fn: Any, *args: Any) -> Any:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the test compares type and text
        return (type(exc).__name__, isinstance(exc, ValueError), str(exc))
    return None


def _a2a_rank() -> dict:
    rank, ws = hwdist.get_rank(), hwdist.get_world_size()
    caps = hwdist.resolve().caps
    # the group's driver has a torch all_to_all (the list form, or all_to_all_single)
    out: dict = {"calls": {}, "ok": {}, "torch_a2a": "all_to_all" in caps.native_ops | caps.flat_ops}
    for pattern in PATTERNS:
        for call in range(CALLS):
            ins = [_piece(pattern, call, rank, r) for r in range(ws)]
            outs = [torch.full((PATTERNS[pattern](call, j, rank),), -1.0) for j in range(ws)]
            with Calls() as counted, hwdist.verification(False):
                hwdist.all_to_all(outs, ins)
            got = [torch.equal(outs[j], _piece(pattern, call, j, rank)) for j in range(ws)]
            out["ok"][pattern, call] = all(got)
            out["calls"][pattern, call] = counted.seen
    for dtype in DTYPES:  # uneven, then equal: each dtype exactly, whatever carries it
        for pattern in ("uneven", "equal"):
            ins = [_piece(pattern, 0, rank, r, dtype) for r in range(ws)]
            outs = [torch.empty_like(_piece(pattern, 0, j, rank, dtype)) for j in range(ws)]
            hwdist.all_to_all(outs, ins)
            out["ok"][dtype, pattern] = all(
                torch.equal(outs[j], _piece(pattern, 0, j, rank, dtype)) for j in range(ws)
            )
    ins = [_piece("uneven", 1, rank, r) for r in range(ws)]
    outs = [torch.empty(PATTERNS["uneven"](1, j, rank)) for j in range(ws)]
    with Calls() as counted:  # verified (the default): the header round, then the data
        hwdist.all_to_all(outs, ins)
    out["verified calls"] = counted.seen
    out["ok"]["verified"] = all(torch.equal(outs[j], _piece("uneven", 1, j, rank)) for j in range(ws))
    hwdist.all_to_all(outs, ins, async_op=True).wait()
    out["ok"]["async"] = all(torch.equal(outs[j], _piece("uneven", 1, j, rank)) for j in range(ws))
    # the last rank sends 5 elements to rank 0, which expects 4 (and, below, another dtype)
    errors = {}
    native = any(name.startswith("all_to_all") for name in out["calls"]["uneven", 0])
    for case in ("sizes", "dtype"):
        ins = [torch.ones(5 if (rank == ws - 1 and r == 0) else 4) for r in range(ws)]
        outs = [torch.empty(4) for _ in range(ws)]
        if case == "dtype":
            ins = [torch.ones(4, dtype=torch.float64 if rank == ws - 1 else torch.float32) for _ in range(ws)]
            outs = [torch.empty(4, dtype=ins[0].dtype) for _ in range(ws)]
        with Calls() as counted, hwdist.verification(False):
            # with an all_to_all the sizes are the caller's contract, as in torch (unchecked)
            err = None if native else _catch(hwdist.all_to_all, outs, ins)
        after = [torch.empty(2) for _ in range(ws)]
        hwdist.all_to_all(after, [torch.full((2,), float(rank)) for _ in range(ws)])
        errors[case] = (err, counted.seen, [t.tolist() for t in after])
    with hwdist.verification():
        ins = [torch.ones(5 if (rank == ws - 1 and r == 0) else 4) for r in range(ws)]
        errors["verification"] = (_catch(hwdist.all_to_all, [torch.empty(4) for _ in range(ws)], ins), {}, [])
    out["errors"] = errors
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_all_to_all_results_and_torch_calls(dist, world_size, backend):
    from hwdist import _compat

    ws, last = world_size, world_size - 1
    results = dist(_a2a_rank, ws, backend, timeout=240)
    for rank, res in enumerate(results):
        bad = [k for k, ok in res["ok"].items() if not ok]
        assert not bad, (rank, bad)
        for (pattern, call), seen in res["calls"].items():
            if backend == "gloo":  # one torch call, no size exchange; which one follows the torch version
                mine = {PATTERNS[pattern](call, rank, r) for r in range(ws)}
                mine |= {PATTERNS[pattern](call, j, rank) for j in range(ws)}
                listed = len(mine) == 1 and _compat.TORCH_VERSION >= (2, 12)
                assert seen == {"all_to_all" if listed else "all_to_all_single": 1}, (pattern, call, seen)
            elif res["torch_a2a"]:  # another backend with its own all_to_all (mpi): one torch call
                assert sum(seen.values()) == 1 and set(seen) <= {"all_to_all", "all_to_all_single"}, seen
            else:  # no all_to_all: the split tables (one all_gather), then every rank's pieces
                assert sum(seen.values()) == 2, (pattern, call, seen)
                assert set(seen) <= {"all_gather", "all_gather_into_tensor"}, seen
        assert sum(res["verified calls"].values()) == 2, res["verified calls"]
        errs = res["errors"]
        err = errs["verification"][0]
        assert err is not None and err[0] == "CollectiveMismatch" and "(verification)" in err[2], err
        assert f"rank {last} sends 5 elements to rank 0, which expects 4" in err[2], err
        for case in ("sizes", "dtype"):
            err, seen, after = errs[case]
            assert after == [[float(j)] * 2 for j in range(ws)], (case, after)  # the group still works
            if res["torch_a2a"]:  # torch's contract, as in torch: not checked outside verification mode
                continue
            assert err is not None and err[1], (case, err)  # a ValueError on every rank
            assert sum(seen.values()) == 1, (case, seen)  # the table alone: no data moved
            if case == "sizes":
                assert err[2].startswith("all_to_all: piece sizes do not match across ranks"), err
                assert f"rank {last} sends 5 elements to rank 0, which expects 4" in err[2], err
            else:
                assert "every rank must pass the same dtype" in err[2], err
                assert f"rank {last}: float64" in err[2], err
