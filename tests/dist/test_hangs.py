"""A rank that already knows a collective failed makes every rank raise within seconds.

Rows of docs/reliability.md's fault table (issue 14, items 9 and 12):

* a payload the destination cannot decode (refused by the restricted
  serializer, or failing in the unpickler) in ``gather_object`` and
  ``collect_results`` over the network: the destination keeps receiving
  (drains) and reports the failure in a closing status, so no sender waits
  in ``send``;
* a dead peer (SIGKILL) or a rank that left a collective by an exception
  and stays alive: the rank that noticed posts the failure on the group's
  store and every rank waiting in an hwdist object collective raises
  (``test_dead_peer_*``); the survivors of ``collect_results(tmpdir=...)``
  clean their part files and the working directory.

Every check measures how long each rank took to raise and asserts it is
far below the process-group timeout (30 s in the pooled harness, 60 s in
the dead-peer tests). Fault injection: a class whose unpickling raises on
the destination, and ``os.kill(SIGKILL)``; torch.distributed is never mocked.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Callable

import numpy as np
import pytest
import torch

import hwdist
from hwdist.testing import RankFailure, run_distributed
from hwdist.testing.pytest_plugin import backends

#: A rank must raise within this many seconds (the pooled harness's group timeout is 30 s).
FAST = 10.0


class _NotAllowed:
    """Picklable by plain pickle; refused by the restricted serializer (not on its allow-list)."""

    def __init__(self, size: int) -> None:
        self.pad = b"x" * size


def _explode_on_rank0(pad: bytes) -> bytes:
    if hwdist.get_rank() == 0:
        raise ValueError("this payload cannot be decoded on rank 0")
    return pad


class _FailsToDecode:
    """Serializes fine; unpickling it on rank 0 raises (a decode error with plain pickle)."""

    def __init__(self, size: int) -> None:
        self.pad = b"y" * size

    def __reduce__(self) -> Any:
        return (_explode_on_rank0, (self.pad,))


def _timed(fn: Callable[[], Any]) -> list:
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)[:400], time.monotonic() - start]
    return ["no error", "", time.monotonic() - start]


def _undecodable(op: str, size: int, restricted: bool) -> dict:
    """Rank 1 sends what rank 0 cannot decode; rank 2 (and any other) sends a good payload after it."""
    rank = hwdist.get_rank()
    if rank == 1:
        bad: Any = _NotAllowed(size) if restricted else _FailsToDecode(size)
    else:
        bad = {"rank": rank, "pad": np.zeros(max(1, size // 8))}
    ser = hwdist.RestrictedPickleSerializer() if restricted and rank == 0 else None
    if op == "gather_object":
        outcome = _timed(lambda: hwdist.gather_object(bad, dst=0, serializer=ser))
    else:
        outcome = _timed(lambda: hwdist.collect_results([bad], hwdist.get_world_size(), serializer=ser))
    # the group is still in step and usable
    t = torch.ones(1)
    hwdist.all_reduce(t)
    return {"outcome": outcome, "after": t.item()}


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("op", ["gather_object", "collect_results"])
def test_undecodable_payload_raises_on_every_rank_fast(dist, backend, op):
    ws = 3
    # big payloads travel point to point after the record exchange; small ones ride in it
    for size, restricted in ((200_000, True), (100, True), (200_000, False)):
        results = dist(_undecodable, ws, backend, op, size, restricted)
        kind0, msg0, secs0 = results[0]["outcome"]
        if restricted:
            assert kind0 == "UnpicklingRefused" and "_NotAllowed" in msg0, results[0]
        else:
            assert kind0 == "ValueError" and "cannot be decoded on rank 0" in msg0, results[0]
        for rank in range(1, ws):
            kind, msg, secs = results[rank]["outcome"]
            assert kind == "ObjectCollectiveError", (size, restricted, rank, results[rank])
            assert "failed on rank(s) 0: rank 0: could not decode the object from rank 1" in msg, msg
            assert secs < FAST, (rank, secs)
        assert secs0 < FAST
        assert all(r["after"] == ws for r in results)
