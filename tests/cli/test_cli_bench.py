"""``hwdist bench``: the #wrong column, the average bus bandwidth, and hwdist against raw torch in one run."""

from __future__ import annotations

import json

import pytest
import torch

from hwdist import cli, cli_bench

from .test_cli import run_cli

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow


def test_every_op_is_checked_and_right_on_three_ranks():
    proc = run_cli(
        "bench",
        "-n",
        "3",
        "--ops",
        "all",
        "--sizes",
        "1K,12K",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--json",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert {r["op"] for r in rep["results"]} == set(cli_bench.BENCH_OPS)
    assert all(r["wrong"] == 0 for r in rep["results"]) and rep["wrong"] == 0
    for s in rep["summary"]:
        rows = [r for r in rep["results"] if (r["op"], r["impl"]) == (s["op"], s["impl"])]
        assert s["sizes"] == len(rows) == 2
        assert s["avg_busbw_gbps"] == pytest.approx(sum(r["busbw_gbps"] for r in rows) / 2)
    assert rep["avg_busbw_gbps"]["hwdist"] == pytest.approx(
        sum(r["busbw_gbps"] for r in rep["results"]) / len(rep["results"])
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "int64"])
def test_the_check_is_exact_for_other_dtypes(dtype):
    proc = run_cli(
        "bench",
        "--ops",
        "all_reduce,reduce_scatter",
        "--sizes",
        "1K",
        "--iters",
        "1",
        "--dtype",
        dtype,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["wrong"] == 0


def test_a_wrong_element_is_counted_and_fails_the_run():
    proc = run_cli(
        "bench",
        "--ops",
        "all_reduce,broadcast",
        "--sizes",
        "1K,2K",
        "--iters",
        "1",
        env={"HWDIST_BENCH_INJECT": "all_reduce"},
    )
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    section = out.split("# all_reduce (hwdist)")[1].split("# broadcast")[0]
    rows = [ln.split() for ln in section.splitlines() if ln.strip() and ln.strip()[0].isdigit()]
    assert [row[-1] for row in rows] == ["1", "1"]  # the last rank corrupted one element per size
    assert "# avg busbw " in section and "#wrong 2" in section
    broadcast = out.split("# broadcast (hwdist)")[1]
    assert [ln.split()[-1] for ln in broadcast.splitlines() if ln.strip()[:1].isdigit()] == ["0", "0"]
    assert "# Out of bounds values : 2 WRONG RESULTS" in out


def test_text_output_ends_with_nccl_tests_summary_lines():
    proc = run_cli("bench", "--ops", "all_reduce", "--sizes", "1K:4K", "--iters", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-2] == "# Out of bounds values : 0 OK"
    assert lines[-1].startswith("# Avg bus bandwidth    : ") and lines[-1].endswith("GB/s (hwdist)")
    rows = [ln.split() for ln in lines if ln.strip()[:1].isdigit()]
    avg = sum(float(r[4]) for r in rows) / len(rows)
    assert float(lines[-1].split(":")[1].split()[0]) == pytest.approx(
        avg, abs=2e-3
    )  # of the printed (rounded) values


def test_compare_times_hwdist_and_torch_in_one_run():
    proc = run_cli(
        "bench", "--ops", "all_reduce,all_gather", "--sizes", "1K,4K", "--iters", "2", "--compare", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    pairs = {(r["op"], r["size"], r["impl"]) for r in rep["results"]}
    assert pairs == {
        (op, size, impl)
        for op in ("all_reduce", "all_gather")
        for size in (1024, 4096)
        for impl in ("hwdist", "torch")
    }
    assert set(rep["avg_busbw_gbps"]) == {"hwdist", "torch"}
    by = {(r["op"], r["size"], r["impl"]): r["time_us"] for r in rep["results"]}
    assert len(rep["comparison"]) == 4
    for c in rep["comparison"]:
        assert (
            c["hwdist_us"] == by[(c["op"], c["size"], "hwdist")]
            and c["torch_us"] == by[(c["op"], c["size"], "torch")]
        )
        assert c["ratio"] == pytest.approx(c["hwdist_us"] / c["torch_us"])
    proc = run_cli("bench", "--ops", "broadcast", "--sizes", "1K", "--iters", "1", "--compare")
    assert "# broadcast (hwdist)" in proc.stdout and "# broadcast (torch)" in proc.stdout
    assert "hwdist against raw torch.distributed" in proc.stdout
    assert (
        "(hwdist)\n" in proc.stdout.split("# Out of bounds")[1]
        and "(torch)\n" in proc.stdout.split("# Out of bounds")[1]
    )


def test_compare_and_impl_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--compare", "--impl", "torch"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_wrong_counts_elements():
    want = [torch.tensor([0.0, 1.0, 2.0]), torch.tensor([3.0])]
    assert cli_bench._wrong([torch.tensor([0.0, 1.0, 2.0]), torch.tensor([3.0])], want, torch.float32) == 0
    assert cli_bench._wrong([torch.tensor([0.0, 9.0, 2.0]), torch.tensor([4.0])], want, torch.float32) == 2
    assert (
        cli_bench._wrong([torch.tensor([0.0, 1.0, 2.0])], want, torch.float32) == 1
    )  # a missing tensor counts whole
    assert cli_bench._wrong([torch.tensor([0, 1, 2], dtype=torch.int32)], want[:1], torch.int32) == 0
