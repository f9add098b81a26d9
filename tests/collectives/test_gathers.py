"""The tensor gathers with sizes agreed in the header round, on real ranks.

``all_gather`` (default and ``same_shape=True``), ``gather`` and
``pad_to_largest_tensor`` on gloo and the emulated accelerator (whose process
group refuses what its driver declares unsupported, so its cast and byte-view
plans run for real), at 2 and 3 ranks, with shapes that stay, differ, grow,
shrink, alternate and cross the in-band limit, plus 0-d, non-contiguous,
complex, bfloat16 and >8-dim tensors. Every rank returns what it got; the
expected values are computed here from the rank numbers alone. The torch-level
collectives each call issues are counted by wrapping the real
``torch.distributed`` functions (a counter around them; nothing is faked), to
show two collectives per uneven call (the header round, then the data), with
verification on or off. A rank with another dtype must give every rank the
same error, never a hang (the harness's timeouts).
"""

from __future__ import annotations

import hashlib

from typing import Any

import pytest
import torch

import hwdist
from hwdist.testing.pytest_plugin import backends, world_sizes

from tests.programs._counting import Counter

pytestmark = pytest.mark.dist

CALLS = 8


def _shape(pattern: str, call: int, rank: int) -> tuple[int, ...]:
    if pattern == "equal":
        return (64, 16)  # 4 KiB of float32: in band
    if pattern == "equal_1m":
        return (256, 1024)  # 1 MiB: the header beside the data
    if pattern == "uneven":
        return (3 + 5 * rank, 4)
    if pattern == "growing":
        return (10 + 7 * call + rank, 3)
    if pattern == "shrinking":
        return (max(400 - 37 * call - rank, 0), 2)
    if pattern == "alternating":
        return (2000 + rank,) if call % 2 else (5, rank + 1)
    if pattern == "big_and_small":  # 1.2 MB every third call: crosses the in-band limit both ways
        return ((300_000 if call % 3 == 0 else 17) + rank,)
    if pattern == "one_rank_over":  # equal, then rank 1 alone over the prediction at call 5
        return (100 + (50 if call == 5 and rank == 1 else 0),)
    if pattern == "all_jump":  # equal, then every rank 3x over the prediction at call 5 (the same headers)
        return (100 if call < 5 else 300,)
    if pattern == "ndim_differs":
        return (2, rank + 1) if rank % 2 else (rank + 3,)
    if pattern == "deep":  # more dims than the header carries
        return (1,) * 9 + (2, rank + 1)
    if pattern == "scalar":
        return ()
    raise KeyError(pattern)


PATTERNS = [
    "equal",
    "equal_1m",
    "uneven",
    "growing",
    "shrinking",
    "alternating",
    "big_and_small",
    "one_rank_over",
    "all_jump",
    "ndim_differs",
    "deep",
    "scalar",
]


def _value(pattern: str, call: int, rank: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    shape = _shape(pattern, call, rank)
    n = 1
    for d in shape:
        n *= d
    base = (torch.arange(n) % 251 + 7 * rank + call).to(torch.float64)
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype).reshape(shape)
    return base.to(dtype).reshape(shape)


def _as_list(t: torch.Tensor) -> Any:
    """The tensor's values (small ones) or an exact digest of its bytes (large ones), dtype and shape.

    Results travel back from every rank (pickled through pipes, or allgathered under mpiexec); a
    1 MiB tensor as a list of floats is ~8 MB of Python objects, so large ones travel as a digest.
    """
    if t.numel() > 4096:
        data = t.detach().contiguous().reshape(-1)
        if data.dtype == torch.bool:
            data = data.to(torch.uint8)
        raw = data.view(torch.uint8)
        return ["sha256:" + hashlib.sha256(raw.numpy().tobytes()).hexdigest(), str(t.dtype), list(t.shape)]
    if t.is_complex():
        return [t.real.double().tolist(), t.imag.double().tolist(), str(t.dtype), list(t.shape)]
    return [t.double().tolist(), str(t.dtype), list(t.shape)]


def _gathers_rank(patterns: list[str]) -> dict:
    from hwdist import _state

    _state.clear()
    rank, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}
    counter = Counter()
    try:
        for pattern in patterns:
            got, counts = [], []
            for call in range(CALLS):
                before = counter.n
                a = hwdist.all_gather(_value(pattern, call, rank))
                counts.append(counter.n - before)
                g = hwdist.gather(_value(pattern, call, rank), dst=ws - 1)
                p = hwdist.pad_to_largest_tensor(_value(pattern, call, rank))
                got.append(([_as_list(x) for x in a], [_as_list(x) for x in g], p[0], _as_list(p[1])))
            out[pattern] = {"got": got, "counts": counts}
        # dtypes and layouts the plans handle differently, each over a few calls
        forms: dict = {}
        for name, dtype in (
            ("complex64", torch.complex64),
            ("bfloat16", torch.bfloat16),
            ("int16", torch.int16),
            ("bool", torch.bool),
        ):
            forms[name] = [
                [_as_list(x) for x in hwdist.all_gather(_value("uneven", c, rank, dtype))] for c in range(3)
            ]
        nc = _value("uneven", 0, rank).t()  # non-contiguous
        forms["noncontiguous"] = [[_as_list(x) for x in hwdist.all_gather(nc)] for _ in range(3)]
        forms["async"] = [
            [_as_list(x) for x in hwdist.all_gather(_value("uneven", c, rank), async_op=True).wait()]
            for c in range(3)
        ]
        forms["async_is_handle"] = type(hwdist.all_gather(torch.zeros(1), async_op=True)).__name__
        out["forms"] = forms
        # one rank with another dtype: verification's CollectiveMismatch, and without it the gathers'
        # own TypeError, on every rank
        errors = []
        for verified in (True, False):
            bad = torch.zeros(5, dtype=torch.int64 if rank == 1 else torch.float32)
            with hwdist.verification(verified):
                for fn in (hwdist.all_gather, lambda t: hwdist.gather(t, dst=0), hwdist.pad_to_largest_tensor):  # noqa: E501
                    try:
                        fn(bad)
                        errors.append(None)
                    except Exception as exc:  # noqa: BLE001 - the test compares type and text
                        errors.append((type(exc).__name__, str(exc)))
        out["errors"] = errors
        unverified = []
        with hwdist.verification(False):
            for call in range(3):
                before = counter.n
                hwdist.all_gather(_value("uneven", call, rank))
                unverified.append(counter.n - before)
        out["unverified counts"] = unverified
        out["after"] = [_as_list(x) for x in hwdist.all_gather(torch.full((rank + 1,), float(rank)))]
        # the large route: broadcasts (threshold lowered for the test) for default and same_shape
        from hwdist import registry
        from hwdist.drivers import tuning

        name = registry.resolve(None).name
        old = tuning.set_tuning(name, tuning.Tuning(gather_by_broadcast_min_bytes=64 << 10))
        try:
            big = []
            for call in range(3):
                t = _value("equal_1m", call, rank)
                before = counter.n
                a = hwdist.all_gather(t)
                s = hwdist.all_gather(t, same_shape=True)
                u = hwdist.all_gather(_value("big_and_small", 0, rank))
                big.append(
                    (
                        [_as_list(x) for x in a],
                        [_as_list(x) for x in s],
                        [_as_list(x) for x in u],
                        counter.n - before,
                    )
                )
            out["big"] = big
        finally:
            tuning.set_tuning(name, old)
    finally:
        counter.close()
    return out


def _expect(pattern: str, call: int, ws: int, dtype: torch.dtype = torch.float32) -> list:
    return [_as_list(_value(pattern, call, r, dtype)) for r in range(ws)]


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w in (2, 3)])
def test_gathers_agree_on_sizes(dist, world_size, backend):
    results = dist(_gathers_rank, world_size, backend, PATTERNS, timeout=240)
    ws = world_size
    for rank, res in enumerate(results):
        for pattern in PATTERNS:
            for call in range(CALLS):
                a, g, numels, padded = res[pattern]["got"][call]
                want = _expect(pattern, call, ws)
                assert a == want, (pattern, call, rank)
                assert g == (want if rank == ws - 1 else []), (pattern, call, rank)
                sizes = [_value(pattern, call, r).numel() for r in range(ws)]
                assert numels == sizes
                mine = _value(pattern, call, rank).reshape(-1)
                want_pad = torch.cat([mine, mine.new_zeros(max(sizes) - mine.numel())])
                assert padded == _as_list(want_pad)
        for pattern in PATTERNS:  # the header round (verification in it), then the data
            want_counts = [3 if pattern == "deep" else 2] * CALLS  # deep: its dims in one more exchange
            assert res[pattern]["counts"] == want_counts, (pattern, res[pattern]["counts"])
        assert res["unverified counts"] == [2, 2, 2]
        forms = res["forms"]
        for name, dtype in (
            ("complex64", torch.complex64),
            ("bfloat16", torch.bfloat16),
            ("int16", torch.int16),
            ("bool", torch.bool),
        ):
            assert forms[name] == [_expect("uneven", c, ws, dtype) for c in range(3)], name
        assert forms["noncontiguous"] == [[_as_list(_value("uneven", 0, r).t()) for r in range(ws)]] * 3
        assert forms["async"] == [_expect("uneven", c, ws) for c in range(3)]
        assert forms["async_is_handle"] == "CollectiveHandle"
        names = ", ".join(f"rank {r}: {'int64' if r == 1 else 'float32'}" for r in range(ws))
        fns = ["all_gather", "gather", "pad_to_largest_tensor"]
        described = "; ".join(f"rank {r}: {'int64' if r == 1 else 'float32'}@cpu" for r in range(ws))
        for fn, (kind, text) in zip(fns, res["errors"][:3]):
            assert kind == "CollectiveMismatch" and f"mismatch in '{fn}'" in text, (fn, kind, text)
            assert f"data: {described}" in text or f"tensor: {described}" in text, text
        assert res["errors"][3:] == [
            ("TypeError", f"{fn}: every rank must pass the same dtype; got {names}") for fn in fns
        ]
        assert res["after"] == [_as_list(torch.full((r + 1,), float(r))) for r in range(ws)]
        for call, (a, s, u, n) in enumerate(res["big"]):
            assert a == s == _expect("equal_1m", call, ws)
            assert u == _expect("big_and_small", 0, ws)
            # default: headers then one broadcast per rank; same_shape: verification's header round, then
            # the broadcasts
            assert n == 3 * (1 + ws), (call, n)
