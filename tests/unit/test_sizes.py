"""Size agreement by prediction: the pure parts (headers, framing, verdicts, the history's rules).

No process group: a "call" is simulated by giving every simulated rank's header to
``verdict``, which is exactly what every real rank does with the gathered headers.
"""

from __future__ import annotations

import random

import pytest
import torch

from hwdist import _state
from hwdist.collectives import _sizes
from hwdist.collectives._sizes import HEADER_BYTES, HEADER_DIMS, Header, Outcome, SizeHistory


@pytest.mark.parametrize(
    "t",
    [
        torch.zeros(()),
        torch.arange(6, dtype=torch.int16).reshape(2, 3),
        torch.ones(0, 5, dtype=torch.float64),
        torch.zeros((1,) * HEADER_DIMS, dtype=torch.bool),
        torch.zeros((1,) * (HEADER_DIMS + 2), dtype=torch.complex64),
    ],
)
def test_header_round_trips_through_bytes(t):
    h = Header.of(t, layout=12345)
    back = _sizes.unpack(_sizes.pack(h))
    assert back == h
    assert _sizes.pack(h).numel() == HEADER_BYTES
    assert (h.nbytes, h.numel, h.ndim) == (t.numel() * t.element_size(), t.numel(), t.dim())
    assert _sizes.dtype_name(h.dtype) == str(t.dtype).replace("torch.", "")
    if t.dim() <= HEADER_DIMS:
        assert back.shape == t.shape
    else:
        assert back.shape is None  # the shape does not fit: the verdict makes the call redo


def test_bytes_header_and_unframed_garbage():
    h = Header.of_bytes(1000, layout=7)
    assert (h.fits, h.shape, _sizes.dtype_name(h.dtype)) == (1000, None, "bytes")
    with pytest.raises(ValueError, match="not a size header"):
        _sizes.unpack(torch.zeros(HEADER_BYTES, dtype=torch.uint8))


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 4096, 4097, 10_000, 1 << 20, (1 << 20) + 1, 123_456_789])
def test_capacity_is_aligned_and_close(n):
    cap = _sizes.capacity_for(n)
    assert cap >= max(n, 1) and cap % 64 == 0
    assert cap <= max(n, 1) + 63 if n <= 4096 else cap <= n * 1.125
    assert _sizes.capacity_for(cap) == cap  # a bucket is its own bucket


def _bytes_of(t):
    return t.reshape(-1).view(torch.uint8)


def test_frame_unframe_keeps_each_ranks_bytes_up_to_the_capacity():
    gave = [torch.arange(n, dtype=torch.int32) + 100 * r for r, n in enumerate([3, 40, 17])]
    cap = 64  # rank 1 (160 bytes) is over
    rows = torch.stack([_sizes.frame(_bytes_of(t), Header.of(t), cap) for t in gave])
    headers, payloads = _sizes.unframe(rows)
    assert [h.numel for h in headers] == [3, 40, 17]
    for t, p in zip(gave, payloads):
        want = _bytes_of(t)[:cap]
        assert torch.equal(p, want)


def test_verdict_held_redo_and_the_same_error_everywhere():
    a, b = torch.zeros(10), torch.zeros(30)
    hs = [Header.of(a), Header.of(b)]
    held = _sizes.verdict("all_gather", hs, 128)
    assert held.held and held.largest == 120 and held.over == ()
    redo = _sizes.verdict("all_gather", hs, 64)
    assert redo.outcome is Outcome.REDO and redo.over == (1,) and redo.tail_width == 64
    assert "rank 1 (120 bytes) over the predicted 64 bytes" in redo.reason
    explicit = _sizes.verdict("all_gather", hs, None)
    assert explicit.held and explicit.capacity is None

    bad = [Header.of(a), Header.of(a.to(torch.int64)), Header.of(a)]
    v = _sizes.verdict("gather", bad, 64)
    assert v.outcome is Outcome.ERROR
    err = v.error()
    assert isinstance(err, TypeError) and isinstance(err, ValueError)
    assert str(err) == (
        "gather: every rank must pass the same dtype; got rank 0: float32, rank 1: int64, rank 2: float32"
    )
    with pytest.raises(TypeError, match="same dtype"):
        v.raise_if_error()

    ndim = [Header.of(torch.zeros(2, 2)), Header.of(torch.zeros(4))]
    assert _sizes.verdict("all_gather", ndim, 64).held  # uneven shapes of any ndim are fine by default
    v2 = _sizes.verdict("all_gather", ndim, 64, same_ndim=True)
    assert v2.outcome is Outcome.ERROR and "rank 0: 2, rank 1: 1" in v2.reason

    lay = [Header.of(a, layout=1), Header.of(a, layout=2)]
    assert _sizes.verdict("all_reduce_dict", lay, 64).held
    v3 = _sizes.verdict("all_reduce_dict", lay, 64, same_layout=True)
    assert v3.outcome is Outcome.REDO and not v3.layouts_agree and "layouts differ" in v3.reason

    long = [Header.of(torch.zeros((1,) * (HEADER_DIMS + 1))), Header.of(torch.zeros(1))]
    v4 = _sizes.verdict("all_gather", long, 64)
    assert v4.outcome is Outcome.REDO and v4.long_shapes == (0,) and v4.over == ()


def _simulate(hist, per_rank_sizes):
    """One call: every rank's size in bytes -> (collectives it cost, capacity, verdict), the history moved."""
    cap = hist.predict()
    hs = [Header.of_bytes(n) for n in per_rank_sizes]
    v = _sizes.verdict("op", hs, cap)
    hist.record(v)
    if cap is None:
        return 2, cap, v  # headers, then data
    return (1 if v.held else 2), cap, v


def _run(sizes_per_call, world=3):
    hist = SizeHistory()
    log = [_simulate(hist, s) for s in sizes_per_call]
    return hist, log


def test_equal_sizes_cost_one_collective_after_the_first_call():
    hist, log = _run([[4096] * 3] * 20)
    assert [c for c, _, _ in log] == [2] + [1] * 19
    assert all(cap == 4096 for _, cap, _ in log[1:])


def test_uneven_sizes_pad_to_the_largest_only():
    hist, log = _run([[1000, 2000, 1500]] * 10)
    assert all(c == 1 for c, _, _ in log[1:])
    assert all(cap is not None and 2000 <= cap <= 2 * 2000 for _, cap, _ in log[1:])


def test_alternating_sizes_are_predicted_by_phase_within_2x():
    small, big = 1000, 64_000
    calls = [[small] * 3 if i % 2 == 0 else [big] * 3 for i in range(30)]
    hist, log = _run(calls)
    steady = log[6:]
    assert all(c == 1 for c, _, _ in steady), hist
    for (_, cap, v) in steady:
        # never pads the small call to the big one
        assert cap is not None and v.largest <= cap <= 2 * v.largest


def test_linear_growth_is_extrapolated():
    calls = [[1000 + 100 * i + r for r in range(3)] for i in range(40)]
    hist, log = _run(calls)
    assert sum(c for c, _, _ in log[3:]) == len(log[3:])  # every call after the first few: one collective


def test_shrinking_sizes_never_miss_and_follow_down():
    calls = [[max(64_000 >> i, 64)] * 3 for i in range(12)]
    hist, log = _run(calls)
    assert all(v.held for _, _, v in log)
    # the capacity follows the size down: at most 2x the previous call's size, and equal once it settles
    for i in range(1, len(log)):
        cap = log[i][1]
        assert cap is None or cap <= 2 * _sizes.capacity_for(log[i - 1][2].largest)


def test_random_sizes_cost_no_more_collectives_than_the_explicit_exchange():
    rng = random.Random(0)
    calls = [[rng.randrange(1, 200_000) for _ in range(3)] for _ in range(300)]
    hist, log = _run(calls)
    assert all(c <= 2 for c, _, _ in log)  # today's explicit exchange: 2 collectives per call
    assert hist.redos + hist.hits + hist.explicit == 300


def test_two_misses_in_a_row_back_off_doubling():
    hist = SizeHistory()
    _simulate(hist, [100])  # explicit, seeds the history
    skipped = []
    size = 100
    for _ in range(3):
        for _ in range(2):  # two misses: each call 4x the last
            size *= 4
            c, cap, v = _simulate(hist, [size])
            assert cap is not None and v.outcome is Outcome.REDO
        n = 0
        while hist.predict() is None:
            _simulate(hist, [size])  # explicit calls at a steady size
            n += 1
        skipped.append(n)
    assert skipped == [4, 8, 16]
    _simulate(hist, [size])  # a hit resets the backoff
    assert hist.backoff == _sizes.BACKOFF_START


def test_sizes_above_the_limit_are_never_predicted():
    hist, log = _run([[16 << 20] * 2] * 5)
    assert all(cap is None for _, cap, _ in log)
    assert hist.predict(limit=32 << 20) == _sizes.capacity_for(16 << 20)


def test_route_by_capacity():
    assert _sizes.route(None) == "explicit"
    assert _sizes.route(_sizes.IN_BAND_MAX_BYTES) == "in_band"
    assert _sizes.route(_sizes.IN_BAND_MAX_BYTES + 64) == "beside"


def test_errors_leave_the_history_alone():
    hist = SizeHistory()
    _simulate(hist, [100, 100])
    before = (list(hist.sizes), hist.hits, hist.redos, hist.explicit)
    v = _sizes.verdict("op", [Header.of(torch.zeros(4)), Header.of(torch.zeros(4, dtype=torch.int32))], 64)
    hist.record(v)
    assert (list(hist.sizes), hist.hits, hist.redos, hist.explicit) == before


def test_history_lives_in_the_group_state():
    group = object.__new__(type("G", (), {}))
    h = _sizes.history(group, "all_gather")
    assert _sizes.history(group, "all_gather") is h
    assert _sizes.history(group, "all_gather", ("dst", 0)) is not h
    _state.clear()
    assert _sizes.history(group, "all_gather") is not h


def test_group_state_is_one_typed_object_with_declared_fields():
    """Every per-group cache is a declared field: a misspelt field fails in mypy, not at run time."""
    import dataclasses

    st = _state.of(None)
    assert {f.name for f in dataclasses.fields(st)} == {
        "verify_seq", "all_reduce_dict", "sizes", "gathers", "object_records", "reducers", "flight",
        "torch_hooks",
    }
    st.sizes[("probe",)] = 1
    assert _state.of(None) is st
    _state.clear()
    assert _state.of(None) is not st and _state.of(None).sizes == {}
