"""Dump files: ``hwdist trace`` on corrupt or hostile directories, and dumps written safely.

Every hostile directory below also holds one good dump: the run must warn about
the bad file (naming it and saying why), skip it, and still print the report of
the good one, with exit status 0 and no traceback.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

import hwdist
from hwdist.cli import main as cli_main
from hwdist.flight import files, report, watchdog

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow



def _entry(seq: int, op: str = "all_reduce", state: str = "completed") -> dict:
    return {
        "group": "default", "group_ranks": None, "backend": "gloo", "seq": seq, "op": op,
        "args": "float32[1]", "site": "t.py:5", "start": 100.0 + seq, "end": 100.5 + seq, "state": state,
    }


def _header(rank: int, ws: int = 2) -> dict:
    return {"rank": rank, "world_size": ws, "host": "h", "pid": 1, "time": 200.0, "where": "", "stack": []}


def _write(path: Path, header, entries=()) -> None:
    path.write_text("\n".join([json.dumps(header)] + [json.dumps(e) for e in entries]) + "\n")


def _good(d: Path) -> None:
    _write(d / "flight-rank0.jsonl", _header(0), [_entry(1), _entry(2, state="issued")])


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
    "seq-a-string": (json.dumps(_header(1)) + "\n" + json.dumps({**_entry(1), "seq": "1"}), "field 'seq'"),
    "op-a-number": (json.dumps(_header(1)) + "\n" + json.dumps({**_entry(1), "op": 3}), "field 'op'"),
    "state-unknown": (
        json.dumps(_header(1)) + "\n" + json.dumps({**_entry(1), "state": "x"}), "field 'state'"
    ),
    "entry-a-list": (json.dumps(_header(1)) + "\n[1]", "line 2 is not a JSON object"),
    "start-huge": (
        json.dumps(_header(1)) + "\n" + json.dumps({**_entry(1), "start": 10**400}), "field 'start'"
    ),
    "group-ranks-huge": (
        json.dumps(_header(1)) + "\n" + json.dumps({**_entry(1), "group_ranks": [10**12]}), "group_ranks"
    ),
    "stack-a-dict": (json.dumps({**_header(1), "stack": {"a": 1}}), "field 'stack'"),
    "not-utf8": ("\udcff", "not UTF-8"),
    "empty": ("", "empty"),
}


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


def test_trace_never_blocks_or_reads_without_bound_and_strips_escapes(tmp_path, capsys):
    # a FIFO (a blocking open would wait forever), a link to /dev/zero (endless), a huge file, a directory
    _good(tmp_path)
    os.mkfifo(tmp_path / "flight-rank1.jsonl")
    os.symlink("/dev/zero", tmp_path / "flight-rank2.jsonl")
    (tmp_path / "flight-rank3.jsonl").mkdir()
    with open(tmp_path / "flight-rank4.jsonl", "wb") as fh:
        fh.truncate(files.MAX_DUMP_BYTES + 1)  # sparse: no disk used
    evil = "\x1b]0;owned\x07\x1b[2J"
    _write(tmp_path / "flight-rank5.jsonl", {**_header(5, 6), "host": evil}, [_entry(1, op="all" + evil)])
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


def test_offline_and_live_wording_for_a_rank_without_a_record():
    recs = {0: {**_header(0), "entries": [_entry(1, state="issued")]}, 1: None}
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


def test_default_dump_directory_is_private_and_files_are_0600(private_tmp):
    path = hwdist.dump_flight_record()
    folder = private_tmp / f"hwdist-flight-{os.getuid()}"
    assert path == str(folder / "flight-rank0.jsonl")
    assert _mode(folder) == 0o700 and _mode(path) == 0o600
    assert sorted(os.listdir(folder)) == ["flight-rank0.jsonl"]  # no temporary file left behind


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


def test_a_flight_dir_ending_in_jsonl_is_a_directory_with_a_warning(private_tmp, monkeypatch):
    monkeypatch.setenv("HWDIST_FLIGHT_DIR", str(private_tmp / "run.jsonl"))
    want = "HWDIST_FLIGHT_DIR=.*run.jsonl' looks like a file; it names a directory"
    with pytest.warns(RuntimeWarning, match=want):
        path = hwdist.dump_flight_record()
    assert path == str(private_tmp / "run.jsonl" / "flight-rank0.jsonl")
    assert _mode(private_tmp / "run.jsonl") == 0o700
