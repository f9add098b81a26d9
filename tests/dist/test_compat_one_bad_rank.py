"""One rank's bad or different argument in the compat modules: every rank raises, within seconds.

The last rank passes what the others do not (an ``OrderedDict`` where they pass
a ``dict``, an unpicklable object, a non-tensor, another ``src``, dtype,
``to_float`` or ``group``). Every rank must raise a clear error naming the
problem (the bad rank its own, the others a ``CollectiveArgumentError``), none
may wait for the group timeout and no process may abort; the group stays usable.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import pytest
import torch

import hwdist
import hwdist.compat.legacy as legacy
import hwdist.compat.megengine as meg
import hwdist.compat.vis4d as vis4d
from hwdist.testing.pytest_plugin import backends

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow


def _cases(tmp: str, last: bool, r: int, ws: int) -> dict:
    f32 = torch.ones(2)
    return {
        "vis4d_ordered_vs_dict": lambda: vis4d.all_reduce_dict(
            OrderedDict(a=torch.ones(1)) if last else {"a": torch.ones(1)}
        ),
        "vis4d_unpicklable": lambda: vis4d.all_gather_object_cpu(
            threading.Lock() if last else {"r": r}, tmpdir=tmp, rank_zero_return_only=False
        ),
        "vis4d_pad_non_tensor": lambda: vis4d.pad_to_largest_tensor([1, 2] if last else torch.ones(2)),
        "vis4d_mean_non_tensor": lambda: vis4d.reduce_mean(1.0 if last else f32),
        "vis4d_mean_dtype": lambda: vis4d.reduce_mean(torch.ones(2, dtype=torch.float64) if last else f32),
        "vis4d_broadcast_src_range": lambda: vis4d.broadcast({"r": r}, src=ws if last else 0),
        "vis4d_broadcast_src_other": lambda: vis4d.broadcast({"r": r}, src=1 if last else 0),
        "vis4d_dict_dtype": lambda: vis4d.all_reduce_dict(
            {"a": torch.ones(2, dtype=torch.float64 if last else torch.float32)}, to_float=False
        ),
        "vis4d_dict_to_float": lambda: vis4d.all_reduce_dict(
            {"a": torch.ones(2, dtype=torch.int32)}, to_float=not last
        ),
        "legacy_broadcast_src": lambda: legacy.broadcast_multigpu([torch.ones(2)], 1 if last else 0),
        "megengine_group": lambda: meg.pack_allreduce_split(
            [torch.ones(2)], [(2,)], "x" if last else None, "sum"
        ),
    }


#: case -> (text every rank's message holds, the bad rank's exception type)
WANT = {
    "vis4d_ordered_vs_dict": (
        "passed an OrderedDict where rank 0 passed a dict", hwdist.CollectiveArgumentError
    ),
    "vis4d_unpicklable": ("data cannot be pickled (TypeError", hwdist.CollectiveArgumentError),
    "vis4d_pad_non_tensor": ("tensor must be a torch.Tensor, got list", TypeError),
    "vis4d_mean_non_tensor": ("tensor must be a torch.Tensor, got float", TypeError),
    "vis4d_mean_dtype": ("reduce_mean: the ranks disagree on the tensor's shape and dtype", ValueError),
    "vis4d_broadcast_src_range": ("broadcast: src must be a rank in [0, ", ValueError),
    "vis4d_broadcast_src_other": ("broadcast: the ranks disagree on src", ValueError),
    "vis4d_dict_dtype": ("differ in shape or dtype", ValueError),
    "vis4d_dict_to_float": ("or their to_float or reduce_op differ", ValueError),
    "legacy_broadcast_src": ("broadcast_multigpu: the ranks disagree on src", ValueError),
    "megengine_group": ("group must be a torch.distributed.ProcessGroup or None (WORLD), got str", TypeError),
}


def _one_bad_rank(tmp: str) -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    last = r == ws - 1
    out = {}
    for case in sorted(WANT):  # one after the other on the same ranks: each must leave the group usable
        start = time.monotonic()
        err = None
        try:
            _cases(f"{tmp}/{case}", last, r, ws)[case]()
        except Exception as exc:  # noqa: BLE001 - the test compares type and text
            err = (type(exc).__mro__, str(exc))
        took = time.monotonic() - start
        t = torch.ones(1)
        hwdist.all_reduce(t)  # the group is still usable
        out[case] = {"err": err, "took": took, "after": t.item()}
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("ws", [2, 3])
def test_one_bad_rank_in_the_compat_modules_raises_on_every_rank(dist, ws, backend, tmp_path):
    for r, per_case in enumerate(dist(_one_bad_rank, ws, backend, str(tmp_path))):
        for case, (text, bad_type) in WANT.items():
            res = per_case[case]
            assert res["err"] is not None, (case, r, res)
            mro, msg = res["err"]
            assert text in msg, (case, r, msg)  # the others' messages carry the bad rank's, or the difference
            assert (bad_type if r == ws - 1 else hwdist.CollectiveArgumentError) in mro, (case, r, mro)
            assert res["took"] < 10, (case, r, res["took"])
            assert res["after"] == ws, (case, r, res)
