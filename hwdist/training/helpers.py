"""Small process helpers from MegEngine and vis4d: barriers as decorators, fork safety, wrapper detection."""

from __future__ import annotations

import functools
import multiprocessing
from typing import Any, Callable, Optional, Sequence, TypeVar, overload

import torch

from .. import registry
from ..collectives.tensor import barrier

F = TypeVar("F", bound=Callable[..., Any])


@overload
def synchronized(func: F) -> F: ...
@overload
def synchronized(func: None = None, *, group: Optional[Any] = None) -> Callable[[F], F]: ...
def synchronized(func: Optional[F] = None, *, group: Optional[Any] = None) -> Any:
    """Decorator: run the function, then wait at a barrier until every rank has run it.

    MegEngine's ``synchronized``. Use as ``@synchronized`` or
    ``@synchronized(group=g)``. The barrier follows a normal return only (an
    exception propagates at once). Non-distributed: just runs the function.

    Examples:
        >>> @hwdist.synchronized
        ... def save(path):
        ...     if hwdist.get_rank() == 0:
        ...         torch.save(model.state_dict(), path)
        >>> save("ckpt.pt")   # every rank returns once rank 0 has saved
    """

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = f(*args, **kwargs)
            barrier(group)
            return result

        return wrapper  # type: ignore[return-value]

    if func is not None:
        if not callable(func):
            raise TypeError(f"synchronized: expected a function, got {type(func).__name__}")
        return decorate(func)
    return decorate


def synchronize(group: Optional[Any] = None) -> None:
    """Block until every rank of ``group`` arrives (vis4d's name for ``hwdist.barrier``).

    No-op when not distributed.
    """
    barrier(group)


def check_fork_safe(start_method: Optional[str] = None) -> None:
    """Raise if worker processes started with ``fork`` would inherit an initialised device.

    Call it right before starting workers (DataLoader workers, a
    ``multiprocessing.Pool``, ...). A CUDA-style device runtime initialised in
    the parent cannot be used in a forked child (the child fails or hangs at
    its first device call). Each registered driver says whether its device is
    initialised (``Driver.is_initialized``; no vendor package is imported).

    Args:
        start_method: ``'fork'``, ``'spawn'`` or ``'forkserver'``; default:
            multiprocessing's current (or default) start method. Only
            ``'fork'`` can fail.

    Raises:
        RuntimeError: ``fork`` with an initialised device (the message says what to do).
        ValueError: an unknown ``start_method``.

    Examples:
        >>> hwdist.check_fork_safe()          # fine before the first device call
        >>> hwdist.check_fork_safe("spawn")   # always fine
    """
    methods = multiprocessing.get_all_start_methods()
    method = start_method
    if method is None:
        # Without fixing the start method as a side effect: the first listed is the default.
        method = multiprocessing.get_start_method(allow_none=True) or methods[0]
    if method not in methods:
        raise ValueError(
            f"check_fork_safe: start_method must be one of {', '.join(repr(m) for m in methods)},"
            f" got {start_method!r}"
        )
    if method != "fork":
        return
    busy: dict[str, str] = {}
    for drv in registry.drivers():
        if drv.device_type not in busy and drv.is_initialized():
            busy[drv.device_type] = drv.name
    if busy:
        what = ", ".join(f"'{d}' (backend '{n}')" for d, n in busy.items())
        raise RuntimeError(
            f"check_fork_safe: the {what} device runtime is already initialised in this process and"
            " worker processes would be started with 'fork': a forked child cannot use an initialised"
            " device context (it fails or hangs at its first device call). Start the workers with the"
            " 'spawn' or 'forkserver' start method (multiprocessing.get_context('spawn'),"
            " torch.multiprocessing.spawn, DataLoader(multiprocessing_context='spawn')), or start them"
            " before the first device call"
        )


def is_module_wrapper(module: Any, wrappers: Sequence[type] = ()) -> bool:
    """Whether ``module`` is a data-parallel wrapper, possibly behind other wrappers.

    True for ``torch.nn.DataParallel`` and ``DistributedDataParallel``
    (subclasses included) and ``wrappers``; also for a module whose
    ``.module`` (followed recursively, as wrappers store what they wrap)
    is one. vis4d's ``is_module_wrapper``.

    Args:
        module: anything (non-modules give False).
        wrappers: extra wrapper classes to recognise.

    Examples:
        >>> hwdist.is_module_wrapper(torch.nn.DataParallel(torch.nn.Linear(1, 1)))
        True
        >>> hwdist.is_module_wrapper(torch.nn.Linear(1, 1))
        False
    """
    kinds = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel, *wrappers)
    seen: set[int] = set()
    current = module
    while isinstance(current, torch.nn.Module) and id(current) not in seen:
        if isinstance(current, kinds):
            return True
        seen.add(id(current))
        current = getattr(current, "module", None)
    return False
