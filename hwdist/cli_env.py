"""``hwdist env``: what this machine offers, as a table, JSON, or a block to paste into a bug report.

Device and backend knowledge comes from the drivers: each driver's
``env_vars`` (the variables that tune it) and ``details()`` (runtime and
vendor versions). Values of variables whose names contain TOKEN, KEY,
SECRET, PASSWORD (or PASSWD, CREDENTIAL) are never printed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import re
import shutil
import sys
from typing import Any, Optional, TextIO

import torch

__all__ = [
    "env_report",
    "cmd_env",
    "system_facts",
    "settings_report",
    "environment_variables",
    "MASK",
    "SECRET_WORDS",
]

#: Variables every report shows when set (names, or prefixes ending in '*'), besides the drivers' own and
#: the launchers' (hwdist.launch.resolvers.LAUNCHER_VARIABLES).
_COMMON_VARS = (
    "HWDIST_*",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_CPP_LOG_LEVEL",
    "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_FR_*",  # torch's own flight recorder (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE, ...)
    "TORCH_DIST_NAN_CHECK",
)
#: A variable whose name contains one of these words has its value masked.
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
MASK = "***"


def _ident(key: str) -> str:
    """A JSON key as an identifier: ``'torch built with MPI'`` -> ``'torch_built_with_mpi'``."""
    return re.sub(r"\W+", "_", str(key)).strip("_").lower() or "_"


def _plain(obj: Any) -> Any:
    """A JSON-friendly version of ``obj`` (dataclasses, namedtuples, objects with as_dict)."""
    import dataclasses

    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "as_dict") and callable(obj.as_dict):
        return _plain(obj.as_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        return _plain(obj._asdict())
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    return str(obj)


# --------------------------------------------------------------------------
# facts
# --------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _os_name() -> str:
    release = _read("/etc/os-release")
    found = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', release, re.MULTILINE)
    if found:
        return found.group(1)
    if sys.platform == "darwin":
        return f"macOS {platform.mac_ver()[0]}"
    return f"{platform.system()} {platform.release()}".strip()


def _cpu_model() -> Optional[str]:
    found = re.search(r"^(?:model name|Hardware|Processor)\s*:\s*(.+)$", _read("/proc/cpuinfo"), re.MULTILINE)
    if found:
        return found.group(1).strip()
    return platform.processor() or None


def _memory_bytes() -> Optional[int]:
    found = re.search(r"^MemTotal:\s*(\d+)\s*kB", _read("/proc/meminfo"), re.MULTILINE)
    if found:
        return int(found.group(1)) * 1024
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def system_facts() -> dict[str, Any]:
    """OS, kernel, CPU model and counts, RAM, ``/dev/shm`` (shared memory; small in containers), and
    torch's intra-op thread count with ``OMP_NUM_THREADS`` (None when unset)."""
    shm: dict[str, Optional[int]] = {"total_bytes": None, "free_bytes": None}
    if os.path.isdir("/dev/shm"):
        try:
            usage = shutil.disk_usage("/dev/shm")
            shm = {"total_bytes": usage.total, "free_bytes": usage.free}
        except OSError:
            pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "os": _os_name(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "memory_bytes": _memory_bytes(),
        "shm": shm,
        # intra-op threads per process: torchrun sets OMP_NUM_THREADS=1, a plain launch does not
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def _is_secret(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def _shown(name: str, value: str) -> str:
    """``value``, or the mask when ``name`` looks like a secret's."""
    return MASK if _is_secret(name) else value


def settings_report() -> list[dict[str, Any]]:
    """Every ``HWDIST_*`` setting (``hwdist.settings.SETTINGS``).

    Each with its kind, default, value set (secrets masked) and meaning.
    """
    from . import settings

    return [
        {
            "name": s.name,
            "kind": s.kind,
            "default": s.default,
            "value": None if value is None else _shown(s.name, value),
            "doc": s.doc,
            **({"choices": list(s.choices)} if s.choices else {}),
        }
        for s, value in settings.current()
    ]


def environment_variables(environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The set variables that matter to distributed runs, secrets masked.

    The drivers' ``env_vars``, the launchers' and a few common ones.
    """
    from . import registry
    from .launch.resolvers import LAUNCHER_VARIABLES

    env = dict(os.environ if environ is None else environ)
    patterns = list(_COMMON_VARS)
    for family in LAUNCHER_VARIABLES:
        patterns += [*family.names, *family.patterns]
    for drv in registry.drivers():
        patterns += list(drv.env_vars)
    found = {}
    for name in sorted(env):
        if any(fnmatch.fnmatchcase(name, pat) for pat in patterns):
            found[name] = _shown(name, env[name])
    return found


def _launcher_report() -> dict[str, Any]:
    import hwdist
    from hwdist.launch.resolvers import LAUNCHER_VARIABLES

    found = {
        family.family: {var: _shown(var, os.environ[var]) for var in family.names if var in os.environ}
        for family in LAUNCHER_VARIABLES
    }
    report: dict[str, Any] = {"variables": {k: v for k, v in found.items() if v}}
    try:
        report["inferred"] = _plain(hwdist.infer_launcher())
    except Exception as exc:  # report, never crash the environment report
        report["inferred"] = None
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report


def _runtime_details() -> dict[str, dict[str, Any]]:
    """Each driver's own runtime facts (``Driver.details()``), keys as identifiers."""
    from hwdist import registry

    out = {}
    for drv in registry.drivers():
        try:
            facts = drv.details()
        except Exception as exc:  # a broken vendor install must not hide the others
            facts = {"error": f"{type(exc).__name__}: {exc}"}
        if facts:
            out[drv.name] = {_ident(k): _plain(v) for k, v in facts.items()}
    return out


def _drivers() -> list[dict[str, Any]]:
    from hwdist import registry

    rows = []
    for drv in registry.drivers():
        try:
            why = drv.unavailable_reason()
        except Exception as exc:  # a broken vendor install must not hide the others
            why = f"checking availability failed: {type(exc).__name__}: {exc}"
        count: Optional[int] = None
        if why is None:
            try:
                count = int(drv.device_count())
            except Exception as exc:
                why = f"counting devices failed: {type(exc).__name__}: {exc}"
        rows.append(
            {
                "name": drv.name,
                "device_type": drv.device_type,
                "priority": drv.priority,
                "available": why is None,
                "device_count": count,
                "reason": why,
                "description": drv.description,
                "torch_name": drv.torch_name,
                "capabilities": drv.capabilities(),
            }
        )
    return rows


def env_report() -> dict[str, Any]:
    """Everything ``hwdist env`` shows, as plain data (every key an identifier)."""
    import numpy

    import hwdist
    import hwdist.testing  # noqa: F401  (registers the emulated accelerator 'emu')

    try:
        detection: dict[str, Any] = hwdist.detect().as_dict()
    except hwdist.BackendError as exc:
        detection = {"error": str(exc)}
    dist = torch.distributed
    torch_map: dict[str, Any] = {}
    if dist.is_available():
        torch_map = {
            "default_device_backend_map": dict(getattr(dist.Backend, "default_device_backend_map", {})),
            "backend_list": list(getattr(dist.Backend, "backend_list", [])),
        }
    return {
        "hwdist": {"version": hwdist.__version__, "path": os.path.dirname(os.path.abspath(hwdist.__file__))},
        "python": {
            "version": platform.python_version(),
            "executable": sys.executable,
            "platform": platform.platform(),
        },
        "torch": {
            "version": torch.__version__,
            "distributed": bool(dist.is_available()),
            "debug_build": bool(getattr(torch.version, "debug", False)),
        },
        "numpy": {"version": numpy.__version__},
        "system": system_facts(),
        "drivers": _drivers(),
        "detection": detection,
        "launcher": _launcher_report(),
        "runtime_details": _runtime_details(),
        "settings": settings_report(),
        "environment": environment_variables(),
        "torch_backends": torch_map,
    }


# --------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------


def _gib(nbytes: Optional[int]) -> str:
    return "unknown" if nbytes is None else f"{nbytes / (1 << 30):.1f} GiB"


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} ({v})" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "not installed" if value is None else str(value)


def _system_line(sysf: dict[str, Any]) -> list[str]:
    shm = sysf["shm"]
    shm_text = (
        "absent"
        if shm["total_bytes"] is None
        else f"{_gib(shm['total_bytes'])} ({_gib(shm['free_bytes'])} free)"
    )
    return [
        f"OS: {sysf['os']} (kernel {sysf['kernel']}, {sysf['machine']})",
        f"CPU: {sysf['cpu_model'] or 'unknown'}; {sysf['cpu_count']} logical CPU(s), {sysf['cpus_usable']}"
        " usable",
        f"RAM: {_gib(sysf['memory_bytes'])}; /dev/shm: {shm_text}",
        f"Threads: torch uses {sysf['torch_threads']} per process; OMP_NUM_THREADS="
        + (sysf["omp_num_threads"] if sysf["omp_num_threads"] is not None else "unset"),
    ]


def _print_env(rep: dict[str, Any], out: TextIO) -> None:
    w = out.write
    w(f"hwdist {rep['hwdist']['version']}  ({rep['hwdist']['path']})\n")
    w(f"python {rep['python']['version']}  ({rep['python']['executable']}; {rep['python']['platform']})\n")
    w(
        f"torch  {rep['torch']['version']}  (torch.distributed"
        f" {'available' if rep['torch']['distributed'] else 'NOT available'})\n"
    )
    w(f"numpy  {rep['numpy']['version']}\n\n")
    w("System:\n")
    for line in _system_line(rep["system"]):
        w(f"  {line}\n")
    w("\nDrivers (detection order):\n")
    w(f"  {'backend':<10} {'device':<8} {'prio':>5}  {'available':<10} {'devices':>7}  note\n")
    for d in rep["drivers"]:
        avail = "yes" if d["available"] else "no"
        count = "-" if d["device_count"] is None else str(d["device_count"])
        note = d["description"] if d["available"] else d["reason"]
        w(f"  {d['name']:<10} {d['device_type']:<8} {d['priority']:>5}  {avail:<10} {count:>7}  {note}\n")
    det = rep["detection"]
    w("\nDetection:\n")
    if "error" in det:
        w(f"  error: {det['error']}\n")
    else:
        chosen = f"chosen by {det['source']}" if det["overridden"] else "auto-detected"
        w(f"  device {det['device_type']}, backend {det['backend']} ({chosen}: {det['reason']})\n")
        if det.get("vendor_note"):
            w(f"  vendor: {det['vendor_note']}\n")
    lau = rep["launcher"]
    w("\nLauncher:\n")
    if lau.get("error"):
        w(f"  infer_launcher() failed: {lau['error']}\n")
    else:
        inferred = lau["inferred"]
        w(f"  inferred: {inferred}{' (a single process)' if inferred == 'none' else ''}\n")
    for name, variables in lau["variables"].items():
        w(f"  {name}: " + " ".join(f"{k}={v}" for k, v in variables.items()) + "\n")
    for name, facts in rep["runtime_details"].items():
        w(f"\n{name} runtime:\n")
        for key, value in facts.items():
            w(f"  {key.replace('_', ' ')}: {_value(value)}\n")
    w("\nhwdist settings (HWDIST_*):\n")
    for st in rep["settings"]:
        value = (
            f"{st['name']}={st['value']}"
            if st["value"] is not None
            else f"{st['name']} (unset; default {st['default']!r})"
        )
        w(f"  {value:<44} {st['doc']}\n")
    w("\nEnvironment variables (secrets masked):\n")
    for key, value in rep["environment"].items():
        w(f"  {key}={value}\n")
    if not rep["environment"]:
        w("  (none of the relevant ones is set)\n")
    tb = rep["torch_backends"]
    if tb:
        w("\ntorch.distributed backends:\n")
        mapping = ", ".join(f"{k} -> {v}" for k, v in tb["default_device_backend_map"].items())
        w(f"  default device map: {mapping}\n")
        w(f"  known: {', '.join(tb['backend_list'])}\n")


def _print_issue(rep: dict[str, Any], out: TextIO) -> None:
    """A compact block to paste into a bug report (a fenced code block in Markdown)."""
    lines = [
        "```text",
        f"hwdist: {rep['hwdist']['version']}",
        f"python: {rep['python']['version']} ({rep['python']['platform']})",
    ]
    dist = "yes" if rep["torch"]["distributed"] else "NO"
    lines.append(f"torch: {rep['torch']['version']} (distributed: {dist})")
    lines.append(f"numpy: {rep['numpy']['version']}")
    lines += _system_line(rep["system"])
    available = [
        f"{d['name']} ({d['device_type']} x{d['device_count']})" for d in rep["drivers"] if d["available"]
    ]
    lines.append(f"backends available: {', '.join(available) or 'none'}")
    det = rep["detection"]
    lines.append(
        f"detected: error: {det['error']}"
        if "error" in det
        else f"detected: backend {det['backend']}, device {det['device_type']}"
        + (f" ({det['vendor_note']})" if det.get("vendor_note") else "")
    )
    lines.append(f"launcher: {rep['launcher'].get('inferred')}")
    for name, facts in rep["runtime_details"].items():
        lines.append(f"{name}: " + "; ".join(f"{k.replace('_', ' ')} {_value(v)}" for k, v in facts.items()))
    env = rep["environment"]
    lines.append(
        "environment: "
        + (" ".join(f"{k}={v}" for k, v in env.items()) if env else "(none of the relevant variables set)")
    )
    lines.append("```")
    out.write("\n".join(lines) + "\n")


def cmd_env(args: argparse.Namespace, out: TextIO) -> int:
    """``hwdist env``."""
    rep = env_report()
    if args.json:
        json.dump(rep, out, indent=2, default=str)
        out.write("\n")
    elif args.issue:
        _print_issue(rep, out)
    else:
        _print_env(rep, out)
    return 0
