"""The hang doctor's parts that need no process group: the diagnosis, ``hwdist trace``, settings, bad input.

The records here are written by hand in the format the watchdog and the dumps
use (hwdist.flight.recorder.entry_dict); the end-to-end scenarios on real
ranks are in tests/flight/test_hang_doctor.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hwdist
from hwdist import _compat, flight
from hwdist.cli import main as cli_main
from hwdist.flight import recorder, report, watchdog
import stat
import tempfile
from hwdist.flight import files

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


# ---------- flight record files ----------
# Dump files: ``hwdist trace`` on corrupt or hostile directories, and dumps written safely.


# The marks of this section's tests (slow ones are skipped by the fast lane, -m 'not slow').
_FLIGHT_FILES_MARKS = pytest.mark.slow
def _row(seq: int, op: str = "all_reduce", state: str = "completed") -> dict:
    return {
        "group": "default", "group_ranks": None, "backend": "gloo", "seq": seq, "op": op,
        "args": "float32[1]", "site": "t.py:5", "start": 100.0 + seq, "end": 100.5 + seq, "state": state,
    }


def _header(rank: int, ws: int = 2) -> dict:
    return {"rank": rank, "world_size": ws, "host": "h", "pid": 1, "time": 200.0, "where": "", "stack": []}


def _write(path: Path, header, entries=()) -> None:
    path.write_text("\n".join([json.dumps(header)] + [json.dumps(e) for e in entries]) + "\n")


def _good(d: Path) -> None:
    _write(d / "flight-rank0.jsonl", _header(0), [_row(1), _row(2, state="issued")])


def _deep(n: int) -> str:
    return "[" * n + "]" * n


# name -> the text of flight-rank1.jsonl, and a part of the reason the warning must give
CORRUPT = {
    "rank-a-string": (json.dumps({**_header(1), "rank": "1"}), "field 'rank' must be an integer"),
    "rank-a-bool": (json.dumps({**_header(1), "rank": True}), "field 'rank' must be an integer"),
    "rank-near-1e9": (json.dumps({**_header(1), "rank": 999_999_999}), "field 'rank' must be an integer in"),
    "world-near-1e9": (json.dumps(_header(1, 999_999_999)), "field 'world_size' must be an integer in"),
    "header-a-list": ("[1, 2]", "header) is not a JSON object"),
    "deep-nesting": (_deep(100_000), "nested too deeply"),
    "deep-in-an-entry": (json.dumps(_header(1)) + "\n" + _deep(50_000), "nested too deeply"),
    "seq-a-string": (json.dumps(_header(1)) + "\n" + json.dumps({**_row(1), "seq": "1"}), "field 'seq'"),
    "op-a-number": (json.dumps(_header(1)) + "\n" + json.dumps({**_row(1), "op": 3}), "field 'op'"),
    "state-unknown": (
        json.dumps(_header(1)) + "\n" + json.dumps({**_row(1), "state": "x"}), "field 'state'"
    ),
    "entry-a-list": (json.dumps(_header(1)) + "\n[1]", "line 2 is not a JSON object"),
    "start-huge": (
        json.dumps(_header(1)) + "\n" + json.dumps({**_row(1), "start": 10**400}), "field 'start'"
    ),
    "group-ranks-huge": (
        json.dumps(_header(1)) + "\n" + json.dumps({**_row(1), "group_ranks": [10**12]}), "group_ranks"
    ),
    "stack-a-dict": (json.dumps({**_header(1), "stack": {"a": 1}}), "field 'stack'"),
    "not-utf8": ("\udcff", "not UTF-8"),
    "empty": ("", "empty"),
}


@_FLIGHT_FILES_MARKS
@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_trace_skips_a_corrupt_dump_with_a_warning_naming_it(case, tmp_path, capsys):
    text, why = CORRUPT[case]
    _good(tmp_path)
    (tmp_path / "flight-rank1.jsonl").write_bytes(text.encode("utf-8", "surrogateescape"))
    assert cli_main(["trace", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "flight-rank1.jsonl: not a flight record (" in err and why in err and "skipped" in err, err
    assert "rank 1 left no dump (it died before dumping, or its file was not collected)" in out, out
    assert "rank 0 (h pid 1)" in out, out
    assert cli_main(["trace", "--json", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr()[0])["ranks"] == [0]


@_FLIGHT_FILES_MARKS
def test_trace_never_blocks_or_reads_without_bound_and_strips_escapes(tmp_path, capsys):
    # a FIFO (a blocking open would wait forever), a link to /dev/zero (endless), a huge file, a directory
    _good(tmp_path)
    os.mkfifo(tmp_path / "flight-rank1.jsonl")
    os.symlink("/dev/zero", tmp_path / "flight-rank2.jsonl")
    (tmp_path / "flight-rank3.jsonl").mkdir()
    with open(tmp_path / "flight-rank4.jsonl", "wb") as fh:
        fh.truncate(files.MAX_DUMP_BYTES + 1)  # sparse: no disk used
    evil = "\x1b]0;owned\x07\x1b[2J"
    _write(tmp_path / "flight-rank5.jsonl", {**_header(5, 6), "host": evil}, [_row(1, op="all" + evil)])
    _write(tmp_path / "\x1b[31mred.jsonl", {**_header(7, 2)})  # an escape in a file name
    (tmp_path / "\x1b[31mbad.jsonl").write_text("{")
    assert cli_main(["trace", str(tmp_path)]) == 0  # a blocking open of the FIFO would hang here
    out, err = capsys.readouterr()
    assert "flight-rank1.jsonl: not a flight record (not a regular file); skipped" in err, err
    assert "flight-rank2.jsonl: not a flight record (not a regular file); skipped" in err, err
    assert "flight-rank3.jsonl: not a flight record (not a regular file); skipped" in err, err
    assert f"flight-rank4.jsonl: not a flight record ({files.MAX_DUMP_BYTES + 1} bytes, more than" in err, err
    assert "\\x1b[31mbad.jsonl: not a flight record (line 1: not JSON" in err, err
    assert "\x1b" not in out + err and "\x07" not in out + err, (out, err)
    assert "all\\x1b]0;owned\\x07" in out, out
    assert "rank 5 (\\x1b]0;owned" in out and "rank 7 (h pid 1)" in out, out
    assert "ranks 1-4: no dump file" in out and "rank 6: no dump file" in out, out
    assert "Traceback" not in err


@_FLIGHT_FILES_MARKS
def test_offline_and_live_wording_for_a_rank_without_a_record():
    recs = {0: {**_header(0), "entries": [_row(1, state="issued")]}, 1: None}
    assert report.diagnose(recs, 2).startswith(
        "rank 1 did not answer (dead, or stuck where its watchdog cannot reach the store)"
    )
    assert report.diagnose(recs, 2, offline=True).startswith(
        "rank 1 left no dump (it died before dumping, or its file was not collected)"
    )
    assert report._ranks([0, 2, 3, 4, 5, 9]) == "ranks 0, 2-5, 9"


# --------------------------------------------------------------------------- writing


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("HWDIST_FLIGHT_DIR", raising=False)
    watchdog._warned.clear()
    return tmp_path


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@_FLIGHT_FILES_MARKS
def test_default_dump_directory_is_private_and_files_are_0600(private_tmp):
    path = hwdist.dump_flight_record()
    folder = private_tmp / f"hwdist-flight-{os.getuid()}"
    assert path == str(folder / "flight-rank0.jsonl")
    assert _mode(folder) == 0o700 and _mode(path) == 0o600
    assert sorted(os.listdir(folder)) == ["flight-rank0.jsonl"]  # no temporary file left behind


@_FLIGHT_FILES_MARKS
@pytest.mark.parametrize("problem", ["world-writable", "group-writable", "other-owner", "a-link", "a-file"])
def test_an_unsafe_default_directory_is_not_used(problem, private_tmp):
    folder = private_tmp / f"hwdist-flight-{os.getuid()}"
    victim = private_tmp / "victim"
    victim.mkdir(mode=0o700)
    if problem == "a-link":
        folder.symlink_to(victim)
    elif problem == "a-file":
        folder.write_text("x")
    else:
        folder.mkdir()
        os.chmod(folder, {"world-writable": 0o777, "group-writable": 0o770}.get(problem, 0o700))
        if problem == "other-owner":
            if os.getuid() != 0:
                pytest.skip("changing a directory's owner needs root")
            os.chown(folder, 12345, 12345)
    with pytest.warns(RuntimeWarning, match=f"the dump directory '{folder}' is not used"):
        path = hwdist.dump_flight_record()
    assert path is not None and not path.startswith(str(folder) + os.sep)
    assert _mode(os.path.dirname(path)) == 0o700 and _mode(path) == 0o600
    assert os.listdir(victim) == []
    if problem not in ("a-link", "a-file"):
        assert os.listdir(folder) == []


@_FLIGHT_FILES_MARKS
def test_a_planted_link_at_the_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "flight-rank0.jsonl").symlink_to(victim)
    for pid in range(os.getpid() - 2, os.getpid() + 3):  # the old temporary names too
        (d / f"flight-rank0.jsonl.tmp{pid}").symlink_to(victim)
    path = hwdist.dump_flight_record(str(d))
    assert victim.read_text() == "precious"
    assert not os.path.islink(path) and _mode(path) == 0o600
    assert json.loads(Path(path).read_text().splitlines()[0])["rank"] == 0


@_FLIGHT_FILES_MARKS
def test_a_flight_dir_ending_in_jsonl_is_a_directory_with_a_warning(private_tmp, monkeypatch):
    monkeypatch.setenv("HWDIST_FLIGHT_DIR", str(private_tmp / "run.jsonl"))
    want = "HWDIST_FLIGHT_DIR=.*run.jsonl' looks like a file; it names a directory"
    with pytest.warns(RuntimeWarning, match=want):
        path = hwdist.dump_flight_record()
    assert path == str(private_tmp / "run.jsonl" / "flight-rank0.jsonl")
    assert _mode(private_tmp / "run.jsonl") == 0o700


@pytest.mark.skipif(_compat.PG_HAS_HOOKS, reason="this torch has per-group hooks: nothing to warn about")
def test_asking_for_torch_calls_on_a_torch_without_hooks_warns_once(monkeypatch):
    monkeypatch.setattr(watchdog, "_warned", set())
    want = r"HWDIST_FLIGHT_TORCH=1 .* no per-group collective hooks"
    with pytest.warns(RuntimeWarning, match=want) as caught:
        was = flight.enable(torch_calls=True)
        flight.enable(torch_calls=True)
    flight.enable(was, torch_calls=False)
    assert len([w for w in caught if "HWDIST_FLIGHT_TORCH" in str(w.message)]) == 1
