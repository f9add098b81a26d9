"""``hwdist.compat.megengine``: ``megengine.distributed.helper``'s documented behaviour, on real ranks.

Written from MegEngine's helper source and docstrings: ``get_offsets`` lays
shapes end to end as ``[begin, end]`` pairs; ``param_pack_split``/
``param_pack_concat`` follow their doc examples (ten ``int32`` ones, split
into ``(1,)`` and ``(3, 3)``); ``pack_allreduce_split`` sums over the group and
divides by its size for ``'mean'``; ``AllreduceCallback(reduce_method, group,
backend)`` asserts a sum/mean method, packs gradients per dtype, reduces a
bucket at once when it passes 10 MB and the rest after backward, and returns
futures that hold the reduced gradient after the flush. MegEngine is not
installed here: expected gradients are computed on each rank from every rank's
data (a local reference), never by a collective.
"""

from __future__ import annotations

import time

import pytest
import torch

import hwdist
import hwdist.compat.megengine as helper
from hwdist.collectives import call_entry
from hwdist.testing.pytest_plugin import one_backend, world_sizes

pytestmark = pytest.mark.dist


def test_packing_documented_examples():
    assert helper.get_offsets([(1,), (3, 3)]) == [0, 1, 1, 10]
    assert helper.get_offsets([(2, 2), (), (5,)]) == [0, 4, 4, 5, 5, 10]
    b, c = helper.param_pack_split(torch.ones(10, dtype=torch.int32), [0, 1, 1, 10], [(1,), (3, 3)])
    assert (b.shape, c.shape, c.dtype) == (torch.Size([1]), torch.Size([3, 3]), torch.int32)
    assert c.tolist() == [[1, 1, 1]] * 3
    (scalar,) = helper.param_pack_split(torch.tensor([4.0]), [0, 1], [()])
    assert scalar.shape == torch.Size([1])  # an empty shape comes back as (1,)
    a, b = torch.ones(1, dtype=torch.int32), torch.ones(3, 3, dtype=torch.int32)
    offsets_val = [0, 1, 1, 10]
    packed = helper.param_pack_concat([a, b], torch.tensor(offsets_val), offsets_val)
    assert (packed.tolist(), packed.dtype) == ([1] * 10, torch.int32)
    # round trip with distinct values
    xs = [torch.arange(4.0).reshape(2, 2), torch.tensor([9.0]), torch.arange(3.0)]
    shapes = [tuple(x.shape) for x in xs]
    offs = helper.get_offsets(shapes)
    back = helper.param_pack_split(helper.param_pack_concat(xs, torch.tensor(offs), offs), offs, shapes)
    assert all(torch.equal(x, y) for x, y in zip(xs, back))


def test_packing_bad_offsets():
    with pytest.raises(ValueError, match="offsets must hold 2 \\* 2 = 4 values"):
        helper.param_pack_split(torch.ones(10), [0, 10], [(1,), (3, 3)])
    with pytest.raises(ValueError, match="input 1 has 9 elements but its range \\[1, 5\\) holds 4"):
        helper.param_pack_concat([torch.ones(1), torch.ones(3, 3)], None, [0, 1, 1, 5])
    with pytest.raises(ValueError, match="outside the input's 10 elements"):
        helper.param_pack_split(torch.ones(10), [0, 11], [(11,)])
    with pytest.raises(TypeError, match="one dtype"):
        helper.param_pack_concat([torch.ones(1), torch.ones(1, dtype=torch.int32)], None, [0, 1, 1, 2])


def test_callback_needs_a_method_and_a_group():
    with pytest.raises(AssertionError, match="reduce_method should be sum or mean, got 'max'"):
        helper.AllreduceCallback("max")
    assert not hwdist.is_distributed()
    with pytest.raises(AssertionError, match="please call init_process_group first"):
        helper.make_allreduce_cb("sum")
    assert helper.make_allreduce_cb is helper.AllreduceCallback
    assert helper.PACK_THRESHOLD == 10 * 1024 * 1024


class _Calls:
    """Records every public collective's name and first tensor's element count (hwdist's call observers)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def begin(self, op, group, args, kwargs):
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        self.seen.append((op, -1 if first is None else first.numel()))

    def end(self, token, error):
        pass


def _grads(rank: int, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Rank ``rank``'s gradients of ``params`` for its own data (no collective)."""
    g = torch.Generator().manual_seed(100 + rank)
    for p in params:
        p.grad = None
    loss = sum(((torch.randn(p.shape, generator=g, dtype=p.dtype) * p) ** 2).sum() for p in params)
    loss.backward()
    return [p.grad.clone() for p in params]


def rank_megengine_ops(big: int) -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}
    xs = [torch.tensor([r + 1.0, 2.0 * r]), torch.tensor([[float(r)]])]
    out["pack_sum"] = [
        t.tolist() for t in helper.pack_allreduce_split(xs, [(2,), (1, 1)], helper.WORLD, "sum")
    ]
    out["pack_mean"] = [t.tolist() for t in helper.pack_allreduce_split(xs, [(2,), (1, 1)], None, "mean")]
    out["inputs_kept"] = [t.tolist() for t in xs]
    # a model with float32 and float64 parameters; two float32 ones above the 10 MB threshold
    params = [
        torch.nn.Parameter(torch.linspace(-1, 1, big)),
        torch.nn.Parameter(torch.full((3,), 0.5)),
        torch.nn.Parameter(torch.linspace(1, 2, big)),
        torch.nn.Parameter(torch.tensor([0.25, -1.5], dtype=torch.float64)),
    ]
    expected = [sum(gs) / ws for gs in zip(*(_grads(q, params) for q in range(ws)))]
    for method in ("mean", "sum"):
        cb = helper.make_allreduce_cb(method.upper())
        futures: dict[int, helper.TensorFuture] = {}
        early: list[str] = []

        def hook_for(i, p, cb=cb, futures=futures, early=early):
            def hook(grad):
                futures[i] = cb(p, grad)
                try:  # not resolved while backward runs
                    futures[i].get()
                except RuntimeError as exc:
                    early.append(str(exc))
                return None

            return hook

        handles = [p.register_hook(hook_for(i, p)) for i, p in enumerate(params)]
        calls = _Calls()
        call_entry.add_observer(calls)
        try:
            own = _grads(r, params)
        finally:
            call_entry.remove_observer(calls)
            for h in handles:
                h.remove()
        scale = 1 if method == "mean" else ws
        out[method] = {
            "ok": all(torch.allclose(futures[i].get(), e * scale, atol=1e-5) for i, e in enumerate(expected)),
            "grad_untouched": all(torch.equal(p.grad, g) for p, g in zip(params, own)),
            "dtypes": [futures[i].get().dtype for i in range(len(params))],
            "early": len(early),
            "calls": calls.seen,
        }
    # attach(): .grad receives the reduced value, accumulating over two backward passes
    cb = helper.AllreduceCallback("mean", helper.WORLD)
    cb.attach(params[1:])
    for p in params:
        p.grad = None
    for _ in range(2):
        g = torch.Generator().manual_seed(100 + r)
        sum(((torch.randn(p.shape, generator=g, dtype=p.dtype) * p) ** 2).sum() for p in params).backward()
    out["attach"] = all(torch.allclose(p.grad, 2 * e, atol=1e-5) for p, e in zip(params[1:], expected[1:]))
    # bcast_list_ and synchronized
    ts = [torch.tensor([float(r)]), torch.tensor([r, r + 1])]
    helper.bcast_list_(ts)
    out["bcast"] = [t.tolist() for t in ts]
    seen = []

    @helper.synchronized
    def work(x):
        seen.append(x)
        return x * 2

    out["synchronized"] = (work(r), seen)
    helper.check_fork_safe("spawn")
    return out


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", world_sizes())
def test_megengine_helpers_on_ranks(dist, world_size, backend):
    ws = world_size
    big = 10 * 1024 * 1024 // 4 + 64  # float32 elements: just above 10 MB
    for r, res in enumerate(dist(rank_megengine_ops, world_size, backend, big)):
        total = sum(range(1, ws + 1))
        assert res["pack_sum"] == [[float(total), 2.0 * sum(range(ws))], [[float(sum(range(ws)))]]]
        flat_mean = res["pack_mean"][0] + res["pack_mean"][1][0]
        assert flat_mean == pytest.approx([total / ws, 2.0 * sum(range(ws)) / ws, sum(range(ws)) / ws])
        assert res["inputs_kept"] == [[r + 1.0, 2.0 * r], [[float(r)]]]
        for method in ("mean", "sum"):
            got = res[method]
            assert got["ok"] and got["grad_untouched"], (r, method)
            assert got["dtypes"] == [torch.float32, torch.float32, torch.float32, torch.float64]
            assert got["early"] == 4  # every future raised while backward ran
            reduces = sorted(n for op, n in got["calls"] if op == "all_reduce")
            if ws > 1:
                # each big float32 gradient passes 10 MB and is reduced at once (the small one rides with
                # one of them or goes at the flush); float64 goes at the flush: 3 or 4 packed all-reduces
                assert sorted(n for n in reduces if n >= big) in ([big, big], [big, big + 3])
                assert 2 in reduces  # the float64 bucket
                assert len(reduces) in (3, 4)
        assert res["attach"]
        assert res["bcast"] == [[0.0], [0, 1]]
        assert res["synchronized"] == (2 * r, [r])


def rank_callback_outside_backward() -> str:
    cb = helper.AllreduceCallback("sum")
    try:
        cb(torch.ones(1), torch.ones(1))
    except AssertionError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("backend", one_backend())
def test_callback_outside_backward_asserts(dist, backend):
    (text,) = dist(rank_callback_outside_backward, 1, backend)
    assert "call it during backward" in text


def rank_pack_mismatch(case: str) -> tuple:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    last = r == ws - 1
    if case == "bad_offsets":  # the last rank's tensor does not fit its shape: it raises, the others too
        args = ([torch.ones(3 if last else 2)], [(2,)], None, "sum")
    elif case == "not_a_tensor":  # the last rank packs a string
        args = (["x" if last else torch.ones(2)], [(2,)], None, "sum")
    elif case == "bad_method":  # MegEngine would sum silently
        args = ([torch.ones(2)], [(2,)], None, "max" if last else "sum")
    elif case == "different_method":  # both valid, but the ranks would divide differently
        args = ([torch.ones(2)], [(2,)], None, "mean" if last else "sum")
    else:  # the ranks pack different sizes: an all-reduce of them would not match
        args = ([torch.ones(3 if last else 2)], [(3,) if last else (2,)], None, "sum")
    start = time.monotonic()
    try:
        helper.pack_allreduce_split(*args)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return None, "", 0.0


@pytest.mark.parametrize(
    "case", ["bad_offsets", "not_a_tensor", "bad_method", "different_method", "different_sizes"]
)
@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_pack_allreduce_split_bad_input_raises_on_every_rank(dist, world_size, backend, case):
    wanted = {
        "bad_offsets": "input 0 has 3 elements but its range [0, 2) holds 2",
        "not_a_tensor": "pack_list[0] must be a torch.Tensor, got str",
        "bad_method": "reduce_method must be 'sum' or 'mean', got 'max'",
        "different_method": "or their reduce_method differs",
        "different_sizes": "packed buffers differ in size or dtype",
    }
    for r, (name, text, took) in enumerate(dist(rank_pack_mismatch, world_size, backend, case)):
        assert name is not None, f"rank {r} did not raise"
        assert took < 10
        assert wanted[case] in text, (r, text)
