"""The docs, the package, the benchmarks and the tests speak to users, not about how they were written.

A reader of a page, a docstring or a comment needs what the code does and why. Notes on who
measured what, on which machine lent to them, in which work session, or which tracker entry asked
for it ("issue 17", "items 1-4") mean nothing to that reader; the history stays in git. This test
fails on the words such notes use, with the file and line of each.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What is checked: every Markdown page and Python file under these, and README.md.
SCOPES = ("docs", "hwdist", "benchmarks", "tests")

#: (pattern, what it is) for the wording of work notes. Matched per line, case-insensitive unless
#: the pattern says otherwise.
PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\b(this|that|last|next|earlier|other|parallel|previous|later|quiet|each|one|four|a) sessions?\b",
     "a work session"),
    (r"\bsessions? \d+", "a numbered work session"),
    (r"\bsession's (scratch|host|machine|device|own)\b", "a work session"),
    (r"\bthe lead('s)?\b", "the person who ran the work"),
    (r"\blent\b|\bborrowed\b|\bleases?\b", "a lent machine"),
    (r"\bwork periods?\b", "a work period"),
    (r"\bissues? #?\d+(?!\s*(collectives?|calls?|broadcasts?|all_\w+|ops?|messages?)\b)", "a tracker number"),
    (r"\bitems? \d+[a-z]?(\s*(-|,|and)\s*\d+|\s*:|\))", "a tracker item"),
    (r"(?-i:\bI (did|tried|see|found|measured|ran|reverted|changed|kept|built|think|chose|could not|have)\b)",
     "a first-person note"),
)
_COMPILED = [(re.compile(p, re.IGNORECASE), what) for p, what in PATTERNS]
_ANY = re.compile("|".join(f"(?:{p})" for p, _ in PATTERNS), re.IGNORECASE)  # one pass over a clean file

#: Lines where a pattern's word means something else (a pytest session, a fixture's scope).
ALLOWED = re.compile(r"pytest session|test session|whole session|same session|session-scoped|scope=.session")


def _files() -> list[Path]:
    out = [ROOT / "README.md"]
    for scope in SCOPES:
        for ext in ("*.md", "*.py"):
            out.extend(sorted((ROOT / scope).rglob(ext)))
    here = Path(__file__).resolve()
    return [p for p in out if p.is_file() and p.resolve() != here and "__pycache__" not in p.parts]


def offending_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, what was found, the line) for every line of ``text`` that narrates the work."""
    found: list[tuple[int, str, str]] = []
    if not _ANY.search(text):
        return found
    for no, line in enumerate(text.splitlines(), 1):
        if ALLOWED.search(line):
            continue
        for rx, what in _COMPILED:
            if rx.search(line):
                found.append((no, what, line.strip()))
                break
    return found


@pytest.mark.parametrize(
    "line",
    [
        "measured on the lent GPU machine's one-CPU container",
        "the quiet many-core host the earlier sessions asked for",
        "## Issue 15 on a quiet 16-core host (session 6)",
        "The lead's runs after all branches were merged",
        "code and test docstrings cite (issue 14, items 1-4)",
        "# item 5: a tensor given twice",
        "I did not change the pass-through this session.",
        "a borrowed machine, in one work period",
        "Four short leases in one session",
    ],
)
def test_the_check_catches_work_notes(line: str) -> None:
    assert offending_lines(line), line


@pytest.mark.parametrize(
    "line",
    [
        "the pooled group kept alive for the whole session:",
        "@functools.lru_cache(maxsize=None)  # one Wheel per test session",
        "scatter_object_output_list: a non-empty list on every rank; item 0 is set.",
        "the engine may issue 2 collectives for an uneven gather",
        "x = t.item()",
        "I/O errors are reported on every rank",
    ],
)
def test_the_check_lets_ordinary_wording_pass(line: str) -> None:
    assert not offending_lines(line), line


def test_docs_code_and_tests_speak_to_users() -> None:
    files = _files()
    assert len(files) > 50, f"expected the project's pages and modules under {ROOT}, found {len(files)}"
    problems = [
        f"{path.relative_to(ROOT)}:{no}: {what}: {line[:140]}"
        for path in files
        for no, what, line in offending_lines(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not problems, (
        "these lines narrate how the work was done instead of saying what the code does and why "
        "(say it in the code's own words; the history stays in git):\n" + "\n".join(problems)
    )
