"""``hwdist check --conformance``: its edge values and comparison without ranks, then the run on real ranks.

Without ranks: every edge value must be exact in the dtype it is sent in, and so must the exact
result of every reduce op over 2 and 3 ranks (otherwise a correct library would be flagged); the
comparison must tell NaN from a number, -0.0 from 0.0 and a non-canonical bool from True.

On real ranks: clean on gloo and the emulated accelerator, and it catches a library that computes
MIN as SUM. The faulty library is ``tests/programs/_conformance_fault.py``: a test-only stand-in for
hardware this project cannot reach (oneCCL on Intel GPUs returns integer MIN/MAX as SUM). Its driver
declares MIN native on every dtype, as that vendor's table did; the conformance run must flag
exactly the integer MIN cases, and the driver file it writes must make hwdist right on the same
library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hwdist import cli
from hwdist.checks import conformance, measure


def _wide(dtype: str) -> torch.dtype:
    if dtype == "bool":
        return torch.bool
    if dtype.startswith("complex"):
        return torch.complex128
    return torch.float64 if dtype.startswith(("float", "bfloat")) else torch.int64


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dtype", measure.DTYPE_NAMES)
def test_every_value_and_every_exact_result_is_exact_in_its_dtype(dtype, world):
    real, wide = getattr(torch, dtype), _wide(dtype)
    for rop in (*measure.reduce_ops_of(dtype), None):
        rows = [conformance.edge_values(r, world, dtype, rop) for r in range(world)]
        for row in rows:
            assert row.shape == (conformance.SIZES,) and row.dtype == wide
            assert conformance.identical(row.to(real).to(wide), row), (dtype, rop, row)
        if rop is None:
            continue
        want = conformance.exact(rop, rows)
        assert conformance.identical(want.to(real).to(wide), want), (dtype, rop, world, want)


def test_the_float_pattern_holds_each_edge():
    row = conformance.edge_values(0, 2, "float32", "sum")
    assert torch.isnan(row).any() and torch.isinf(row).any() and (row < 0).any()
    assert bool(torch.signbit(row[(row == 0) & torch.signbit(row)]).all()) and (row == 0).any()
    ints = torch.stack([conformance.edge_values(r, 2, "int32", "max") for r in range(2)])
    info = torch.iinfo(torch.int32)
    assert int(ints.max()) == info.max and int(ints.min()) == info.min
    assert bool((ints[0] == ints[1]).any())  # a tie: MIN and SUM differ there


def test_identical_is_bit_exact():
    nan = float("nan")
    same = conformance.identical
    assert same(torch.tensor([nan, 1.0, -0.0]), torch.tensor([nan, 1.0, -0.0]))
    assert not same(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not same(torch.tensor([nan]), torch.tensor([1.0]))
    assert not same(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
    assert not same(torch.tensor([2], dtype=torch.uint8).view(torch.bool), torch.tensor([True]))
    assert same([torch.tensor(1), torch.tensor(2)], [torch.tensor(1), torch.tensor(2)])
    assert not same([torch.tensor(1)], [torch.tensor(1), torch.tensor(2)])
    assert not same(torch.tensor([1.0, 2.0]), torch.tensor([[1.0, 2.0]]))


def test_exact_keeps_the_sign_of_zero_and_ieee_infinities():
    rows = [
        torch.tensor([-0.0, float("inf")], dtype=torch.float64),
        torch.tensor([-0.0, float("-inf")], dtype=torch.float64),
    ]
    total = conformance.exact("sum", rows)
    assert torch.signbit(total[0]) and torch.isnan(total[1])
    assert conformance.exact("min", rows)[1] == float("-inf")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["check", "--conformance", "-n", "1"], "--conformance needs at least 2 ranks, got -n 1"),
        (["check", "--conformance", "--only", "all_reduce"], "--conformance runs its own cases"),
        (["check", "--conformance", "--measure"], "--conformance runs its own cases"),
    ],
)
def test_conformance_usage_errors(argv, expected, capsys):
    assert cli.main(argv) == 2
    assert expected in capsys.readouterr().err


# ---------------------------------------------------------------- on real ranks

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = float(os.environ.get("HWDIST_TEST_TIMEOUT", "240"))
FAULT = "tests.programs._conformance_fault"
INTEGERS = {"bool", "uint8", "int8", "int16", "int32", "int64"}


def _env(*paths: str) -> dict[str, str]:
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("HWDIST_")}
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _check(*args: str, paths: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hwdist", "check", "--conformance", "--timeout", str(int(TIMEOUT)), *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env=_env(*paths), timeout=4 * TIMEOUT
    )


@pytest.mark.dist
@pytest.mark.parametrize("backend", ["gloo", "emu"])
def test_conformance_is_clean_on_gloo_and_the_emulated_accelerator(backend):
    """Every case the table passes through is right on the library, and hwdist is right (or refuses as
    declared) on every case, at 2 ranks: what CI runs."""
    proc = _check("--backend", backend, "-n", "2", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["world_sizes"] == [2] and not report["failed"]
    statuses = {(r["op"], r["dtype"], r["reduce_op"]): (r["library"], r["hwdist"]) for r in report["results"]}
    assert statuses[("all_reduce", "int32", "min")] == ("ok", "ok")
    assert len(statuses) > 150  # every op x dtype x reduce op, not a handful
    assert all(hw in ("ok", "planned-refusal") for _, hw in statuses.values()), statuses
    assert not [f for f in report["findings"] if f["failure"]]


@pytest.mark.slow  # about 40 s at 3 ranks; the fast lane keeps the clean 2-rank runs and the edge-value check
@pytest.mark.dist
def test_min_computed_as_sum_is_caught_at_3_ranks_and_the_written_driver_corrects_it(tmp_path):
    """The injected fault (integer MIN issued as SUM) is flagged on exactly the integer MIN cases of
    every reduction, raw and through hwdist; floats and every other reduce op stay right. Registered, the
    driver file it writes routes those cases around the fault, and the same check then passes."""
    path = tmp_path / "minsum_fixed.py"
    proc = _check("--backend", "minsum", "--import", FAULT, "-n", "3", "--json", "--write-driver", str(path))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    failures = {(f["op"], f["rop"], f["dtype"]) for f in report["findings"] if f["failure"]}
    expected = {(op, "min", d) for op in ("all_reduce", "reduce", "reduce_scatter") for d in INTEGERS}
    assert failures == expected
    library = {(r["op"], r["dtype"], r["reduce_op"]): r["library"] for r in report["results"]}
    for op in ("all_reduce", "reduce", "reduce_scatter"):
        if op == "reduce_scatter" and library[(op, "float32", "sum")] == "refused":
            continue  # torch 2.1's gloo has no flat reduce_scatter: hwdist emulates it (and was caught above)
        assert library[(op, "int32", "min")] == "wrong" and library[(op, "float32", "min")] == "ok"
        assert library[(op, "int32", "max")] == "ok" and library[(op, "int64", "sum")] == "ok"
    assert sorted(map(tuple, report["corrected"]["inexact_reductions"])) == sorted(
        ("min", d) for d in ("bool", "int32", "int64", "int8", "uint8")
    )

    source = path.read_text()
    assert "class MinsumConformedDriver(MinAsSumDriver):" in source
    (tmp_path / "minsum_register.py").write_text(
        f"import hwdist\nimport {FAULT}  # noqa: F401\nfrom minsum_fixed import MinsumConformedDriver\n"
        "hwdist.register_backend('minsum', MinsumConformedDriver, override=True)\n"
    )
    again = _check(
        "--backend", "minsum", "--import", "minsum_register", "-n", "2", "--json", paths=(str(tmp_path),)
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    fixed = {(r["op"], r["dtype"], r["reduce_op"]): r for r in json.loads(again.stdout)["results"]}
    assert fixed[("all_reduce", "int32", "min")]["library"] == "wrong"  # the library is still faulty...
    assert fixed[("all_reduce", "int32", "min")]["hwdist"] == "ok"  # ...but hwdist goes around it
    assert fixed[("all_reduce", "int64", "min")]["hwdist"] == "planned-refusal"  # no exact route: refused


def test_the_edge_values_expose_min_as_sum_whatever_the_rank_count():
    """By construction, not by luck: at 2 and 3 ranks the integer MIN pattern has a position where SUM
    differs from MIN (a tie), for every integer dtype."""
    import torch

    for world in (2, 3):
        for dtype in ("uint8", "int8", "int16", "int32", "int64"):
            rows = [conformance.edge_values(r, world, dtype, "min") for r in range(world)]
            real = getattr(torch, dtype)
            as_sum = conformance.exact("sum", rows).to(real)
            assert not conformance.identical(as_sum, conformance.exact("min", rows).to(real)), (world, dtype)
