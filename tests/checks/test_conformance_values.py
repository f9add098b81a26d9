"""The conformance run's edge values and its bit-exact comparison, without ranks.

Every edge value must be exact in the dtype it is sent in, and so must the exact result of every
reduce op over 2 and 3 ranks: otherwise a correct library would be flagged. The comparison must tell
NaN from a number, -0.0 from 0.0 and a non-canonical bool from True.
"""

from __future__ import annotations

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
