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

A process forked after the group existed (``os.fork`` in a rank) inherits the group but
not the threads of its backend: destroying it there, by this hook or by the interpreter's
finalisation, aborts the child (``std::system_error: Invalid argument``) or blocks it for
good (measured with plain torch on 2.13: the child of a gloo rank never exits). In such a
child the hook leaves the inherited groups alone: it destroys nothing, drops nothing, and
keeps the groups (and their stores) referenced for the rest of the process, so that the
finalisation does not free them either; the child then exits with its own status and the
parent's group is untouched.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
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
# The process the hook was registered in: a process forked from it inherits the hook and the groups
_owner = os.getpid()
_pinned: list[object] = []  # the inherited groups and stores a forked child keeps to its end


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
    global _installed, _forget, _owner
    if forget is not None:
        _forget = forget
    if _installed:
        return
    with _lock:
        if _installed:
            return
        atexit.register(_at_exit)
        _owner = os.getpid()
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
        if os.getpid() != _owner:  # a forked child: the groups are its parent's
            _keep_inherited()
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


def _keep_inherited() -> None:
    """In a forked child: keep every group torch knows (and its store) alive to the end of the process.

    The child has the groups' memory but not their backends' threads, so no destructor of theirs can
    run there; a reference the interpreter's finalisation never drops (a leaked reference count)
    keeps the finalisation from running them.
    """
    try:
        import ctypes

        groups = [g for g in (_compat.default_group(), *_compat.torch_groups()) if g is not None]
        held = groups + [st for st in map(_compat.group_store, groups) if st is not None]
        for obj in held:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
        _pinned.extend(held)
    except Exception:  # at exit: never raise
        pass
