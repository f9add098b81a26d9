"""Tensor collectives on real ranks: gloo and the emulated accelerator, world sizes 1, 2, 3.

Correctness is checked by hwdist's own check bodies (``hwdist.checks``, the
ones ``hwdist check`` and ``tests/hardware`` run): every body builds each
rank's input from its rank number and compares every result with a value
computed from the rank numbers alone, for every dtype of its row and every
tensor form (uneven shapes, 0-d, non-contiguous views, async handles, op
spellings, ...). On 'emu' the process group itself refuses whatever its driver
declares unsupported, so every cast, byte view and emulation path is exercised
for real, and the bodies expect exactly the declared refusals.

This file adds what the bodies do not cover: bad input, refused with a clear
error on every rank.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import hwdist
from hwdist import checks
from hwdist.testing.pytest_plugin import capture_error as _catch


def run_bodies(
    dist: Callable[..., list[Any]], ws: int, backend: str, name: str, placement: str = "comm"
) -> list[tuple[checks.Row, dict[str, Any]]]:
    """Run check ``name`` on every dtype of its row; assert each row passes (or is refused as declared).

    Returns:
        ``(row, rank 0's findings)`` for each dtype.
    """
    found = []
    for dtype in checks.dtypes_of(name):
        results = dist(checks.run_check, ws, backend, name, dtype, "", placement)
        row = checks.judge(name, dtype, results, backend)
        where = f"{name} {row.dtype}, {ws} rank(s) of {backend}"
        assert row.status in ("pass", checks.REFUSED), f"{where}: {row.detail}"
        found.append((row, results[0]))
    return found


#: What the emulated accelerator's driver declares it cannot do, among what the bodies ask
#: (hwdist.testing.emulated): reduce int64 (no lossless cast) and bitwise reductions.
_EMU_INT64 = ("all_reduce", "reduce", "reduce_scatter", "all_reduce_dict")
_BITWISE = ("band", "bor", "bxor")


@pytest.mark.parametrize("name", checks.check_names())
def test_check_body(dist, combo, name):
    ws, backend = combo
    for row, found in run_bodies(dist, ws, backend, name):
        assert len(found["refused"]) == len(found["why"])
        if backend == "gloo":  # gloo moves and reduces every dtype and op the bodies use
            assert found["refused"] == [], row.detail
        if backend != "emu":
            continue
        for label, why in zip(found["refused"], found["why"]):  # nothing else is refused
            int64 = "int64" in why and "lossless" in why
            assert int64 or (label in _BITWISE and "not supported" in why), (label, why)
        # (all_reduce_dict on one rank makes no call, so there is nothing to refuse)
        if row.dtype == "int64" and name in _EMU_INT64 and (ws > 1 or name != "all_reduce_dict"):
            assert row.status == checks.REFUSED, row.detail
        if name == "all_reduce" and row.dtype in ("int32", "int8"):
            assert found["refused"] == list(_BITWISE), row.detail


# ---------------------------------------------------------------------------
# bad input: a clear error on every rank, and the group still works afterwards
# ---------------------------------------------------------------------------
def check_bad_inputs() -> dict[str, Any]:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    t = torch.ones(2)
    cases: dict[str, Any] = {
        "op": _catch(hwdist.all_reduce, t, "average"),
        "op_obj": _catch(hwdist.all_reduce, t, 3.5),
        "dict_op": _catch(hwdist.all_reduce_dict, {"a": t}, "nope"),
        "data": _catch(hwdist.all_reduce, [1.0, 2.0]),
        "gather_data": _catch(hwdist.all_gather, "x"),
        "src": _catch(hwdist.broadcast, t, ws),
        "src_type": _catch(hwdist.broadcast, t, "0"),
        "dst": _catch(hwdist.gather, t, -1),
        "reduce_dst": _catch(hwdist.reduce, t, ws + 5),
        "scatter_src": _catch(hwdist.scatter, t, None, ws),
        "rs_len": _catch(hwdist.reduce_scatter, t, [t] * (ws + 1)),
        "rs_numel": _catch(hwdist.reduce_scatter, t, torch.ones(ws * 2 + 1)),
        "a2a_len": _catch(hwdist.all_to_all, [t], [t] * (ws + 1)),
        "send_self": _catch(hwdist.send, t, r),
    }
    src = ws - 1  # a scatter list of the wrong shape, on the source rank only
    bad = [torch.zeros(3, dtype=torch.int64)] * ws if r == src else None
    cases["scatter_bad"] = _catch(hwdist.scatter, torch.zeros(2, dtype=torch.int64), bad, src)
    items = [torch.zeros(2, dtype=torch.int64)] * (ws - 1) + ["x"]  # a non-tensor item, on the source only
    cases["scatter_item"] = _catch(
        hwdist.scatter, torch.zeros(2, dtype=torch.int64), items if r == src else None, src
    )
    if ws > 1:  # a dtype mismatch is found by the shape exchange and raised on every rank
        mixed = torch.ones(2, dtype=torch.float64 if r == 1 else torch.float32)
        cases["dtype_mismatch"] = _catch(hwdist.all_gather, mixed)
    healthy = torch.tensor([1.0])
    hwdist.all_reduce(healthy)
    cases["healthy"] = healthy.item()
    return cases


def test_bad_input_raises_on_every_rank(dist, combo):
    ws, backend = combo
    src = ws - 1
    for r, got in enumerate(dist(check_bad_inputs, ws, backend)):
        kind, msg = got["scatter_bad"]
        assert kind == "ValueError"
        want = "scatter_list[0] has shape (3,)" if r == src else f"src rank {src} was invalid"
        assert want in msg, msg
        kind, msg = got["scatter_item"]  # src keeps its TypeError; the others learn only that it was bad
        if r == src:
            assert (kind, msg) == (
                "TypeError",
                f"scatter: scatter_list[{ws - 1}] must be a torch.Tensor, got str: 'x'",
            )
        else:
            assert kind == "ValueError" and f"src rank {src} was invalid" in msg, msg
        if ws > 1:
            kind, msg = got["dtype_mismatch"]
            assert kind == "TypeError" and "rank 1: float64" in msg and "rank 0: float32" in msg
        assert got["op"][0] == "ValueError" and "all_reduce: op must be one of 'sum', 'mean'" in got["op"][1]
        assert "'average'" in got["op"][1]
        assert got["op_obj"][0] == "ValueError" and "3.5" in got["op_obj"][1]
        assert got["dict_op"][0] == "ValueError"
        assert got["data"] == ("TypeError", "all_reduce: data must be a torch.Tensor, got list: [1.0, 2.0]")
        assert got["gather_data"][0] == "TypeError" and "got str" in got["gather_data"][1]
        want = f"broadcast: src must be a rank in 0..{ws - 1} (world size {ws}), got {ws}"
        assert got["src"] == ("ValueError", want)
        assert got["src_type"][0] == "TypeError" and "src must be an int rank" in got["src_type"][1]
        assert got["dst"][0] == "ValueError" and "dst must be a rank" in got["dst"][1]
        assert got["reduce_dst"][0] == "ValueError" and "reduce: dst" in got["reduce_dst"][1]
        assert got["scatter_src"][0] == "ValueError" and "scatter: src" in got["scatter_src"][1]
        want = f"reduce_scatter: input_list must hold {ws} tensors (one per rank), got {ws + 1}"
        assert got["rs_len"] == ("ValueError", want)
        assert got["rs_numel"][0] == "ValueError" and f"{ws} * 2 elements" in got["rs_numel"][1]
        assert got["a2a_len"][0] == "ValueError" and "input_list must hold" in got["a2a_len"][1]
        assert got["send_self"][0] == "ValueError" and "another rank" in got["send_self"][1]
        assert got["healthy"] == ws


@pytest.mark.parametrize("backend", ["gloo", "emu"])
def test_every_body_compares_what_it_gets(dist, backend):
    # A corrupted expected value (HWDIST_CHECK_INJECT's "fail" mode) must give a FAIL row in every body.
    for name in checks.check_names():
        dtype = checks.dtypes_of(name)[0]
        row = checks.judge(name, dtype, dist(checks.run_check, 2, backend, name, dtype, "fail"), backend)
        assert row.status == "FAIL" and "expected" in row.detail, (name, row)
