"""The hang report and its one-line diagnosis, from every rank's flight record.

Used live by the watchdog (records gathered through the store) and offline by
``hwdist trace DIR`` (records read from dump files). A record is a dict: the
rank's ``rank``, ``world_size``, ``host``, ``pid``, ``where`` (the innermost
user frame of its main thread), ``stack`` (the main thread's frames) and
``entries`` (what [`entry_dict`][hwdist.flight.recorder.entry_dict] makes).
"""

from __future__ import annotations

import time
from typing import Any, Optional

__all__ = ["diagnose", "divergence", "render"]

Records = dict[int, Optional[dict[str, Any]]]


def _where(record: dict[str, Any]) -> str:
    """Where a rank is: its pending collective, else its innermost user frame."""
    for e in reversed(record.get("entries") or []):
        if e.get("state") == "issued":
            return f"waiting in {e['op']} #{e['seq']} of the {_gname(e['group'])} ({e['site']})"
    where = record.get("where")
    return f"in {where}" if where else "somewhere outside any collective"


TORCH_PREFIX = "torch:"  # the labels of entries read from torch's own flight recorder (torch_fr.py)


def _torch_pending(record: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The oldest torch-recorded collective still in flight on the rank (DDP's, FSDP's), or None."""
    pending = [
        e for e in record.get("entries") or []
        if e.get("state") == "issued" and str(e.get("group", "")).startswith(TORCH_PREFIX)
    ]
    return min(pending, key=lambda e: float(e.get("start") or 0)) if pending else None


def _blind(record: dict[str, Any], label: str) -> bool:
    """Whether torch's own collectives on group ``label`` are invisible in the rank's record and may hold it.

    Not blind: a rank inside a hwdist call, one whose main thread is not in torch's code (it runs the
    user's code: it cannot be waiting in a torch collective), and records that predate these fields.
    """
    if label.startswith(TORCH_PREFIX) or "torch_seen" not in record or record.get("in_hwdist"):
        return False
    if not record.get("in_torch", True):
        return False  # its main thread runs the user's code or a C call of its own, not a torch collective
    return label not in (record.get("torch_seen") or [])


def _not_called(r: int, rec: dict[str, Any], ref: dict[str, Any], s: int, label: str) -> str:
    """Why rank ``r`` has not reached ``ref`` #``s``, without blaming it for what the record cannot show."""
    where = rec.get("where") or "?"
    tp = _torch_pending(rec)
    if tp is not None and not rec.get("in_hwdist"):
        return (
            f"rank {r} has not called {ref['op']} #{s} ({ref['site']}): it waits in torch's {tp['op']}"
            f" #{tp['seq']} on the {_gname(tp['group'][len(TORCH_PREFIX):])} (a collective issued outside"
            f" hwdist: DDP, FSDP or torch.distributed), main thread in {where}; the ranks issue their"
            " collectives in different orders"
        )
    if _blind(rec, label):
        return (
            f"rank {r} has not called {ref['op']} #{s} ({ref['site']}); its main thread is in {where},"
            f" outside any hwdist call, and torch.distributed's own collectives (DDP's, FSDP's) are not"
            f" visible on this rank (torch {rec.get('torch', '?')}): it may be waiting in one of them"
            " (its stack is below). To see them: torch's own flight recorder (TORCH_FR_BUFFER_SIZE not 0;"
            " the CPU backend records itself on torch 2.13, every backend on torch >= 2.15), or"
            " HWDIST_FLIGHT_TORCH=1 on torch >= 2.14"
        )
    return f"rank {r} never called {ref['op']} #{s} ({ref['site']}); it is {_where(rec)}"


def _ranks(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0, 2`` or, for runs of four or more, ``ranks 0, 4-99``."""
    spans: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 3:
            spans.append(f"{ranks[i]}-{ranks[j]}")
        else:
            spans.extend(map(str, ranks[i:j + 1]))
        i = j + 1
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(spans)}"


def _gname(label: str) -> str:
    return "default group" if label == "default" else label


def _by_group(records: Records) -> dict[str, dict[int, dict[int, dict[str, Any]]]]:
    """group label -> rank -> seq -> entry."""
    out: dict[str, dict[int, dict[int, dict[str, Any]]]] = {}
    for rank, rec in records.items():
        if rec is None:
            continue
        for e in rec.get("entries") or []:
            out.setdefault(e["group"], {}).setdefault(rank, {})[int(e["seq"])] = e
    return out


def _members(label: str, records: Records, world_size: int) -> list[int]:
    for rec in records.values():
        for e in (rec or {}).get("entries") or []:
            if e["group"] == label and e.get("group_ranks") is not None:
                return list(e["group_ranks"])
    return list(range(world_size))


def divergence(records: Records, world_size: int) -> list[dict[str, Any]]:
    """Per group: the first sequence number where the ranks' calls (op and call site) differ.

    Returns:
        One dict per group: ``group``, ``backend``, ``first`` (the sequence number, or None when the ranks
        agree on every number all of them recorded), ``calls`` (rank -> ``op (site)`` at ``first``, or
        ``-`` where the rank had not called it) and ``last`` (rank -> highest sequence number recorded).
    """
    rows = []
    for label, ranks in sorted(_by_group(records).items()):
        members = _members(label, records, world_size)
        seqs = sorted({s for per in ranks.values() for s in per})
        lowest = max((min(per) for per in ranks.values() if per), default=0)  # the common window's start
        first: Optional[int] = None
        for s in seqs:
            if s < lowest:
                continue
            calls = {r: ranks.get(r, {}).get(s) for r in members if records.get(r) is not None}
            keys = {(e["op"], e["site"]) if e is not None else None for e in calls.values()}
            if len(keys) > 1:
                first = s
                break
        at = first if first is not None else (seqs[-1] if seqs else 0)
        backend = next((e["backend"] for per in ranks.values() for e in per.values()), "?")
        rows.append({
            "group": label,
            "backend": backend,
            "first": first,
            "calls": {
                r: (f"{e['op']} ({e['site']})" if (e := ranks.get(r, {}).get(at)) is not None else "-")
                if records.get(r) is not None else "no record"
                for r in members
            },
            "last": {r: max(ranks.get(r, {}) or [0]) for r in members},
        })
    return rows


#: What a rank without a record means, live (gathered through the store) and offline (dump files).
SILENT_LIVE = "did not answer (dead, or stuck where its watchdog cannot reach the store)"
SILENT_OFFLINE = "left no dump (it died before dumping, or its file was not collected)"


def diagnose(records: Records, world_size: int, offline: bool = False) -> str:
    """The one-line diagnosis: who is behind or elsewhere, for the oldest collective still in flight.

    Args:
        records: rank -> record, None for a rank without one.
        world_size: the number of ranks.
        offline: the records come from dump files (``hwdist trace``), not from a live gather: a rank
            without one "left no dump" rather than "did not answer".
    """
    parts: list[str] = []
    by_group = _by_group(records)
    silent = [r for r in range(world_size) if records.get(r) is None]
    hwdist_pending = False
    # hwdist's groups first (they have the call sites); the groups read from torch's recorder (their calls
    # include hwdist's own) only when no hwdist call is in flight: a DDP or FSDP hang
    order = sorted(by_group.items(), key=lambda kv: (kv[0].startswith(TORCH_PREFIX), kv[0]))
    for label, ranks in order:
        if label.startswith(TORCH_PREFIX) and hwdist_pending:
            continue
        members = _members(label, records, world_size)
        pending = {
            r: min((e for e in per.values() if e["state"] == "issued"), key=lambda e: int(e["seq"]))
            for r, per in ranks.items()
            if any(e["state"] == "issued" for e in per.values())
        }
        if not pending:
            for r, per in sorted(ranks.items()):
                last = per[max(per)]
                if last["state"] == "failed":
                    parts.append(
                        f"rank {r}: {last['op']} #{last['seq']} ({last['site']}) failed:"
                        f" {str(last.get('error', '?'))[:160]}"
                    )
            continue
        if not label.startswith(TORCH_PREFIX):
            hwdist_pending = True
        s = min(int(e["seq"]) for e in pending.values())
        waiters = sorted(r for r, e in pending.items() if int(e["seq"]) == s)
        clusters: dict[tuple[str, str], list[int]] = {}
        for r in waiters:
            clusters.setdefault((pending[r]["op"], pending[r]["site"]), []).append(r)
        main = max(clusters.values(), key=len)  # ties: the cluster of the lowest rank (dicts keep order)
        ref = pending[main[0]]
        who = _ranks(main)
        for others in clusters.values():
            if others is not main:
                o = pending[others[0]]
                parts.append(
                    f"{_ranks(others)} called {o['op']} #{s} ({o['site']}) where {who} called"
                    f" {ref['op']} #{s}"
                    f" ({ref['site']}); each waits"
                )
        div = divergence({r: records[r] for r in members if r in records}, world_size)
        first = next((d["first"] for d in div if d["group"] == label), None)
        if first is not None and first < s:
            at_first = {r: ranks.get(r, {}).get(first) for r in members}
            calls = "; ".join(
                f"rank {r} {c['op']} ({c['site']})" for r, c in at_first.items() if c is not None
            )
            parts.append(f"the ranks' calls on the {_gname(label)} first differ at #{first}: {calls}")
        for r in members:
            rec = records.get(r)
            if rec is None or r in waiters:
                continue
            e: Optional[dict[str, Any]] = ranks.get(r, {}).get(s)
            top = max(ranks.get(r, {}) or [0])
            if e is None and top < s:
                parts.append(_not_called(r, rec, ref, s, label))
            elif e is None:
                continue
            elif e["op"] != ref["op"]:
                parts.append(
                    f"rank {r} called {e['op']} #{s} ({e['site']}) where {who} called {ref['op']} #{s}"
                    f" ({ref['site']}); it is {_where(rec)}"
                )
            elif e["site"] != ref["site"]:
                parts.append(
                    f"rank {r} ran {e['op']} #{s} from {e['site']} where {who} call it from {ref['site']}"
                    f" (a skipped or extra collective); it is {_where(rec)}"
                )
            elif e["state"] == "failed":
                parts.append(f"rank {r}'s {e['op']} #{s} ({e['site']}) failed: {str(e.get('error'))[:160]}")
            elif e["state"] != "issued":
                parts.append(f"rank {r} finished {e['op']} #{s} ({e['site']}); it is {_where(rec)}")
        if not parts:
            parts.append(f"{who} wait in {ref['op']} #{s} ({ref['site']}) on the {_gname(label)}")
    if silent:
        parts.insert(0, f"{_ranks(silent)} {SILENT_OFFLINE if offline else SILENT_LIVE}")
    return "; ".join(parts) or "no collective in flight on any rank that answered"


def _last(rec: dict[str, Any], state: str) -> str:
    entries = rec.get("entries") or []
    own = [e for e in entries if not str(e.get("group", "")).startswith(TORCH_PREFIX)]
    torch_ = [e for e in entries if str(e.get("group", "")).startswith(TORCH_PREFIX)]
    found = _last_of(rec, own, state)
    return found if found != "-" else _last_of(rec, torch_, state)


def _last_of(rec: dict[str, Any], entries: list[dict[str, Any]], state: str) -> str:
    for e in reversed(entries):
        if e["state"] == state or (state == "completed" and e["state"] == "failed"):
            text = f"{e['op']} #{e['seq']} ({e['site']})"
            if e["group"] != "default":
                text += f" on {e['group']}"
            if state == "issued":
                args = f" {e['args']}," if e.get("args") else ""
                now = float(rec.get("time") or time.time())  # when the record was taken
                text += f"{args} {max(0.0, now - float(e['start'])):.1f} s"
            elif e["state"] == "failed":
                text += " FAILED"
            return text
    return "-"


def render(
    records: Records, world_size: int, headline: str = "", stacks: int = 24, offline: bool = False
) -> str:
    """The full report: headline, diagnosis, one row per rank, the per-group table and the stacks.

    ``offline``: as for [`diagnose`][hwdist.flight.report.diagnose]; runs of ranks without a record are
    then shown as one row.
    """
    lines = [f"hwdist hang doctor: {headline}" if headline else "hwdist hang doctor"]
    lines.append(f"diagnosis: {diagnose(records, world_size, offline)}")
    lines.append("ranks:")
    missing = "no dump file" if offline else "no record (did not answer)"
    r = 0
    while r < world_size:
        rec = records.get(r)
        if rec is None:
            end = r
            while end + 1 < world_size and records.get(end + 1) is None:
                end += 1
            lines.append(f"  rank {r}: {missing}" if end == r else f"  ranks {r}-{end}: {missing}")
            r = end + 1
            continue
        lines.append(
            f"  rank {r} ({rec.get('host', '?')} pid {rec.get('pid', '?')}):"
            f" last completed {_last(rec, 'completed')};"
            f" pending {_last(rec, 'issued')}; main thread in {rec.get('where') or '?'}"
        )
        r += 1
    lines.append("groups (first sequence number where the ranks' calls differ):")
    for d in divergence(records, world_size):
        first = f"#{d['first']}" if d["first"] is not None else "none in the recorded window"
        calls = ", ".join(f"rank {r}: {c}" for r, c in d["calls"].items() if records.get(r) is not None)
        last = ", ".join(f"{r}:#{s}" for r, s in d["last"].items() if records.get(r) is not None)
        lines.append(f"  {d['group']} ({d['backend']}): first divergence {first}; {calls}; last seq {last}")
    lines.append("main-thread stacks (innermost last):")
    for r, rec in sorted(records.items()):
        if rec is None:
            continue
        lines.append(f"  rank {r}:")
        lines.extend(f"    {frame}" for frame in (rec.get("stack") or [])[-stacks:])
    return "\n".join(lines)
