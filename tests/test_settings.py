"""Bad values of numeric settings and of the failure-injection hooks: a message naming the variable.

Numeric settings never make an import fail: a warning names the variable, the
accepted range and the value, and the default is used. An injection that
names nothing (no check, no op being benchmarked) is refused before any rank
starts: silently injecting nothing would make a test of the failure path pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hwdist
from hwdist import settings
from hwdist.cli import main as cli_main
from hwdist.flight import recorder

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
HUGE = "9" * 400


@pytest.mark.parametrize("value", [HUGE, "abc", "-5", "nan", "1e999", "9" * 5000])
def test_flight_size_out_of_range_warns_and_uses_the_default(value, monkeypatch):
    monkeypatch.setenv("HWDIST_FLIGHT_SIZE", value)
    with pytest.warns(RuntimeWarning, match="environment variable HWDIST_FLIGHT_SIZE must be an integer in"):
        assert recorder.default_size() == 2048
    monkeypatch.setenv("HWDIST_FLIGHT_SIZE", "100")
    assert recorder.default_size() == 100


def test_import_with_hostile_numeric_settings_warns_naming_each_variable():
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HWDIST_FLIGHT_SIZE": HUGE,
        "HWDIST_TEST_TIMEOUT": "soon",
        "HWDIST_TEST_PG_TIMEOUT": "",
        "HWDIST_TEST_MAX_POOLS": "many",
        "HWDIST_TEST_WORLD_SIZES": "2,x",
    }
    code = (
        "import hwdist, hwdist.testing\n"
        "from hwdist.testing import harness, pytest_plugin\n"
        "print(harness.DEFAULT_TIMEOUT, harness.DEFAULT_PG_TIMEOUT, pytest_plugin.world_sizes())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["120.0", "30.0", "[1,", "2,", "3]"], run.stdout
    for var in ("HWDIST_FLIGHT_SIZE", "HWDIST_TEST_TIMEOUT", "HWDIST_TEST_WORLD_SIZES"):
        assert f"environment variable {var} must be" in run.stderr, (var, run.stderr)
    assert "HWDIST_TEST_PG_TIMEOUT" not in run.stderr  # empty: the default, as for every setting
    assert "(400 characters)" in run.stderr  # a huge value is shortened in the message


@pytest.mark.parametrize(
    "var,value,want",
    [
        ("HWDIST_TEST_TIMEOUT", "", 120.0),
        ("HWDIST_TEST_TIMEOUT", "2.5", 2.5),
        ("HWDIST_TEST_TIMEOUT", "x", "must be a number in"),
        ("HWDIST_TEST_TIMEOUT", "-1", "must be a number in"),
        ("HWDIST_TEST_PG_TIMEOUT", "inf", "must be a number in"),
        ("HWDIST_TEST_MAX_POOLS", "3", 3),
        ("HWDIST_TEST_MAX_POOLS", "3.5", "must be an integer in"),
        ("HWDIST_TEST_MAX_POOLS", "0", "must be an integer in"),
    ],
)
def test_bounded_settings(var, value, want, monkeypatch):
    monkeypatch.setenv(var, value)
    integer = var == "HWDIST_TEST_MAX_POOLS"
    if isinstance(want, str):
        with pytest.warns(RuntimeWarning, match=f"environment variable {var} {want}"):
            got = settings.bounded(var, 0.001 if not integer else 1, 1e7, integer=integer)
        assert got == float(settings.SETTINGS[var].default)
    else:
        assert settings.bounded(var, 0.001 if not integer else 1, 1e7, integer=integer) == want


@pytest.mark.parametrize("value", ["", ",", "0", "1,two", "-2", "1;2"])
def test_world_sizes_setting(value, monkeypatch):
    monkeypatch.setenv("HWDIST_TEST_WORLD_SIZES", value)
    if value == "":
        assert settings.integer_list("HWDIST_TEST_WORLD_SIZES", 1, 4096) == [1, 2, 3]
        return
    with pytest.warns(RuntimeWarning, match="HWDIST_TEST_WORLD_SIZES must be comma-separated integers"):
        assert settings.integer_list("HWDIST_TEST_WORLD_SIZES", 1, 4096) == [1, 2, 3]
    monkeypatch.setenv("HWDIST_TEST_WORLD_SIZES", " 2, 3 ")
    assert settings.integer_list("HWDIST_TEST_WORLD_SIZES", 1, 4096) == [2, 3]


@pytest.mark.parametrize(
    "argv,env,want",
    [
        (["--inject-failure", "nosuch"], {}, "--inject-failure: 'nosuch' names no check; expected"),
        ([], {"HWDIST_CHECK_INJECT": "dist_info_typo"}, "HWDIST_CHECK_INJECT: 'dist_info_typo' names no"),
        ([], {"HWDIST_CHECK_INJECT": "all_reduce:complex7"}, "check 'all_reduce' has no dtype 'complex7'"),
        (["--inject-failure", "dist_info::explode"], {}, "mode must be 'fail' or 'raise'"),
        (["--only", "dist_info", "--inject-failure", "all_reduce"], {}, "'all_reduce' is not among --only"),
    ],
)
def test_check_refuses_an_injection_that_names_no_check(argv, env, want, monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli_main(["check", "-n", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert want in err, err


@pytest.mark.parametrize("value", ["garbage", "broadcast"])
def test_bench_refuses_an_injection_into_an_op_it_does_not_run(value, monkeypatch, capsys):
    monkeypatch.setenv("HWDIST_BENCH_INJECT", value)
    code = cli_main(["bench", "-n", "2", "--ops", "all_reduce", "--sizes", "1K", "--iters", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"must name one of the ops this run benchmarks (all_reduce), got {value!r}" in err
    assert err.count("HWDIST_BENCH_INJECT") == 1, err


def test_an_unknown_variable_is_named_with_the_closest_known_one(monkeypatch):
    monkeypatch.setenv("HWDIST_HANG_TIMOUT", "5")
    monkeypatch.setenv("HWDIST_ZZZ_NOTHING_LIKE_IT", "1")
    monkeypatch.setenv("HWDIST_MPI_SUITE", "1")  # set by hwdist's own test tools: not a user setting
    found = dict(settings.unknown_variables())
    assert found["HWDIST_HANG_TIMOUT"] == "HWDIST_HANG_TIMEOUT"
    assert found["HWDIST_ZZZ_NOTHING_LIKE_IT"] is None
    assert "HWDIST_MPI_SUITE" not in found and "HWDIST_HANG_TIMEOUT" not in found
    monkeypatch.setattr(settings, "_checked", [False])
    with pytest.warns(RuntimeWarning) as caught:
        settings.check_unknown()
        settings.check_unknown()  # once per process
    texts = [str(w.message) for w in caught]
    assert len(texts) == 2, texts
    assert (
        "environment variable HWDIST_HANG_TIMOUT is not one hwdist reads; did you mean 'HWDIST_HANG_TIMEOUT'?"
    ) in texts[0]


def test_every_variable_hwdist_code_reads_is_declared_or_a_tool_variable():
    import re

    root = Path(hwdist.__file__).parent
    pattern = re.compile(r"\bHWDIST_[A-Z0-9_]*[A-Z0-9]\b")
    names = {m for p in root.rglob("*.py") for m in pattern.findall(p.read_text())}
    unknown = dict(settings.unknown_variables({n: "1" for n in names}))
    assert not unknown, f"read by hwdist but not declared in settings.SETTINGS: {sorted(unknown)}"


def test_a_launcher_without_a_process_group_warns_once(monkeypatch):
    from hwdist import info

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(info, "_launch_warned", [False])
    with pytest.warns(RuntimeWarning, match=r"RANK=1 and WORLD_SIZE=2 are set .* no process group") as caught:
        assert hwdist.get_rank() == 0 and hwdist.is_main_process()
        assert hwdist.get_world_size() == 1
    assert len([w for w in caught if "WORLD_SIZE" in str(w.message)]) == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(info, "_launch_warned", [False])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hwdist.get_rank() == 0  # one rank: nothing to warn about
