"""The ``hwdist`` command in pipes and with noisy ranks: stdout carries the report only.

A ``sitecustomize`` module on PYTHONPATH (written by the tests) makes the
ranks print, as torch 2.8-2.10's gloo does (``[Gloo] Rank 0 is connected to
1 peer ranks``), both through Python and straight to file descriptor 1, at
start-up, at init and at exit; or makes their start-up slow. It acts only in
the ranks, never in the ``hwdist`` process itself: a rank forked by the
multiprocessing forkserver (the hooks are set in the forkserver and run in
each child it forks), a spawned rank (``--multiprocessing-fork``), or an MPI
process.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hwdist import checks, cli, cli_ranks

from .test_cli import ROOT, run_cli

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow

SITE = """
import atexit, importlib.abc, importlib.util, os, sys
_server = any("multiprocessing.forkserver" in a for a in getattr(sys, "orig_argv", ()))
_spawned = "--multiprocessing-fork" in sys.argv
_rank = _server or _spawned or "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def _noise_at_start():
    print("NOISE from print", flush=True)
    os.write(1, b"NOISE from fd 1\\n")


class _InEachRank:  # multiprocessing runs its after-fork hooks at the start of each forked rank's life
    def __init__(self, fn):
        from multiprocessing import util
        self.fn = fn
        util.register_after_fork(self, _InEachRank.run)

    def run(self):
        self.fn()


def _noise_in_a_forked_rank():  # its exit is multiprocessing's: atexit does not run, its finalizers do
    from multiprocessing import util
    _noise_at_start()
    util.Finalize(None, os.write, args=(1, b"NOISE at exit on fd 1\\n"), exitpriority=0)


def _slow_start():
    import time
    time.sleep(float(os.environ["HWDIST_TEST_SLOW_RANKS"]))


class _NoisyInit(importlib.abc.MetaPathFinder):
    # torch.distributed's init_process_group prints first, as gloo does when the ranks connect
    def find_spec(self, name, path, target=None):
        if name != "torch.distributed.distributed_c10d":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            init = module.init_process_group

            def noisy(*args, **kwargs):
                print("NOISE at init from print: [Gloo] Rank 0 is connected to 1 peer ranks", flush=True)
                os.write(1, b"NOISE at init on fd 1\\n")
                return init(*args, **kwargs)

            module.init_process_group = noisy

        spec.loader.exec_module = exec_module
        return spec


if _rank and os.environ.get("HWDIST_TEST_NOISE"):
    sys.meta_path.insert(0, _NoisyInit())  # (in the forkserver: before it imports torch for its children)
    if _server:
        _NOISE = _InEachRank(_noise_in_a_forked_rank)
    elif _spawned:  # a spawned rank's whole life is inside the command
        _noise_at_start()
        atexit.register(os.write, 1, b"NOISE at exit on fd 1\\n")
if _rank and os.environ.get("HWDIST_TEST_SLOW_RANKS"):
    if _server:
        _SLOW = _InEachRank(_slow_start)
    else:
        _slow_start()
"""


@pytest.fixture
def site(tmp_path: Path) -> str:
    """A PYTHONPATH with the noisy/slow ``sitecustomize`` first, then this worktree."""
    (tmp_path / "sitecustomize.py").write_text(SITE)
    return f"{tmp_path}:{ROOT}"


def no_traceback(stderr: str) -> None:
    assert (
        "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr
    ), stderr


# ---- closed pipes ----------------------------------------------------------------


@pytest.mark.parametrize("argv, lines", [(["env"], 2), (["env", "--json"], 2), (["check", "-n", "2"], 3)])
def test_head_closes_the_pipe_and_the_command_exits_quietly(argv, lines):
    script = (
        f'"{sys.executable}" -m hwdist {" ".join(argv)} | head -{lines}; echo "status=${{PIPESTATUS[0]}}" >&2'
    )
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert len(proc.stdout.splitlines()) == lines, proc.stdout
    status = int(re.search(r"status=(\d+)", proc.stderr).group(1))
    assert status in (0, 141), proc.stderr
    no_traceback(proc.stderr)


@pytest.mark.parametrize("argv", [["env"], ["env", "--json"], ["env", "--issue"]])
def test_a_pipe_closed_before_any_output_gives_141(argv):
    """The reader is gone before the command writes: every write fails, the exit is SIGPIPE's 141."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwdist", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    no_traceback(err)


def test_a_closed_stdout_descriptor_is_not_reused(tmp_path):
    """``>&-``: nothing the command or its ranks open lands on descriptor 1; the exit code still tells."""
    script = f'"{sys.executable}" -m hwdist check -n 2 --only dist_info --json >&-; echo "status=$?" >&2'
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert "status=0" in proc.stderr, proc.stderr
    no_traceback(proc.stderr)


def test_check_stops_early_when_its_reader_is_gone():
    script = f'"{sys.executable}" -m hwdist check -n 2 | head -3; echo "status=${{PIPESTATUS[0]}}" >&2'
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert "status=141" in proc.stderr, proc.stderr  # rows keep coming after the third line: the write fails
    no_traceback(proc.stderr)


# ---- the report is alone on stdout -----------------------------------------------


def test_check_json_is_clean_while_ranks_print_to_stdout_and_fd_1(site):
    proc = run_cli(
        "check",
        "-n",
        "2",
        "--only",
        "dist_info,broadcast",
        "--json",
        env={"PYTHONPATH": site, "HWDIST_TEST_NOISE": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)  # nothing else on stdout
    assert rep["failed"] == 0 and rep["passed"] >= 2
    for noise in (
        "NOISE from print",
        "NOISE from fd 1",
        "NOISE at exit on fd 1",
        "NOISE at init from print",
        "NOISE at init on fd 1",
    ):
        assert proc.stderr.count(noise) == 2, proc.stderr  # each of the 2 ranks printed it, on stderr


def test_check_table_and_bench_json_are_clean_too(site):
    env = {"PYTHONPATH": site, "HWDIST_TEST_NOISE": "1"}
    proc = run_cli("check", "-n", "2", "--only", "dist_info", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "NOISE" not in proc.stdout and "NOISE from fd 1" in proc.stderr
    assert proc.stdout.startswith("hwdist check: 2 rank(s)")
    proc = run_cli(
        "bench", "-n", "2", "--ops", "all_reduce", "--sizes", "1K", "--iters", "2", "--json", env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"][0]["wrong"] == 0
    assert "NOISE from fd 1" in proc.stderr


def test_start_up_progress_goes_to_stderr():
    proc = run_cli("check", "-n", "2", "--only", "dist_info", "--json")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    assert re.search(
        r"hwdist: starting 2 rank\(s\) on backend '\w+' \(limit 60 s, --timeout\)\.\.\.", proc.stderr
    )
    assert re.search(r"hwdist: 2 rank\(s\) ready in \d+\.\d s", proc.stderr), proc.stderr


# ---- --timeout and start-up failures ---------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "0.5", "4.9", "nan", "inf", "abc"])
def test_timeout_below_the_minimum_is_an_argparse_error(capsys, value):
    with pytest.raises(SystemExit) as info:
        cli.main(["check", "--timeout", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --timeout: expected seconds >= {cli.MIN_TIMEOUT:g}" in err and repr(value) in err
    assert err.startswith("usage: hwdist check")


def test_timeout_at_the_minimum_is_accepted():
    parser, _ = cli._parser()
    assert parser.parse_args(["bench", "--timeout", "5"]).timeout == 5.0
    assert math.isclose(parser.parse_args(["check", "--timeout", "7.5"]).timeout, 7.5)


def test_ranks_that_do_not_start_in_time_name_the_limit_and_suggest_one(site):
    proc = run_cli(
        "check",
        "-n",
        "2",
        "--only",
        "dist_info",
        "--timeout",
        "8",
        env={"PYTHONPATH": site, "HWDIST_TEST_SLOW_RANKS": "60"},
        timeout=120,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "hwdist: starting 2 rank(s) on backend 'gloo' (limit 8 s, --timeout)..."
    assert re.fullmatch(r"hwdist: still starting 2 rank\(s\): [5-8] s of 8 s", lines[1]), lines  # every 5 s
    line = lines[-1]
    assert line.startswith(
        "hwdist check: error: could not start 2 rank(s) on backend 'gloo' within 8 s (--timeout):"
    ), line
    assert "0 of 2 ready; rank(s) 0-1 still starting" in line
    assert "HINT:" in line and "--timeout 40" in line
    assert proc.stdout == ""


def test_a_rank_that_fails_to_start_gives_its_error():
    proc = run_cli(
        "check", "-n", "2", "--only", "dist_info", "--backend", "gloo", env={"GLOO_SOCKET_IFNAME": "nosuch0"}
    )
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("hwdist check: error: could not start 2 rank(s) on backend 'gloo': rank "), line
    assert "init_error:" in line and "nosuch0" in line  # gloo's own words about the interface


def test_startup_failure_messages():
    from hwdist.cli_ranks import startup_failure

    report = (
        "start-up failed on 4 rank(s), backend 'gloo':\n  hung ranks: 1, 2, 3 (timed out after 60s)\n\n"
        "(ranks that finished: 0)"
    )
    text = startup_failure(AssertionError(report), 4, "gloo", 60)
    assert "within 60 s (--timeout): 1 of 4 ready; rank(s) 1-3 still starting" in text
    assert "--timeout 360" in text  # 60 s x 1.5 x 4 ranks / 1 ready
    report = (
        "start-up failed on 2 rank(s), backend 'gloo':\n"
        "  root cause: rank 1 init_error: RuntimeError: Timed out waiting"
    )
    text = startup_failure(AssertionError(report), 2, "gloo", 30)
    assert text == (
        "could not start 2 rank(s) on backend 'gloo': rank 1 init_error: RuntimeError: Timed out waiting."
        " HINT: if the ranks were slow to meet, allow more time: --timeout 120"
    )


# ---- help and usage ----------------------------------------------------------------


def test_check_help_describes_and_lists_every_check():
    proc = run_cli("check", "--help")
    assert proc.returncode == 0
    assert "verify every public collective" in proc.stdout
    listed = (
        proc.stdout.split("checks (--only takes a comma list of these):")[1].split("Exit status")[0].split()
    )
    assert listed == checks.check_names()


def test_a_misspelt_option_gets_the_commands_own_usage():
    proc = run_cli("check", "--onyl", "dist_info")
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: hwdist check ")
    assert "hwdist check: error: unrecognized arguments: --onyl dist_info" in proc.stderr
    proc = run_cli("env", "--jsn")
    assert proc.returncode == 2 and "hwdist env: error: unrecognized arguments: --jsn" in proc.stderr


def _keys(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{path}.{k}", k
            yield from _keys(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _keys(v, f"{path}[{i}]")


def test_every_json_key_is_an_identifier():
    docs = [json.loads(run_cli("env", "--json").stdout)]
    proc = run_cli("check", "-n", "2", "--only", "dist_info", "--json")
    docs.append(json.loads(proc.stdout))
    proc = run_cli("bench", "--ops", "broadcast", "--sizes", "1K", "--iters", "1", "--compare", "--json")
    docs.append(json.loads(proc.stdout))
    for doc in docs:
        bad = [(where, k) for where, k in _keys(doc) if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        assert not bad, bad


# ---- one error form, did-you-mean, the extra to install, the table's columns --------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--backend", "glooo"],
        ["check", "--only", "nope"],
        ["check", "-n", "0"],
        ["check", "--onyl", "x"],
        ["bench", "--sizes", "1Q"],
        ["bench", "--ops", "nope"],
        ["env", "--jsn"],
        ["trace", "/no/such/directory"],
    ],
)
def test_every_error_line_has_the_commands_prefix(capsys, argv):
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert lines and all(ln.startswith(f"hwdist {argv[0]}: error: ") for ln in lines), lines


def test_no_module_writes_another_error_prefix():
    # every error line is built by cli.error_line or names its command (argparse does the same)
    for path in (ROOT / "hwdist").rglob("*.py"):
        assert '"hwdist: error' not in path.read_text(), f"{path}: use hwdist.cli.error_line"
    assert cli.error_line("check", "x") == "hwdist check: error: x"
    assert cli.error_line(None, "x") == "hwdist: error: x"


def test_a_misspelt_backend_gets_did_you_mean(capsys):
    assert cli.main(["check", "--backend", "glooo"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'glooo'; did you mean 'gloo'?" in err
    assert "Fix: pass --backend gloo" in err
    assert "register_backend" not in err  # a typo, not a new backend


def test_an_unknown_backend_far_from_any_name_suggests_registering_it(capsys):
    assert cli.main(["check", "--backend", "qwertyuiop"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "hwdist.register_backend('qwertyuiop', ...)" in err


def test_a_backend_missing_its_package_names_the_extra(capsys, monkeypatch):
    import hwdist

    name = "mpi"
    if name not in cli_ranks.extras():
        pytest.skip("hwdist's metadata declares no 'mpi' extra here (not installed as a package)")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if mpi4py were not installed
    if hwdist.get_driver(name).unavailable_reason() is None:
        pytest.skip("this torch has MPI built in: the backend needs no extra")
    assert cli.main(["check", "--backend", name]) == 2
    err = capsys.readouterr().err.strip()
    assert "the Python package 'mpi4py' is not installed" in err
    assert "Fix: pip install 'hwdist[mpi]', or pass --backend gloo" in err, err


def test_check_rows_of_every_status_keep_the_columns_aligned():
    rows = [checks.Row("all_reduce", "float32", status, 0.0123, "sum mean") for status in
            ("pass", "FAIL", "n/a", checks.REFUSED)]  # fmt: skip
    lines = [cli.CHECK_HEADER, *map(cli.render_row, rows)]
    ends = {ln.index(" ms") + 3 if " ms" in ln else ln.index("TIME") + 4 for ln in lines}
    assert len(ends) == 1, "\n".join(lines)  # the TIME column ends at the same place on every line
    assert {ln.index("sum mean") for ln in lines[1:4]} == {lines[0].index("DETAIL")}
    assert "refused" in lines[-1] and "as declared" in lines[-1]
