"""all_reduce_dict and all_reduce_params on real ranks (gloo and the emulated accelerator)."""

from __future__ import annotations

import torch

import hwdist
from hwdist.testing.pytest_plugin import capture_error as _catch





def check_dict(backend: str) -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}
    counter_dtype = torch.int32 if backend == "emu" else torch.int64
    big = 0 if backend == "emu" else 2**40
    items = [
        ("loss", torch.tensor(r + 1.0)),
        ("acc", torch.tensor([r * 0.5, 1.0], dtype=torch.float64)),
        ("count", torch.tensor([big + r], dtype=counter_dtype)),
        ("half", torch.tensor([r + 1.0], dtype=torch.bfloat16)),
        ("flag", torch.tensor([r == 0])),
        ("z", torch.tensor([complex(r, 1)], dtype=torch.complex64)),
        ("grid", torch.arange(6.0).reshape(2, 3) + r),
    ]
    if r % 2:  # insertion order differs across ranks; keys are sorted
        items.reverse()
    d = dict(items)
    hwdist.all_reduce_dict(d)
    out["sum"] = {k: (v.tolist(), str(v.dtype), tuple(v.shape)) for k, v in d.items()}
    m = {"loss": torch.tensor(r + 1.0), "n": torch.tensor([-r - 1], dtype=torch.int32)}
    hwdist.all_reduce_dict(m, "mean", verify=False)
    out["mean"] = {k: v.tolist() for k, v in m.items()}
    out["empty"] = _catch(hwdist.all_reduce_dict, {})
    out["not_dict"] = _catch(hwdist.all_reduce_dict, [torch.ones(1)])
    if backend == "emu":  # int64 cannot travel reduced on emu: every rank raises, nothing is sent
        out["i64"] = _catch(hwdist.all_reduce_dict, {"a": torch.ones(1), "b": torch.ones(1, dtype=torch.int64)})
    if ws > 1:
        extra = {"a": torch.ones(2), "b": torch.ones(1)}
        if r == 1:
            extra["c"] = torch.ones(1)
        out["extra_key"] = _catch(hwdist.all_reduce_dict, extra)
        out["shape"] = _catch(hwdist.all_reduce_dict, {"a": torch.ones(3 if r == 1 else 2)})
        out["dtype"] = _catch(hwdist.all_reduce_dict, {"a": torch.ones(2, dtype=torch.float64 if r == 1 else torch.float32)})
        out["value"] = _catch(hwdist.all_reduce_dict, {"a": 1.5 if r == 1 else torch.ones(1)})
    ok = {"a": torch.tensor([1.0])}
    hwdist.all_reduce_dict(ok)
    out["healthy"] = ok["a"].item()
    return out


def test_all_reduce_dict(dist, combo):
    ws, backend = combo
    counter_dtype = "torch.int32" if backend == "emu" else "torch.int64"
    big = 0 if backend == "emu" else 2**40
    for r, got in enumerate(dist(check_dict, ws, backend, backend)):
        s = got["sum"]
        assert s["loss"] == (float(sum(i + 1 for i in range(ws))), "torch.float32", ())
        assert s["acc"] == ([sum(i * 0.5 for i in range(ws)), float(ws)], "torch.float64", (2,))
        assert s["count"] == ([ws * big + sum(range(ws))], counter_dtype, (1,))
        assert s["half"] == ([float(sum(i + 1 for i in range(ws)))], "torch.bfloat16", (1,))
        assert s["flag"] == ([True], "torch.bool", (1,))
        assert s["z"] == ([complex(sum(range(ws)), ws)], "torch.complex64", (1,))
        assert s["grid"] == ((torch.arange(6.0).reshape(2, 3) * ws + sum(range(ws))).tolist(), "torch.float32", (2, 3))
        assert got["mean"] == {"loss": sum(i + 1 for i in range(ws)) / ws, "n": [sum(-i - 1 for i in range(ws)) // ws]}
        assert got["empty"] is None
        assert got["not_dict"] == ("TypeError", "all_reduce_dict: data must be a dict of tensors, got list")
        if backend == "emu" and ws > 1:
            kind, msg = got["i64"]
            assert kind == "ValueError" and "int64" in msg and "lossless" in msg
        if ws > 1:
            assert got["extra_key"][0] == "ValueError" and "rank 1 has extra keys 'c'" in got["extra_key"][1]
            assert "key 'a' has shape (2,) on rank 0 but (3,) on rank 1" in got["shape"][1]
            assert "key 'a' has dtype float32 on rank 0 but float64 on rank 1" in got["dtype"][1]
            assert "rank 1: data['a'] must be a torch.Tensor, got float" in got["value"][1]
        assert got["healthy"] == ws


def _params(r: int, backend: str) -> list[torch.Tensor]:
    ints = torch.int32 if backend == "emu" else torch.int64
    return [
        torch.nn.Parameter(torch.full((4, 3), r + 1.0)),
        torch.nn.Parameter(torch.full((300_000,), r + 2.0)),  # >= 1 MiB: reduced in place on CPU drivers
        torch.full((5,), r + 1.0, dtype=torch.float64),
        torch.full((3,), r + 1, dtype=ints),
        torch.full((2,), r + 0.5, dtype=torch.bfloat16),
        torch.full((7,), r + 3.0),
    ]


def check_params(backend: str) -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}
    for name, kwargs in {
        "coalesced": {},
        "bucketed": {"bucket_size_mb": 0.00002},
        "one_by_one": {"coalesce": False},
        "mean": {"op": "mean"},
        "max_bucketed": {"op": "MAX", "bucket_size_mb": 1},
    }.items():
        ps = _params(r, backend)
        hwdist.all_reduce_params((p for p in ps), **kwargs)
        out[name] = [(p.detach().reshape(-1)[:3].tolist(), str(p.dtype), tuple(p.shape)) for p in ps]
    out["bad"] = _catch(hwdist.all_reduce_params, [torch.ones(1), "w"])
    return out


def test_all_reduce_params(dist, combo):
    ws, backend = combo
    ints = "torch.int32" if backend == "emu" else "torch.int64"

    def expect(reduce):
        def col(f, n, dtype, shape):
            v = reduce([f(i) for i in range(ws)])
            return ([v] * min(n, 3), dtype, shape)

        return [
            col(lambda i: i + 1.0, 12, "torch.float32", (4, 3)),
            col(lambda i: i + 2.0, 300_000, "torch.float32", (300_000,)),
            col(lambda i: i + 1.0, 5, "torch.float64", (5,)),
            col(lambda i: i + 1, 3, ints, (3,)),
            col(lambda i: i + 0.5, 2, "torch.bfloat16", (2,)),
            col(lambda i: i + 3.0, 7, "torch.float32", (7,)),
        ]

    total = expect(sum)
    for got in dist(check_params, ws, backend, backend):
        assert got["coalesced"] == total
        assert got["bucketed"] == total
        assert got["one_by_one"] == total
        mean = expect(lambda v: (sum(v) // ws) if isinstance(v[0], int) else sum(v) / ws)
        assert got["mean"] == mean
        assert got["max_bucketed"] == expect(max)
        assert got["bad"] == ("TypeError", "all_reduce_params: params[1] must be a torch.Tensor, got str")
