"""Run a function on N real ranks and report every rank's outcome.

* Ranks are fresh processes, forked by a forkserver that imported torch
  once (spawned where the platform has no forkserver), each started with the
  caller's environment. They join through a private (0700) file store (no
  ports to choose); Gloo's pair sockets are kept on the loopback interface
  (``GLOO_SOCKET_IFNAME``, unless set by the user).
* A [`RankPool`][hwdist.testing.harness.RankPool] keeps its ranks and their process group alive between
  calls, so hundreds of checks cost one start per (world size, backend).
* Every call has a hard timeout; the process group gets its own timeout too.
* The first failure ends the call: the other ranks get a short grace period
  to report, then their stacks are dumped (faulthandler) and they are killed.
  The report puts the root cause first: a rank that died, then a rank that
  raised first, then the others, then hung ranks with their stacks.
* ``pytest.skip`` inside a rank (or [`RankSkip`][hwdist.testing.harness.RankSkip]) skips the test.

Functions and arguments travel by pickle, so the function must be importable
(module level). Results come back pickled (tensors included).
"""

from __future__ import annotations

import ast
import faulthandler
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Collection, Optional

from .. import settings as _settings

__all__ = [
    "RankPool",
    "RankFailure",
    "RankSkip",
    "run_distributed",
    "DEFAULT_TIMEOUT",
    "DEFAULT_PG_TIMEOUT",
]

DEFAULT_TIMEOUT = float(_settings.bounded("HWDIST_TEST_TIMEOUT", 0.001, 1e7, what="seconds"))
"""Hard limit for one call on all ranks, in seconds."""
DEFAULT_PG_TIMEOUT = float(_settings.bounded("HWDIST_TEST_PG_TIMEOUT", 0.001, 1e7, what="seconds"))
"""Timeout handed to the process group (collectives, rendezvous), in seconds."""
#: How long the other ranks may take to report once one rank failed.
FAILURE_GRACE = 1.5


class RankFailure(AssertionError):
    """One or more ranks failed, died or hung; the message tells each rank's story."""

    def __init__(self, message: str, errors: Optional[dict[int, str]] = None) -> None:
        super().__init__(message)
        self.errors = errors or {}


class RankSkip(Exception):
    """Raise in a rank to skip the whole call (pytest.skip is recognised too)."""


@dataclass
class _Outcome:
    status: str  # ok | error | skip | died | hung | init_error
    value: Any = None
    text: str = ""
    at: float = field(default_factory=time.monotonic)


def is_skip(exc: BaseException) -> bool:
    """Whether ``exc`` means the rank skipped its test (ours, pytest's or unittest's)."""
    return isinstance(exc, RankSkip) or type(exc).__name__ in ("Skipped", "SkipTest")


#: Modules a forkserver imports once, before it forks ranks: torch's import is most of a rank's start-up
#: (seconds of CPU; about twice as long for torch's CUDA wheels as for its CPU ones).
PRELOAD = ("torch", "torch.distributed", "numpy")


def _context() -> Any:
    """The multiprocessing context ranks start in: a forkserver that has imported ``PRELOAD`` where the
    platform has one (a rank then starts in a fraction of a second), else spawn. Either way a rank is a
    fresh process with nothing of the caller's but what ``_worker`` is handed."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # (no effect once this process's forkserver runs)
    return ctx


class _CallerStreams:
    """The caller's descriptors 1 and 2 as they are when a rank starts, for a forkserver's child (which
    would otherwise write where the forkserver's pointed when it started: another test's capture, a pipe
    since closed). Pickled with the rank's arguments, it travels as descriptors and is unpickled in the
    rank as ``_adopt_streams``; a descriptor the caller has closed is closed in the rank too."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        from multiprocessing import reduction

        def open_(fd: int) -> bool:
            try:
                os.fstat(fd)
            except OSError:
                return False
            return True

        return _adopt_streams, tuple(reduction.DupFd(fd) if open_(fd) else None for fd in (1, 2))


def _adopt_streams(*dups: Any) -> None:
    """In a rank: make the caller's descriptors (``_CallerStreams``) its descriptors 1 and 2."""
    for fd, dup in zip((1, 2), dups):
        try:
            if dup is None:
                os.close(fd)
                continue
            got = dup.detach()
            if got != fd:
                os.dup2(got, fd)
                os.close(got)
        except OSError:
            pass


def _apply_env(env: dict[str, str]) -> None:
    """Make ``env`` this rank's whole environment, as a spawned process would start with it (a forkserver's
    child inherits the forkserver's, from when it started); OpenMP read its thread count when torch was
    imported, so an ``OMP_NUM_THREADS`` that differs is applied through torch."""
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ.clear()
    os.environ.update(env)
    threads = env.get("OMP_NUM_THREADS")
    if threads != before and threads is not None and threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


def _worker(
    rank: int,
    world_size: int,
    backend: Optional[str],
    store_path: str,
    conn: Any,
    pg_timeout: float,
    env: dict[str, str],
    stack_path: str,
    streams: None = None,  # (``_CallerStreams``, applied while the arguments were unpickled)
) -> None:
    _apply_env(env)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        HWDIST_TEST_RANK="1",
    )
    stack_file = open(stack_path, "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    try:
        from .emulated import register_emulated

        register_emulated()  # what importing hwdist.testing does: the emulated accelerator, registered

        if backend is not None:
            from hwdist.launch.core import init_backend

            init_backend(
                backend,
                rank=rank,
                world_size=world_size,
                local_rank=rank,
                init_method=f"file://{store_path}",
                timeout=pg_timeout,
            )
    except BaseException as exc:
        conn.send_bytes(pickle.dumps(("init_error", None, traceback.format_exc(), repr(exc))))
        return
    conn.send_bytes(pickle.dumps(("ready", None, "", "")))
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            break
        task = pickle.loads(payload)
        if task is None:
            break
        fn, args, kwargs = task
        try:
            result = fn(*args, **kwargs)
            reply = ("ok", result, "", "")
            data = pickle.dumps(reply)
        except BaseException as exc:  # report everything, KeyboardInterrupt included
            kind = "skip" if is_skip(exc) else "error"
            data = pickle.dumps((kind, None, traceback.format_exc(), f"{type(exc).__name__}: {exc}"))
        conn.send_bytes(data)
    try:
        from hwdist.launch.core import destroy

        destroy()
    except Exception:
        pass


class RankPool:
    """N live ranks sharing one process group, reused for many calls.

    Args:
        world_size: number of ranks.
        backend: backend name to initialise (None: no process group; the
            function sets one up itself).
        timeout: default hard limit for one call, in seconds.
        pg_timeout: process-group timeout, in seconds.
        env: extra environment variables for the ranks.

    Examples:
        >>> with RankPool(2, "gloo") as pool:
        ...     pool.run(check_all_reduce)   # -> [rank0_result, rank1_result]
    """

    def __init__(
        self,
        world_size: int,
        backend: Optional[str] = "gloo",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        pg_timeout: float = DEFAULT_PG_TIMEOUT,
        env: Optional[dict[str, str]] = None,
    ) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if getattr(mp.current_process(), "_inheriting", False):  # a rank importing the main script
            raise RuntimeError(GUARD_HINT.format(where="at its top level"))
        self._unguarded = _unguarded_main_call()
        self.world_size = world_size
        self.backend = backend
        self.timeout = timeout
        self.pg_timeout = pg_timeout
        self.env = {**_loopback_env(), **(env or {})}
        self.broken = False
        short = _too_few_devices(world_size, backend)
        if short is not None:
            if "pytest" in sys.modules:
                _skip(short)
            raise RankFailure(short)
        self._dir = tempfile.mkdtemp(prefix="hwdist-ranks-")  # private (0700)
        ctx = _context()
        environ = {**os.environ, **self.env}  # the caller's environment now (a forkserver's is older)
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker,
                args=(
                    rank,
                    world_size,
                    backend,
                    os.path.join(self._dir, "store"),
                    child,
                    pg_timeout,
                    environ,
                    self._stack_path(rank),
                    _CallerStreams() if ctx.get_start_method() == "forkserver" else None,
                ),
                name=f"hwdist-rank{rank}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._collect("start-up", timeout, expect="ready")

    def _stack_path(self, rank: int) -> str:
        return os.path.join(self._dir, f"rank{rank}.stack")

    # -- public ---------------------------------------------------------------
    def run(
        self, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None, **kwargs: Any
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results by rank.

        Raises:
            RankFailure: a rank raised, died or hung (all ranks' stories told).
        """
        if self.broken:
            raise RuntimeError("this RankPool is broken by an earlier failure; create a new one")
        payload = pickle.dumps((fn, args, kwargs))
        for conn in self._conns:
            conn.send_bytes(payload)
        name = getattr(fn, "__qualname__", repr(fn))
        return self._collect(name, timeout or self.timeout, expect="ok")

    def close(self) -> None:
        """Stop the ranks (politely, then by force) and remove the store."""
        for conn in self._conns:
            try:
                conn.send_bytes(pickle.dumps(None))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self._kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals --------------------------------------------------------------
    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(5)
        for conn in self._conns:
            conn.close()

    def _collect(self, what: str, timeout: float, expect: str) -> list[Any]:
        pending = set(range(self.world_size))
        outcomes: dict[int, _Outcome] = {}
        deadline = time.monotonic() + timeout
        first_failure: Optional[float] = None
        while pending:
            now = time.monotonic()
            limit = deadline if first_failure is None else min(deadline, first_failure + FAILURE_GRACE)
            if now >= limit:
                break
            waitables = {}
            for r in pending:
                waitables[self._conns[r]] = r
                waitables[self._procs[r].sentinel] = r
            for ready in mpc.wait(list(waitables), timeout=min(0.5, limit - now)):
                rank = waitables[ready]
                if rank not in pending:
                    continue
                conn = self._conns[rank]
                if ready is conn or conn.poll():
                    try:
                        status, value, text, summary = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        status, value, text, summary = "died", None, "", ""
                    except Exception as exc:  # the result itself did not unpickle
                        status, value, text, summary = "error", None, traceback.format_exc(), repr(exc)
                else:
                    status, value, text, summary = "died", None, "", ""
                if status == "died":
                    self._procs[rank].join(1)
                    code = self._procs[rank].exitcode
                    summary = _exit_text(code)
                kept = value if status in ("ok", "ready") else summary
                outcomes[rank] = _Outcome(status, kept, text or summary)
                pending.discard(rank)
                if status not in ("ok", "ready", "skip") and first_failure is None:
                    first_failure = time.monotonic()
        if not pending and all(o.status in ("ok", "ready") for o in outcomes.values()):
            return [outcomes[r].value for r in range(self.world_size)]
        skips = [o for o in outcomes.values() if o.status == "skip"]
        if skips and not pending and all(o.status in ("ok", "skip", "ready") for o in outcomes.values()):
            text = str(skips[0].text)
            _skip(_skip_reason(text), _skip_site(text))
        self.broken = True
        stacks = self._dump_stacks(pending)
        self._kill()
        report = self._report(what, outcomes, pending, stacks, timeout if first_failure is None else None)
        raise RankFailure(report, {r: o.text for r, o in outcomes.items()})

    def _dump_stacks(self, ranks: Collection[int]) -> dict[int, str]:
        for r in ranks:
            if self._procs[r].is_alive() and self._procs[r].pid:
                try:
                    os.kill(self._procs[r].pid, signal.SIGUSR1)
                except OSError:
                    pass
        time.sleep(0.3 if ranks else 0)
        out = {}
        for r in ranks:
            try:
                with open(self._stack_path(r)) as fh:
                    out[r] = fh.read().strip()
            except OSError:
                out[r] = ""
        return out

    def _report(
        self,
        what: str,
        outcomes: dict[int, _Outcome],
        pending: set[int],
        stacks: dict[int, str],
        timed_out: Optional[float],
    ) -> str:
        order = {"died": 0, "init_error": 1, "error": 2}
        failed = sorted(
            (r for r, o in outcomes.items() if o.status in order),
            key=lambda r: (order[outcomes[r].status], outcomes[r].at),
        )
        head = f"{what} failed on {self.world_size} rank(s), backend {self.backend!r}:"
        lines = [head]
        if what == "start-up" and self._unguarded and any(o.status == "died" for o in outcomes.values()):
            lines.append("  " + GUARD_HINT.format(where=self._unguarded))
        if failed:
            root = failed[0]
            first = outcomes[root]
            lines.append(f"  root cause: rank {root} {first.status}: {_last_line(first.text)}")
        if pending:
            killed = "still running when another rank failed; killed"
            why = f"timed out after {timed_out:g}s" if timed_out else killed
            lines.append(f"  hung ranks: {', '.join(map(str, sorted(pending)))} ({why})")
        for r in failed:
            o = outcomes[r]
            lines.append(f"\n===== rank {r}: {o.status} =====\n{o.text.rstrip()}")
        for r in sorted(pending):
            lines.append(f"\n===== rank {r}: hung; stack =====\n{stacks.get(r) or '(no stack captured)'}")
        ok = sorted(r for r, o in outcomes.items() if o.status in ("ok", "ready"))
        if ok:
            lines.append(f"\n(ranks that finished: {', '.join(map(str, ok))})")
        return "\n".join(lines)


def _loopback_env() -> dict[str, str]:
    """Keep Gloo's pair sockets on the loopback interface (the ranks are local), unless the user chose one."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return {}
    try:
        import socket

        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return {}
    for name in ("lo", "lo0"):
        if name in names:
            return {"GLOO_SOCKET_IFNAME": name}
    return {}


def _too_few_devices(world_size: int, backend: Optional[str]) -> Optional[str]:
    """Why ``world_size`` local ranks cannot share this machine's devices on ``backend``, or None."""
    if backend is None:
        return None
    from hwdist.registry import get_driver

    try:
        driver = get_driver(backend)
    except Exception:  # an unknown backend is reported by the ranks' own start-up
        return None
    per = driver.ranks_per_device
    if per is None or not driver.is_available():
        return None
    devices = driver.device_count()
    if world_size <= per * devices:
        return None
    return (
        f"backend '{driver.name}' runs at most {per} rank(s) per {driver.device_type} device:"
        f" {world_size} local ranks need {-(-world_size // per)} device(s), {devices} visible."
        f" HINT: start at most {per * devices} rank(s) on this machine, or use a CPU backend"
    )


def _exit_text(code: Optional[int]) -> str:
    if code is None:
        return "process ended without a reply"
    if code < 0:
        try:
            return f"died: killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"died: killed by signal {-code}"
    return f"died: exited with code {code} without a reply"


def _last_line(text: str) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no message)"


#: The error when ranks die at start-up because the script starts them without the ``__main__`` guard.
GUARD_HINT = (
    "the main script starts ranks ({where}) outside `if __name__ == \"__main__\":`; each spawned rank"
    " imports the script again and would start ranks again from there, so the ranks die at start-up."
    " HINT: put the call under the guard (docs/testing.md)"
)


def _is_main_test(test: ast.expr) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = {ast.dump(test.left), ast.dump(test.comparators[0])}
    return sides == {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}


def _unguarded_main_call() -> Optional[str]:
    """``FILE:LINE`` of the main script's top-level statement running now, if it is outside the guard.

    None when the main module is no script file or is not running its top level (a call from a function
    that the guarded block called is inside the guard: the guard's line is on the stack).
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"
    ):
        frame = frame.f_back
    if frame is None or not path or frame.f_code.co_filename != path:
        return None
    try:
        with open(path) as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                return None
    return f"{os.path.basename(path)}, line {line}"


#: A traceback line of a rank: ``File "PATH", line N, in NAME``.
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in ')
#: Frames of the skip machinery itself (pytest's outcomes, unittest), not the caller's.
_SKIP_MACHINERY = (f"{os.sep}_pytest{os.sep}", f"{os.sep}unittest{os.sep}")


def _skip_reason(text: str) -> str:
    """The reason a rank skipped, from its traceback's last line (``Skipped: REASON``)."""
    last = _last_line(text)
    name, sep, reason = last.partition(": ")
    return reason if sep and name.rsplit(".", 1)[-1] in ("Skipped", "SkipTest", "RankSkip") else last


def _skip_site(text: str) -> Optional[tuple[str, int]]:
    """``(file, line)`` of the rank's call to ``pytest.skip`` (or ``raise RankSkip``): the last frame
    of its traceback outside the skip machinery and this harness."""
    site = None
    for line in text.splitlines():
        m = _FRAME.match(line)
        if m and not any(part in m["path"] for part in _SKIP_MACHINERY) and m["path"] != __file__:
            site = (m["path"], int(m["line"]))
    return site


def _raise_at(exc: BaseException, site: Optional[tuple[str, int]]) -> None:
    """Raise ``exc`` from a frame at ``site`` (the rank's own line), so that pytest, which reports a
    skip at the innermost frame of its traceback, reports it where the test called ``pytest.skip``
    rather than here. The same technique renders template errors at the template's line (jinja2)."""
    if site is None or not os.path.isfile(site[0]):
        raise exc
    path, line = site
    code = compile("\n" * (line - 1) + "raise __exc", path, "exec")
    exec(code, {"__exc": exc, "__name__": "hwdist_rank_skip"})


def _skip(reason: str, site: Optional[tuple[str, int]] = None) -> None:
    pytest = sys.modules.get("pytest")
    exc = pytest.skip.Exception(reason) if pytest is not None else RankSkip(reason)
    _raise_at(exc, site)


def run_distributed(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: Optional[str] = "gloo",
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT,
    pg_timeout: float = DEFAULT_PG_TIMEOUT,
    env: Optional[dict[str, str]] = None,
    **kwargs: Any,
) -> list[Any]:
    """Spawn ``world_size`` fresh ranks, run ``fn`` once on each, and tear down.

    Returns:
        ``[result of rank 0, result of rank 1, ...]``.

    Raises:
        RankFailure: a rank raised, died or hung.
    """
    with RankPool(world_size, backend, timeout=timeout, pg_timeout=pg_timeout, env=env) as pool:
        return pool.run(fn, *args, timeout=timeout, **kwargs)
