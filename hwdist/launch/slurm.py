"""The ``slurm`` launcher: one process per task started by ``srun``."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Callable, Optional

from .base import Launcher, LaunchInfo, LauncherError, check_consistent, env_int, require_int

__all__ = ["SlurmLauncher", "expand_hostlist", "expand_tasks_per_node", "port_from_job_id"]

#: ``MASTER_PORT`` when Slurm gives no job id (torch's default).
DEFAULT_PORT = 29500
#: Ports derived from the job id fall in [PORT_BASE, PORT_BASE + PORT_SPAN): below
#: Linux's default ephemeral range (32768-60999), so they do not collide with
#: ports the OS hands out.
PORT_BASE = 12000
PORT_SPAN = 20000
#: The most hosts (or node counts) a node list or ``SLURM_TASKS_PER_NODE`` may expand to:
#: far above any Slurm cluster, far below what would exhaust memory.
MAX_EXPANSION = 1_000_000


def port_from_job_id(job_id: Optional[str]) -> int:
    """A deterministic rendezvous port for a Slurm job id (every task computes the same one)."""
    if job_id is None or not job_id.strip().isdigit():
        return DEFAULT_PORT
    return PORT_BASE + int(job_id.strip()) % PORT_SPAN


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise LauncherError(f"malformed Slurm node list {text!r}: unbalanced brackets")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _too_many(what: str, text: str, count: int) -> LauncherError:
    return LauncherError(
        f"{what} {text!r} expands to {count} entries, more than hwdist's limit of {MAX_EXPANSION};"
        " is the variable corrupted?"
    )


def _ranges(spec: str, whole: str) -> list[tuple[int, int, int]]:
    """A bracket's ``lo-hi`` items as ``(lo, hi, zero-padded width)`` (ASCII digits only, checked)."""
    out = []
    for item in spec.split(","):
        lo, dash, hi = item.partition("-")
        if not dash:
            hi = lo
        if not (_DIGITS.fullmatch(lo) and _DIGITS.fullmatch(hi)) or int(hi) < int(lo):
            what = "range" if dash else "item"
            raise LauncherError(f"malformed Slurm node list {whole!r}: bad {what} {item!r}")
        out.append((int(lo), int(hi), len(lo)))
    return out


_DIGITS = re.compile(r"[0-9]{1,18}")  # more digits are no host number (and int() of 4300+ refuses)


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand a Slurm host list (``'gpu[01-03,07],login1'``) into host names, in order.

    Used when ``scontrol`` is not available; handles several bracket groups
    per name (``'r[1-2]n[1-2]'``) and keeps zero padding.
    """
    hosts: list[str] = []
    for pattern in _split_top(nodelist):
        parts = [
            (literal, _ranges(spec, nodelist) if spec else [])
            for literal, spec in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", pattern)
            if literal or spec
        ]
        count = len(hosts)  # counted before anything is built: n[0-99999999] must not exhaust memory
        size = 1
        for _, ranges in parts:
            size *= sum(hi - lo + 1 for lo, hi, _ in ranges) if ranges else 1
        if count + size > MAX_EXPANSION:
            raise _too_many("Slurm node list", nodelist, count + size)
        expansions = [""]
        for literal, ranges in parts:
            choices = [str(i).zfill(w) for lo, hi, w in ranges for i in range(lo, hi + 1)] if ranges else [""]
            expansions = [e + literal + c for e in expansions for c in choices]
        hosts.extend(expansions)
    return hosts


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` (``'2(x3),1'`` -> ``[2, 2, 2, 1]``)."""
    runs: list[tuple[int, int]] = []
    for item in spec.split(","):
        m = re.fullmatch(r"\s*([0-9]{1,18})(?:\(x([0-9]{1,18})\))?\s*", item)
        if m is None:
            raise LauncherError(f"malformed SLURM_TASKS_PER_NODE {spec!r}")
        runs.append((int(m.group(1)), int(m.group(2) or 1)))
    total = sum(n for _, n in runs)  # counted before anything is built: 2(x100000000000) is a typo, not a job
    if total > MAX_EXPANSION:
        raise _too_many("SLURM_TASKS_PER_NODE", spec, total)
    return [count for count, n in runs for _ in range(n)]


def scontrol_hostnames(nodelist: str) -> Optional[list[str]]:
    """``scontrol show hostnames NODELIST``, or None when scontrol is missing or fails."""
    exe = shutil.which("scontrol")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    hosts = proc.stdout.split()
    return hosts or None


class SlurmLauncher(Launcher):
    """Reads ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and the node list.

    Args:
        hostnames: how to expand a node list; default ``scontrol show
            hostnames`` with [`expand_hostlist`][hwdist.launch.slurm.expand_hostlist] as the fallback. Tests
            inject a fake here.
    """

    name = "slurm"
    priority = 10
    description = "Slurm srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST)"

    def __init__(self, hostnames: Optional[Callable[[str], Optional[list[str]]]] = None) -> None:
        self.hostnames = hostnames or scontrol_hostnames

    def detect(self, env: Mapping[str, str]) -> bool:
        """``SLURM_NTASKS`` is set (mmengine's rule)."""
        return "SLURM_NTASKS" in env

    def first_host(self, nodelist: str) -> str:
        """The first host of ``nodelist`` (rank 0 runs there under the default distribution)."""
        hosts = self.hostnames(nodelist) or expand_hostlist(nodelist)
        if not hosts:
            raise LauncherError(f"Slurm node list {nodelist!r} names no host")
        return hosts[0]

    def resolve(self, env: Mapping[str, str]) -> LaunchInfo:
        """Read Slurm's variables; derive ``MASTER_ADDR``/``MASTER_PORT`` when unset."""
        rank = require_int(env, self.name, "SLURM_PROCID")
        world = require_int(env, self.name, "SLURM_NTASKS", "SLURM_NPROCS")
        node = env_int(env, "SLURM_NODEID")
        local_size = (
            env_int(env, "SLURM_NTASKS_PER_NODE") if "(" not in env.get("SLURM_NTASKS_PER_NODE", "") else None
        )
        per_node = env.get("SLURM_TASKS_PER_NODE", "").strip()
        if per_node:
            counts = expand_tasks_per_node(per_node)
            if node is not None and node < len(counts):
                local_size = counts[node]
            elif len(set(counts)) == 1:
                local_size = counts[0]
        local = env_int(env, "SLURM_LOCALID")
        if local is None:
            if local_size is None and world > 1:
                raise LauncherError(
                    "launcher 'slurm': SLURM_LOCALID is not set, so the local rank is unknown."
                    " Start each task with srun (not from the batch script directly)"
                )
            local = rank % local_size if local_size else 0
        for var, value, src in (
            ("RANK", rank, "SLURM_PROCID"),
            ("WORLD_SIZE", world, "SLURM_NTASKS"),
            ("LOCAL_RANK", local, "SLURM_LOCALID"),
        ):
            check_consistent(env, self.name, var, value, src)
        addr = env.get("MASTER_ADDR") or None
        if addr is None:
            nodelist = (
                env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST")
            )
            if not nodelist:
                raise LauncherError(
                    "launcher 'slurm': MASTER_ADDR is not set and neither is SLURM_NODELIST;"
                    " set MASTER_ADDR to the host of rank 0"
                )
            addr = self.first_host(nodelist)
        port = env_int(env, "MASTER_PORT")
        if port is None:
            port = port_from_job_id(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))
        return self.launch_info(env, rank, world, local, local_size, node, addr, port)
