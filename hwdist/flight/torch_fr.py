"""torch's own flight recorder, read as entries of hwdist's record (torch with ``_dump_fr_trace_json``).

torch records the collectives of every group whose backend records itself (gloo
on torch 2.13 and 2.15 CPU; on 2.15 also, through ``FlightRecorderHook``, the
groups of backends that do not record themselves) in a ring of
``TORCH_FR_BUFFER_SIZE`` entries (default 2000; 0 turns it off). That ring holds
what hwdist's own recorder cannot see without hooks: DDP's gradient
all-reduces, FSDP's all-gathers and reduce-scatters, plain
``torch.distributed`` calls. The watchdog reads it every tick (an entry not
retired after ``HWDIST_HANG_TIMEOUT`` opens a report, as an overdue hwdist call
does), and each rank's record carries its last entries, so the report and
``hwdist trace`` compare the ranks' sequence numbers per group.

An entry becomes a dict shaped like [`entry_dict`][hwdist.flight.recorder.entry_dict]'s,
with the group label prefixed ``torch:`` (torch numbers a group's calls on its
own, hwdist's calls included, so the two counts never mix) and the site
``torch`` (torch's JSON dump carries no Python frame: the rank's stack in the
report says where its main thread is).
"""

from __future__ import annotations

from typing import Any, Optional

from .. import _compat

__all__ = ["available", "read", "PREFIX"]

#: Prefix of the group labels of torch-recorded entries.
PREFIX = "torch:"
SITE = "torch"


def available() -> bool:
    """Whether this torch exposes its flight recorder (``_dump_fr_trace_json``)."""
    return _compat.TORCH_FR


def _groups() -> dict[str, tuple[str, Optional[list[int]]]]:
    """torch's group name -> (hwdist label, ranks) for every group torch has made."""
    import torch.distributed as torch_dist

    out: dict[str, tuple[str, Optional[list[int]]]] = {}
    world = _compat.default_group()
    for pg in _compat.torch_groups():
        name = _compat.group_name(pg)
        if name is None:
            continue
        try:
            ranks: Optional[list[int]] = list(torch_dist.get_process_group_ranks(pg))
        except Exception:
            ranks = None
        if pg is world:
            out[name] = ("default", ranks)
        else:
            label = f"group[{','.join(map(str, ranks))}]" if ranks is not None else f"group@{id(pg):x}"
            out[name] = (label, ranks)
    return out


def _backends() -> list[str]:
    """The backend names of torch's groups (from torch's device-to-backend strings)."""
    names: list[str] = []
    for pg in _compat.torch_groups():
        config = _compat.group_backend_config(pg) or ""
        for part in config.split(","):
            name = part.rpartition(":")[2].strip()
            if name and name not in names:
                names.append(name)
    return names


def _args(e: dict[str, Any]) -> str:
    dtypes, sizes = e.get("input_dtypes") or [], e.get("input_sizes") or []
    if not dtypes or not sizes:
        return ""
    one = f"{str(dtypes[0]).lower()}[{', '.join(map(str, sizes[0]))}]"
    return one if len(sizes) == 1 else f"list[{len(sizes)}] of {one}"


def read(last: int = 64) -> tuple[list[dict[str, Any]], list[str]]:
    """torch's recorded collectives (the last ``last`` per group) and the labels of the groups it records.

    Returns:
        ``(entries, seen)``: entries oldest first per group, as dicts with ``group`` (``torch:<label>``),
        ``group_ranks``, ``backend``, ``seq``, ``op``, ``args``, ``site`` (``torch``), ``start``, ``end``
        (None), ``state`` (issued or completed) and ``thread``; ``seen``: the hwdist labels of the groups
        with at least one entry in torch's ring. ``([], [])`` where torch has no recorder or it is off.
    """
    if not _compat.TORCH_FR:
        return [], []
    try:
        groups = _groups()
    except Exception:
        return [], []
    per_group: dict[str, list[dict[str, Any]]] = {}
    backends = _backends() if _compat.TORCH_FR_PER_BACKEND else ["?"]  # 2.13: one ring for all
    for backend in backends:
        dump = _compat.torch_fr_dump(backend)
        for e in (dump or {}).get("entries") or []:
            if e.get("is_p2p"):
                continue  # point-to-point calls have their own numbering; collectives only
            pg = e.get("process_group") or ["?"]
            label, ranks = groups.get(str(pg[0]), (f"pg{pg[0]}", None))
            prof = str(e.get("profiling_name") or "?")
            per_group.setdefault(label, []).append({
                "group": PREFIX + label,
                "group_ranks": ranks,
                "backend": prof.partition(":")[0] if ":" in prof else backend,
                "seq": int(e.get("collective_seq_id") or 0),
                "op": prof.rpartition(":")[2],
                "args": _args(e),
                "site": SITE,
                "file": None,
                "func": None,
                "start": float(e.get("time_created_ns") or 0) / 1e9,
                "end": None,
                "state": "completed" if e.get("retired") else "issued",
                "thread": e.get("thread_id"),
            })
    entries: list[dict[str, Any]] = []
    for label in sorted(per_group):
        rows = sorted(per_group[label], key=lambda d: d["seq"])
        entries.extend(rows[-last:])
    return entries, sorted(per_group)


def overdue(timeout: float, now: float, seen: set[tuple[str, int]]) -> Optional[dict[str, Any]]:
    """The oldest torch-recorded collective in flight for more than ``timeout`` s and not in ``seen``."""
    entries, _ = read(last=1 << 30)
    late = [
        e for e in entries
        if e["state"] == "issued" and now - e["start"] > timeout and (e["group"], e["seq"]) not in seen
    ]
    return min(late, key=lambda e: e["start"]) if late else None
