"""all_reduce_dict and all_reduce_params on real ranks (gloo and the emulated accelerator).

At the end, a row of docs/reliability.md's fault table: ``all_reduce_dict`` with a value that has
no lossless plan raises ``hwdist.PlanError`` on every rank, verified or not.
"""

from __future__ import annotations

import functools
import math
import operator
import time
from typing import Any

import pytest
import torch

import hwdist
from hwdist.testing.pytest_plugin import capture_error as _catch

from tests.programs._counting import Counter

pytestmark = pytest.mark.dist


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
        out["i64"] = _catch(
            hwdist.all_reduce_dict, {"a": torch.ones(1), "b": torch.ones(1, dtype=torch.int64)}
        )
    if ws > 1:
        extra = {"a": torch.ones(2), "b": torch.ones(1)}
        if r == 1:
            extra["c"] = torch.ones(1)
        out["extra_key"] = _catch(hwdist.all_reduce_dict, extra)
        out["shape"] = _catch(hwdist.all_reduce_dict, {"a": torch.ones(3 if r == 1 else 2)})
        out["dtype"] = _catch(
            hwdist.all_reduce_dict, {"a": torch.ones(2, dtype=torch.float64 if r == 1 else torch.float32)}
        )
        out["value"] = _catch(hwdist.all_reduce_dict, {"a": 1.5 if r == 1 else torch.ones(1)})
    ok = {"a": torch.tensor([1.0])}
    hwdist.all_reduce_dict(ok)
    out["healthy"] = ok["a"].item()
    return out


def test_all_reduce_dict(dist, combo):
    ws, backend = combo
    counter_dtype = "torch.int32" if backend == "emu" else "torch.int64"
    big = 0 if backend == "emu" else 2**40
    for got in dist(check_dict, ws, backend, backend):
        s = got["sum"]
        assert s["loss"] == (float(sum(i + 1 for i in range(ws))), "torch.float32", ())
        assert s["acc"] == ([sum(i * 0.5 for i in range(ws)), float(ws)], "torch.float64", (2,))
        assert s["count"] == ([ws * big + sum(range(ws))], counter_dtype, (1,))
        assert s["half"] == ([float(sum(i + 1 for i in range(ws)))], "torch.bfloat16", (1,))
        assert s["flag"] == ([True], "torch.bool", (1,))
        assert s["z"] == ([complex(sum(range(ws)), ws)], "torch.complex64", (1,))
        assert s["grid"] == (
            (torch.arange(6.0).reshape(2, 3) * ws + sum(range(ws))).tolist(),
            "torch.float32",
            (2, 3),
        )
        assert got["mean"] == {
            "loss": sum(i + 1 for i in range(ws)) / ws,
            "n": [sum(-i - 1 for i in range(ws)) // ws],
        }
        assert got["empty"] is None
        not_dict = "all_reduce_dict: data must be a dict of tensors, got list"
        assert got["not_dict"] == ("ArgumentAssertionError", not_dict)
        if backend == "emu" and ws > 1:
            kind, msg = got["i64"]
            assert kind == "PlanError" and "int64" in msg and "lossless" in msg  # the type all_reduce raises
        if ws > 1:  # verification (the default) names each rank's side
            def sides(*values: str) -> str:
                return "; ".join(f"rank {r}: {values[r == 1]}" for r in range(ws))

            assert got["extra_key"][0] == "CollectiveMismatch", got["extra_key"]
            assert f"data['c']: {sides('(missing)', 'float32[1]@cpu')}" in got["extra_key"][1]
            assert f"data['a']: {sides('float32[2]@cpu', 'float32[3]@cpu')}" in got["shape"][1]
            assert f"data['a']: {sides('float32[2]@cpu', 'float64[2]@cpu')}" in got["dtype"][1]
            assert got["value"][0] == "ValueError"
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
    r = hwdist.get_rank()
    out: dict = {}
    cases: dict[str, dict[str, Any]] = {
        "coalesced": {},
        "bucketed": {"bucket_size_mb": 0.00002},
        "one_by_one": {"coalesce": False},
        "mean": {"op": "mean"},
        "max_bucketed": {"op": "MAX", "bucket_size_mb": 1},
    }
    for name, kwargs in cases.items():
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


# ---------------------------------------------------------------------------
# all_reduce_dict's collectives per call: the data (one per communication dtype), plus one check
# ---------------------------------------------------------------------------
def _reduce_counted(d: dict, *args, **kwargs) -> int:
    """Runs all_reduce_dict, counting the torch.distributed collectives it issues (the real ones)."""
    c = Counter()
    try:
        hwdist.all_reduce_dict(d, *args, **kwargs)
    finally:
        c.close()
    return c.n


def _dicts(r: int, ints: torch.dtype) -> dict:
    """Dicts of several kinds; every value depends on the rank and the key's position."""
    return {
        "A": lambda: {k: torch.tensor(r + 1.0 + i) for i, k in enumerate(("loss", "acc", "lr"))},
        "B": lambda: {k: torch.tensor(r + 10.0 * (i + 1)) for i, k in enumerate(("top1", "top5"))},
        "grid": lambda: {k: torch.arange(6.0).reshape(3, 2) + r + i for i, k in enumerate("xy")},
        # non-contiguous values of two shapes: concatenated, not stacked
        "strided": lambda: {"t": (torch.arange(6.0).reshape(2, 3) + r).t(), "u": torch.full((4,), r + 1.0)},
        "mixed": lambda: {
            "f": torch.tensor(r + 0.5),
            "n": torch.tensor([r + 1, 2 * r], dtype=ints),
            "b": torch.tensor([r == 0, True]),
            "d": torch.tensor([r * 0.25], dtype=torch.float64),
        },
        "ints": lambda: {k: torch.tensor([r + 1 + i, 3], dtype=ints) for i, k in enumerate("pq")},
        # 20 KB a rank
        "big": lambda: {"w": torch.full((5000,), r + 1.0), "v": torch.full((5000,), 2.0 * r)},
    }


#: the ways a dict travels: each kind's number of flat buffers (one per communication dtype and
#: reduction; "mixed" holds float32, an integer, bool and float64 values)
BUFFERS = {"A": 1, "B": 1, "grid": 1, "strided": 1, "ints": 1, "big": 1, "mixed": 4}


def check_dict_calls(backend: str) -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    ints = torch.int32 if backend == "emu" else torch.int64
    make = _dicts(r, ints)
    out: dict = {"steps": []}
    for name in ["A", "A", "B", "A", "B"]:  # the same dict again, another one, back: the same cost
        d = make[name]()
        n = _reduce_counted(d)
        out["steps"].append((name, n, {k: v.tolist() for k, v in d.items()}))
    out["empty"] = (_reduce_counted({}), _reduce_counted({}, verify=False))
    out["ops"] = []
    bitwise = [] if backend == "emu" else [("ints", "band"), ("ints", "bor"), ("ints", "bxor")]  # emu: none
    for name, op in [
        ("A", "mean"), ("A", "max"), ("A", "min"), ("A", "product"), ("grid", "sum"), ("grid", "mean"),
        ("strided", "sum"), ("mixed", "sum"), ("mixed", "max"), ("ints", "mean"), ("big", "sum"),
        ("big", "max"), *bitwise,
    ]:  # fmt: skip
        for verify in (True, False):
            d = make[name]()
            n = _reduce_counted(d, op, verify=verify)
            result = {k: (v.tolist(), str(v.dtype), tuple(v.shape)) for k, v in d.items()}
            out["ops"].append((name, op, verify, n, result))
    if ws > 1:
        last = ws - 1
        bad = {
            "extra_key": lambda d: d.update(c=torch.tensor(1.0)),
            "renamed": lambda d: d.update(zz=d.pop("lr")),
            "shape": lambda d: d.update(lr=torch.ones(2)),
            "float64": lambda d: d.update(lr=d["lr"].double()),
            "int_in_floats": lambda d: d.update(lr=torch.tensor(3, dtype=ints)),  # stack would promote it
            "not_tensor": lambda d: d.update(lr=0.5),
        }
        out["errors"] = {}
        for case, spoil in bad.items():
            hwdist.all_reduce_dict(make["A"]())  # the same layout just before: its cached packing
            d = make["A"]()
            if r == last:
                spoil(d)
            before = dict(d)
            c = Counter()
            try:
                err = _catch(hwdist.all_reduce_dict, d)
            finally:
                c.close()
            out["errors"][case] = (err, c.n, all(d[k] is before[k] for k in before))
        d = make["A"]()
        out["errors"]["op"] = (_catch(hwdist.all_reduce_dict, d, "max" if r == last else "sum"), None, True)
    d = make["A"]()
    out["healthy"] = (_reduce_counted(d), d["loss"].item())
    return out


def test_all_reduce_dict_collectives_per_call(dist, combo):
    """One collective per flat buffer; verify=True adds one small check; a mismatch raises on every rank."""
    ws, backend = combo
    many = ws > 1
    total = sum(range(ws))

    def expect_sum(name):
        return {
            "A": {k: total + ws * (1.0 + i) for i, k in enumerate(("loss", "acc", "lr"))},
            "B": {k: total + ws * 10.0 * (i + 1) for i, k in enumerate(("top1", "top5"))},
        }[name]

    for got in dist(check_dict_calls, ws, backend, backend):
        names = [s[0] for s in got["steps"]]
        assert [s[2] for s in got["steps"]] == [expect_sum(n) for n in names]
        # verified (the default): the header round, then the buffer; the same for every dict
        assert [s[1] for s in got["steps"]] == ([2, 2, 2, 2, 2] if many else [0] * 5)
        assert got["empty"] == ((1, 0) if many else (0, 0))  # an empty dict: the header round alone
        for name, op, verify, n, result in got["ops"]:
            ranks = range(ws)
            want_n = (BUFFERS[name] + verify) if many else 0
            assert n == want_n, (name, op, verify, n)
            if name == "A":
                per_key = [[r + 1.0 + i for r in ranks] for i in range(3)]
                red = {"mean": lambda v: sum(v) / ws, "max": max, "min": min, "product": math.prod}[op]
                assert {k: v[0] for k, v in result.items()} == {
                    k: pytest.approx(red(per_key[i])) for i, k in enumerate(("loss", "acc", "lr"))
                }
            elif name == "grid":
                base = torch.arange(6.0).reshape(3, 2)
                for i, k in enumerate("xy"):
                    s = base * ws + total + ws * i
                    assert result[k] == ((s / ws if op == "mean" else s).tolist(), "torch.float32", (3, 2))
            elif name == "strided":
                t = (torch.arange(6.0).reshape(2, 3) * ws + total).t()
                assert result["t"] == (t.tolist(), "torch.float32", (3, 2))
                assert result["u"] == ([float(total + ws)] * 4, "torch.float32", (4,))
            elif name == "mixed":
                if op == "sum":
                    assert result["f"] == (total + 0.5 * ws, "torch.float32", ())
                    assert result["n"][0] == [total + ws, 2 * total]
                    assert result["b"] == ([True, True], "torch.bool", (2,))
                    assert result["d"] == ([0.25 * total], "torch.float64", (1,))
                else:
                    assert result["n"][0] == [ws, 2 * (ws - 1)]
                    assert result["b"] == ([True, True], "torch.bool", (2,))
            elif name == "big":
                red = sum if op == "sum" else max
                assert result["w"] == ([red(r + 1.0 for r in ranks)] * 5000, "torch.float32", (5000,))
                assert result["v"] == ([red(2.0 * r for r in ranks)] * 5000, "torch.float32", (5000,))
            else:  # ints
                for i, k in enumerate("pq"):
                    vals = [r + 1 + i for r in ranks]
                    want = {
                        "mean": [sum(vals) // ws, 3],
                        "band": [functools.reduce(operator.and_, vals), 3],
                        "bor": [functools.reduce(operator.or_, vals), 3],
                        "bxor": [functools.reduce(operator.xor, vals), 3 if ws % 2 else 0],
                    }[op]
                    assert result[k][0] == want and result[k][1] in ("torch.int32", "torch.int64")
        if many:
            last = ws - 1
            errs = got["errors"]
            for case, (err, n, untouched) in errs.items():
                kind = "ValueError" if case == "not_tensor" else "CollectiveMismatch"
                assert err is not None and err[0] == kind, (case, err)
                assert untouched, case  # nothing half-written on any rank
                if n is not None:  # the header round alone: every rank's side is in it
                    assert n == 1, (case, n)

            def sides(normal: str, odd: str) -> str:
                return "; ".join(f"rank {r}: {odd if r == last else normal}" for r in range(ws))

            assert f"data['c']: {sides('(missing)', 'float32[]@cpu')}" in errs["extra_key"][0][1]
            assert f"data['lr']: {sides('float32[]@cpu', '(missing)')}" in errs["renamed"][0][1]
            assert f"data['zz']: {sides('(missing)', 'float32[]@cpu')}" in errs["renamed"][0][1]
            assert f"data['lr']: {sides('float32[]@cpu', 'float32[2]@cpu')}" in errs["shape"][0][1]
            assert f"data['lr']: {sides('float32[]@cpu', 'float64[]@cpu')}" in errs["float64"][0][1]
            int_name = "int32" if backend == "emu" else "int64"
            assert f"data['lr']: {sides('float32[]@cpu', f'{int_name}[]@cpu')}" in errs["int_in_floats"][0][1]
            assert f"rank {last}: data['lr'] must be a torch.Tensor, got float" in errs["not_tensor"][0][1]
            assert f"reduce_op: {sides('sum', 'max')}" in errs["op"][0][1]
        n, loss = got["healthy"]
        assert loss == total + ws and n == (2 if many else 0)


#: Verified dicts of every dtype class and op: (dtype, ops, dict shapes). "mixed" values are
#: concatenated; values of one shape are stacked ("scalars": 0-d rows; "rows", "wide200", "wide300": 1-D).
VERIFIED = [
    (torch.float32, ("sum", "min"), ("mixed", "scalars", "rows", "wide200", "wide300")),
    (torch.float32, ("mean", "max", "product"), ("mixed",)),
    (torch.bfloat16, ("sum", "min"), ("mixed",)),
    (torch.int32, ("sum", "product", "band", "bor", "bxor"), ("mixed",)),
    (torch.int32, ("band",), ("scalars",)),
    (torch.bool, ("sum", "product"), ("mixed",)),
]


def _verified_dict(r: int, dtype: torch.dtype, more: bool = False, shape: str = "mixed") -> dict:
    """Two keys of rank ``r``'s values; ``more``: a third (another layout)."""
    if dtype == torch.bool:
        d = {"a": torch.tensor([r % 2 == 0, True]), "b": torch.tensor(r == 0)}
    elif shape == "mixed":
        d = {"a": torch.tensor([r + 1, r + 2], dtype=dtype), "b": torch.tensor(r + 3, dtype=dtype)}
    elif shape == "scalars":
        d = {"a": torch.tensor(r + 1, dtype=dtype), "b": torch.tensor(r + 3, dtype=dtype)}
    else:
        n = {"rows": 2, "wide200": 200, "wide300": 300}[shape]
        d = {"a": torch.arange(n, dtype=dtype) % 3 + r + 1, "b": torch.full((n,), r + 3, dtype=dtype)}
    if more:
        d["s"] = d["b"].clone()
    return d


def check_verified_repeats(backend: str) -> list:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out = []
    for dtype, ops, shapes in VERIFIED:
        for op in ops:
            for shape in shapes:
                if backend == "emu" and op in ("band", "bor", "bxor"):
                    continue
                out.append(_verified_row(r, ws, dtype, op, shape))
    return out


def _verified_row(r: int, ws: int, dtype: torch.dtype, op: str, shape: str) -> dict:
    row: dict = {"dtype": str(dtype), "op": op, "shape": shape, "counts": [], "values": []}

    def make(more: bool = False) -> dict:
        return _verified_dict(r, dtype, more, shape)

    def run(d: dict) -> None:
        row["counts"].append(_reduce_counted(d, op))
        row["values"].append({k: v.tolist() for k, v in d.items()})

    for _ in range(3):  # the same dict: the first call checks, then one collective a call
        run(make())
    d = make()
    if r == ws - 1:  # one rank holds another dict: every rank raises, naming the difference
        d["c"] = torch.ones(1, dtype=dtype)
    row["extra"] = _catch(hwdist.all_reduce_dict, d, op)
    run(make())  # checked again after the error, then one collective again
    run(make())
    d = make()
    if r == ws - 1:  # a bad value on one rank: every rank raises, naming it
        d["b"] = 3
    row["bad"] = _catch(hwdist.all_reduce_dict, d, op)
    run(make())
    run(make(more=True))  # every rank moves to another dict together
    run(make(more=True))
    return row


def _want(dtype: str, op: str, ws: int, more: bool, shape: str) -> dict:
    """What the reduction gives: every rank's dict built again here and reduced in Python, value by value."""
    red = {
        "sum": sum, "mean": lambda v: sum(v) / ws, "max": max, "min": min, "product": math.prod,
        "band": functools.partial(functools.reduce, operator.and_),
        "bor": functools.partial(functools.reduce, operator.or_),
        "bxor": functools.partial(functools.reduce, operator.xor),
    }[op]  # fmt: skip
    if dtype == "torch.bool":
        red = any if op == "sum" else all
    dicts = [_verified_dict(r, getattr(torch, dtype.split(".")[1]), more, shape) for r in range(ws)]
    want: dict = {}
    for k in dicts[0]:
        lists = [d[k].tolist() for d in dicts]
        if isinstance(lists[0], list):
            want[k] = [red([x[i] for x in lists]) for i in range(len(lists[0]))]
        else:
            want[k] = red(lists)
    return want


def test_verified_dict_is_two_collectives_and_names_a_difference(dist, combo):
    """Verified (the default): the header round, then the values, for every op and dtype class; another
    dict, a bad value or a different dict on one rank is seen by every rank."""
    ws, backend = combo
    if ws == 1:
        pytest.skip("a one-rank group communicates nothing")
    results = dist(check_verified_repeats, ws, backend, backend)
    for rank_rows in results:
        for row in rank_rows:
            dtype, op, counts, shape = row["dtype"], row["op"], row["counts"], row["shape"]
            case = (dtype, op, shape, counts)
            assert counts == [2] * 8, case  # the header round and one buffer, whatever came before
            for i, values in enumerate(row["values"]):
                want = _want(dtype, op, ws, i >= 6, shape)
                if dtype in ("torch.float32", "torch.bfloat16"):
                    want = {k: pytest.approx(v) for k, v in want.items()}
                assert values == want, (case, i)
            assert row["extra"][0] == "CollectiveMismatch", case
            assert "data['c']: rank 0: (missing)" in row["extra"][1], case
            assert row["bad"][0] == "ValueError", case
            assert f"rank {ws - 1}: data['b'] must be a torch.Tensor, got int" in row["bad"][1], case


# ---------------------------------------------------------------------------
# all_reduce_dict with a value that has no lossless plan: PlanError on every rank
# ---------------------------------------------------------------------------
COMBOS = [(2, "gloo"), (3, "gloo"), (2, "emu"), (3, "emu")]
IDS = [f"{ws}-{be}" for ws, be in COMBOS]
#: A bad input must reach every rank well within this (the group timeout is minutes).
FAST = 10.0


def check_dict_plan_errors() -> dict:
    out = {}
    for verify in (True, False):
        start = time.monotonic()
        # bitwise ops have no plan on floats on any backend; emu also has no int64 reduction
        try:
            hwdist.all_reduce_dict({"a": torch.ones(2), "b": torch.ones(1)}, "band", verify=verify)
        except Exception as exc:  # the type is what the test checks
            out[f"band {verify}"] = (type(exc).__name__, isinstance(exc, hwdist.PlanError), str(exc))
        if hwdist.get_backend() == "emu":
            out[f"int64 mean {verify}"] = _catch(
                hwdist.all_reduce_dict, {"n": torch.ones(2, dtype=torch.int64)}, "mean", verify=verify
            )
        out[f"took {verify}"] = time.monotonic() - start
    try:
        hwdist.all_reduce(torch.ones(2), "band")
    except Exception as exc:
        out["all_reduce"] = type(exc).__name__
    hwdist.all_reduce_dict({"a": torch.ones(1)})  # the group still works
    return out


@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
def test_all_reduce_dict_raises_plan_error(dist, combo):
    ws, backend = combo
    results = dist(check_dict_plan_errors, ws, backend)
    for res in results:
        assert res["all_reduce"] == "PlanError"
        for verify in (True, False):
            kind, is_plan_error, text = res[f"band {verify}"]
            assert kind == "PlanError" and is_plan_error, res
            assert text.startswith("all_reduce_dict: ") and "bitwise ops need an integer" in text
            if backend == "emu":
                assert res[f"int64 mean {verify}"][0] == "PlanError"
            assert res[f"took {verify}"] < FAST
        assert {k: v for k, v in res.items() if "took" not in k} == {
            k: v for k, v in results[0].items() if "took" not in k
        }
