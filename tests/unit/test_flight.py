"""The hang doctor's parts that need no process group: the diagnosis, ``hwdist trace``, settings, bad input.

The records here are written by hand in the format the watchdog and the dumps
use (hwdist.flight.recorder.entry_dict); the end-to-end scenarios on real
ranks are in tests/dist/test_hang_doctor.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hwdist
from hwdist import flight
from hwdist.cli import main as cli_main
from hwdist.flight import recorder, report, watchdog

ROOT = Path(__file__).resolve().parents[2]
#: What a subprocess needs on PYTHONPATH: the repository (the package, tests, benchmarks) (tests, benchmarks).
SRC_PATH = str(ROOT)


def _entry(seq: int, op: str, site: str, state: str = "completed", group: str = "default") -> dict:
    return {
        "group": group,
        "group_ranks": None,
        "backend": "gloo",
        "seq": seq,
        "op": op,
        "args": "float32[1]",
        "site": site,
        "start": 100.0 + seq,
        "end": None if state == "issued" else 100.5 + seq,
        "state": state,
    }


def _rec(rank: int, ws: int, entries: list, where: str = "") -> dict:
    return {
        "rank": rank,
        "world_size": ws,
        "host": "h",
        "pid": 1,
        "time": 200.0,
        "where": where,
        "stack": ["train.py:1 in <module>", where or "train.py:2 in step"],
        "entries": entries,
    }


def _late_rank_records() -> dict:
    common = [_entry(1, "all_reduce", "train.py:80"), _entry(2, "all_reduce", "train.py:80")]
    return {
        0: _rec(0, 2, common + [_entry(3, "all_reduce", "train.py:88", "issued")], "step() at train.py:88"),
        1: _rec(1, 2, common, "evaluate() at eval.py:12"),
    }


def test_diagnosis_names_the_late_rank_and_where_it_is():
    assert report.diagnose(_late_rank_records(), 2) == (
        "rank 1 never called all_reduce #3 (train.py:88); it is in evaluate() at eval.py:12"
    )


def test_diagnosis_of_different_collectives_and_a_silent_rank():
    common = [_entry(1, "all_reduce", "t.py:5")]
    recs = {
        0: _rec(0, 3, common + [_entry(2, "all_reduce", "t.py:9", "issued")]),
        1: _rec(1, 3, common + [_entry(2, "broadcast", "t.py:7", "issued")]),
        2: None,
    }
    diag = report.diagnose(recs, 3)
    assert diag.startswith("rank 2 did not answer (dead"), diag
    assert "rank 1 called broadcast #2 (t.py:7) where rank 0 called all_reduce #2 (t.py:9)" in diag


def test_divergence_table_finds_the_first_differing_sequence_number():
    recs = {
        0: _rec(
            0,
            2,
            [
                _entry(1, "all_reduce", "a.py:1"),
                _entry(2, "all_reduce", "a.py:2"),
                _entry(3, "all_reduce", "a.py:3", "issued"),
            ],
        ),
        1: _rec(1, 2, [_entry(1, "all_reduce", "a.py:1"), _entry(2, "all_reduce", "a.py:3")]),
    }
    (row,) = report.divergence(recs, 2)
    assert row["first"] == 2 and row["calls"] == {0: "all_reduce (a.py:2)", 1: "all_reduce (a.py:3)"}
    assert row["last"] == {0: 3, 1: 2}
    diag = report.diagnose(recs, 2)
    assert diag.startswith("the ranks' calls on the default group first differ at #2"), diag
    assert "rank 1 never called all_reduce #3 (a.py:3)" in diag


def _write_dumps(tmp_path: Path, recs: dict) -> Path:
    d = tmp_path / "dumps"
    d.mkdir()
    for r, rec in recs.items():
        entries = rec.pop("entries")
        lines = [json.dumps(rec)] + [json.dumps(e) for e in entries]
        (d / f"flight-rank{r}.jsonl").write_text("\n".join(lines) + "\n")
    return d


def test_trace_merges_dumps_and_prints_the_diagnosis(tmp_path, capsys):
    d = _write_dumps(tmp_path, _late_rank_records())
    (d / "junk.jsonl").write_text("not json\n")
    assert cli_main(["trace", str(d)]) == 0
    out, err = capsys.readouterr()
    assert (
        "diagnosis: rank 1 never called all_reduce #3 (train.py:88); it is in evaluate() at eval.py:12" in out
    )
    assert "| default | gloo | #3 | all_reduce (train.py:88) | - | 0:#3, 1:#2 |" in out
    assert "junk.jsonl: not a flight record" in err
    assert cli_main(["trace", "--json", str(d)]) == 0
    data = json.loads(capsys.readouterr()[0])
    assert data["ranks"] == [0, 1] and data["groups"][0]["first"] == 3


def test_trace_without_records_is_a_usage_error(tmp_path, capsys):
    assert cli_main(["trace", str(tmp_path)]) == 2
    assert "no readable flight record (flight-rank<R>.jsonl)" in capsys.readouterr()[1]
    assert cli_main(["trace", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr()[1]
    (tmp_path / "flight-rank0.jsonl").write_text("not json\n")  # the only file: the error says why
    assert cli_main(["trace", str(tmp_path)]) == 2
    err = capsys.readouterr()[1]
    assert "no readable flight record" in err and "flight-rank0.jsonl: not a flight record (" in err, err


def test_bad_settings_warn_and_turn_the_watchdog_off(monkeypatch):
    watchdog._warned.clear()
    for value in ("-1", "abc"):
        monkeypatch.setenv("HWDIST_HANG_TIMEOUT", value)
        with pytest.warns(RuntimeWarning, match="HWDIST_HANG_TIMEOUT"):
            assert watchdog.read_timeout() is None
        watchdog._warned.clear()
    monkeypatch.setenv("HWDIST_HANG_TIMEOUT", "0")
    assert watchdog.read_timeout() is None  # 0 is the documented off switch: no warning
    monkeypatch.setenv("HWDIST_HANG_TIMEOUT", "2.5")
    assert watchdog.read_timeout() == 2.5
    monkeypatch.delenv("HWDIST_HANG_TIMEOUT")
    assert watchdog.read_timeout() == 300.0
    monkeypatch.setenv("HWDIST_HANG_ACTION", "explode")
    with pytest.warns(RuntimeWarning, match="HWDIST_HANG_ACTION must be one of report, raise, abort"):
        assert watchdog.read_action() == "report"


def test_dump_to_an_unwritable_place_warns_and_returns_none(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    watchdog._warned.clear()
    with pytest.warns(RuntimeWarning, match="could not write the flight record"):
        assert hwdist.dump_flight_record(str(blocker / "sub")) is None


def test_dump_writes_a_header_and_entries(tmp_path):
    path = hwdist.dump_flight_record(str(tmp_path))
    assert path == str(tmp_path / "flight-rank0.jsonl")
    header = json.loads(Path(path).read_text().splitlines()[0])
    assert header["rank"] == 0 and header["reason"] == "dump_flight_record"
    assert any("test_dump_writes_a_header_and_entries" in f for f in header["stack"])


def test_line_numbers_and_summaries_are_computed_lazily():
    import torch

    def here():
        return sys._getframe(0)

    f = here()
    assert recorder.line_of(f.f_code, f.f_lasti) == f.f_lineno
    t = torch.zeros(4, 3, dtype=torch.float16)
    assert recorder.describe(t) == "float16[4, 3]"
    assert recorder.describe(recorder._summary([t, t])) == "list[2] of float16[4, 3]"
    assert recorder.describe(recorder._summary({"a": 1})) == "dict[1]"
    import weakref

    ref = weakref.ref(t)
    assert recorder.describe(ref) == "float16[4, 3]"
    del t
    assert recorder.describe(ref) == "?"


def test_recorder_begin_never_raises():
    rec = recorder.Recorder(16)
    # no process group: nothing recorded, no error, whatever the arguments
    assert rec.begin("all_reduce", None, (object(),), {}) is None
    rec.end(None, RuntimeError("x"))
    assert rec.entries() == []


def test_importing_hwdist_installs_no_signal_handler_and_starts_no_thread():
    code = (
        "import signal, threading, hwdist;"
        "assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL;"
        "assert [t.name for t in threading.enumerate()] == ['MainThread'];"
        "assert hwdist.flight.enabled();"
        "print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": SRC_PATH},
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_opt_out(monkeypatch):
    code = "import hwdist; print(hwdist.flight.enabled())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": SRC_PATH, "HWDIST_FLIGHT_RECORDER": "0"},
    )
    assert out.stdout.strip() == "False", out.stderr
    assert flight.enable(flight.enabled()) is flight.enabled()
