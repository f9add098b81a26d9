"""Tear the default process group down at interpreter exit, so a program need not call ``destroy()``.

A gloo process group left alive when Python exits is torn down by the interpreter's
finalisation and by C++ static destructors, in no defined order and while gloo's
threads may still run; now and then a rank then dies with ``terminate called
without an active exception`` (SIGABRT) after printing the right result, and
torchrun reports the job as failed. Plain torch does the same. Destroying the
group from an ``atexit`` hook, while the interpreter is still whole, is the
teardown order that ``hwdist.destroy()`` gives, without asking the user to call it.

The hook is registered when hwdist initialises a default group or first resolves
one (a group made through ``torch.distributed.init_process_group`` and then used
by hwdist), never at ``import hwdist``. When the group is already gone
(``hwdist.destroy()`` or ``torch.distributed.destroy_process_group()`` was
called) it only drops the references hwdist still keeps to groups (its caches),
so that a group torch destroyed is not freed by the finalisation either. It runs
once, has no barrier (a peer that already exited cannot make it wait), and is
bounded: a teardown that blocks (work still queued for a peer that
is alive but stuck) ends the process after ``EXIT_BOUND_S`` seconds instead of
hanging it. ``HWDIST_DESTROY_AT_EXIT=0`` turns it off.
"""

from __future__ import annotations

import atexit
import faulthandler
import sys
import threading
import time
from typing import Callable, Optional

from . import _compat, settings

__all__ = ["install", "installed", "EXIT_BOUND_S"]

#: Seconds the teardown at exit may take before the process ends anyway (exit status 1).
EXIT_BOUND_S = 30.0

_lock = threading.Lock()
_installed = False
_ran = False
_forget: Optional[Callable[[], None]] = None  # drops hwdist's own references to the groups


def installed() -> bool:
    """Whether the hook is registered in this process."""
    return _installed


def install(forget: Optional[Callable[[], None]] = None) -> None:
    """Register the exit hook (once per process; later calls do nothing).

    Args:
        forget: drops every reference hwdist keeps to process groups (``registry.forget_groups``);
            the hook calls it before destroying the group, so that the group's last reference goes
            with the destroy and not with the interpreter's finalisation.
    """
    global _installed, _forget
    if forget is not None:
        _forget = forget
    if _installed:
        return
    with _lock:
        if _installed:
            return
        atexit.register(_at_exit)
        _installed = True


def _at_exit() -> None:
    """Destroy the default group if it still exists (once; bounded; never raises)."""
    global _ran
    if _ran:
        return
    _ran = True
    try:
        if not settings.flag("HWDIST_DESTROY_AT_EXIT"):
            return
        import torch.distributed as torch_dist

        if not (torch_dist.is_available() and torch_dist.is_initialized()):
            # destroyed already (torch.distributed.destroy_process_group() leaves hwdist's references):
            # the group's last reference goes now, while the interpreter is whole
            _teardown(destroy=False)
            return
    except Exception:
        return
    _teardown()


def _teardown(destroy: bool = True) -> None:
    """Drop hwdist's references to the groups, then destroy the default group (unless ``destroy``)."""
    # A blocked destructor can hold the GIL (torch < 2.8), so no Python thread could time it out:
    # faulthandler's watchdog is a C thread that ends the process without needing the GIL.
    armed = False
    try:
        sys.stderr.flush()
        faulthandler.dump_traceback_later(EXIT_BOUND_S, repeat=False, file=sys.stderr, exit=True)
        armed = True
    except Exception:
        pass
    try:
        import torch.distributed as torch_dist

        if _forget is not None:
            _forget()
        if not destroy:
            return
        if _compat.DESTROY_GIL_PAUSE_S:  # torch < 2.8: let gloo's workers finish first (see _compat)
            time.sleep(_compat.DESTROY_GIL_PAUSE_S)
        torch_dist.destroy_process_group()
    except Exception as exc:  # at exit: say it, never raise
        try:
            print(f"hwdist: the process group could not be torn down at exit: {exc!r}", file=sys.stderr)
        except Exception:
            pass
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()
