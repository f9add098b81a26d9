"""Create and destroy the default process group through a driver.

``init_backend`` is the one place a process group is created: it binds the
device by LOCAL rank, registers custom backends with torch in this process,
and passes ``device_id`` where torch supports it. ``init_dist`` reads the
launcher's environment ([`hwdist.launch.resolvers`][hwdist.launch.resolvers]) and calls it, then
creates the per-node local groups; ``init_local_group`` does the latter
explicitly (mmengine's signature, correct for several nodes).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import socket
import time
from collections.abc import Sequence
from typing import Any, Optional, Union

import torch.distributed as torch_dist

from .. import _compat, _exit, info, registry
from .. import backend as _as_backend
from ..collectives import protocol
from ..drivers import LEGACY_BACKEND_IDS, LEGACY_BACKENDS, LEGACY_TCP_ID
from ..drivers.startup import ensure_torch_backend
from ..errors import MissingPackageError
from .resolvers import LaunchInfo, LauncherError, get_launcher, infer_launcher

__all__ = [
    "init_backend",
    "destroy",
    "as_timedelta",
    "init_dist",
    "init_local_group",
    "new_group",
    "LEGACY_BACKEND_IDS",
]

#: Integer ids of torch<=0.4's ``dist_backend`` enum, mapped to today's names.
#: ``0`` was TCP, removed from torch in 1.0 (an error says so).


def as_timedelta(timeout: Union[None, float, int, datetime.timedelta]) -> Optional[datetime.timedelta]:
    """Seconds (or a timedelta, or None) as a timedelta (or None)."""
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return datetime.timedelta(seconds=float(timeout))


def _require_startable(driver: Any) -> None:
    """Raise if ``driver`` cannot run here or torch cannot create its group (before any rendezvous)."""
    registry.require_available(driver, f"backend {driver.name!r} is")
    ensure_torch_backend(driver)


def init_backend(
    backend: str,
    *,
    rank: int,
    world_size: int,
    local_rank: int = 0,
    init_method: Optional[str] = None,
    store: Optional[Any] = None,
    timeout: Union[None, float, datetime.timedelta] = None,
    **kwargs: Any,
) -> Any:
    """Initialise the default process group on ``backend``'s driver.

    Args:
        backend: a registered backend name, used as named (never replaced); ``'hwdist'`` or
            ``'hwdist:<name>'`` for hwdist's own torch backend wrapping that one (torch >= 2.15,
            ``hwdist.backend``, docs/ddp-fsdp.md).
        rank: global rank.
        world_size: number of ranks.
        local_rank: rank on this node; the device is bound by it.
        init_method: torch init method (``env://``, ``tcp://``, ``file://``).
        store: a torch Store instead of ``init_method``.
        timeout: seconds (or timedelta) for collectives and rendezvous.
        **kwargs: passed on to ``torch.distributed.init_process_group``.

    Returns:
        The driver of the new default group.

    Raises:
        hwdist.BackendError: unknown or unavailable backend (lists available ones).
    """
    torch_name: Optional[str] = None
    if _as_backend.wrapped_name(backend) is not None:  # hwdist's own backend around the named one
        driver, torch_name = _as_backend.prepare(backend)
    else:
        driver = registry.get_driver(backend)
        _require_startable(driver)
    driver.set_device(local_rank)
    if _compat.INIT_HAS_DEVICE_ID and "device_id" not in kwargs:
        device_id = driver.device_id(local_rank)
        if device_id is not None:
            kwargs["device_id"] = device_id
    td = as_timedelta(timeout)
    if td is not None:
        kwargs["timeout"] = td
    if store is not None:
        kwargs["store"] = store
    elif init_method is not None:
        kwargs["init_method"] = init_method
    torch_dist.init_process_group(
        backend=torch_name or driver.torch_name, rank=rank, world_size=world_size, **kwargs
    )
    registry.record_group(_compat.default_group(), driver)
    _exit.install(registry.forget_groups)
    from .. import flight  # the watchdog starts with the group (idempotent: torch's creation was watched)

    flight.group_started()
    return driver


_init_backend = init_backend  # init_dist's parameter of the same name (mmengine's) hides the function


def destroy() -> None:
    """Destroy every process group hwdist or torch created; safe to call twice.

    Optional: at interpreter exit hwdist destroys a default group that is still alive
    (``hwdist._exit``; ``HWDIST_DESTROY_AT_EXIT=0`` turns it off). Call it to end
    the group earlier, or to initialise a new one in the same process.
    """
    info.set_local_group(None)
    registry.forget_groups()
    if _compat.DIST_AVAILABLE and torch_dist.is_initialized():
        if _compat.DESTROY_GIL_PAUSE_S:  # torch < 2.8: let gloo's workers finish first (see _compat)
            time.sleep(_compat.DESTROY_GIL_PAUSE_S)
        torch_dist.destroy_process_group()


# --------------------------------------------------------------------------- init_dist
def _backend_name(backend: Any) -> str:
    """The backend to use: as named, a legacy integer id mapped, or detection's choice."""
    if backend is None:
        from ..detection import detect

        return detect().backend
    if isinstance(backend, bool):
        raise TypeError(f"backend must be a str, an int legacy id or None, got {backend!r}")
    if isinstance(backend, int):
        if backend in LEGACY_BACKEND_IDS:
            return LEGACY_BACKEND_IDS[backend]
        known = ", ".join(f"{k} -> {v!r}" for k, v in LEGACY_BACKEND_IDS.items())
        if backend == LEGACY_TCP_ID:
            raise registry.BackendError(
                f"backend={backend} is torch<=0.4's dist_backend.TCP: {LEGACY_BACKENDS['tcp']}"
                f" (legacy ids: {known})"
            )
        raise registry.BackendError(f"backend={backend} is not a legacy dist_backend id; known ids: {known}")
    if isinstance(backend, str):
        if not backend.strip():
            raise registry.BackendError(
                f"backend must be a non-empty name; available: {', '.join(registry.available_backends())}"
            )
        return backend.strip()
    raise TypeError(
        f"backend must be a str, an int legacy id or None, got {type(backend).__name__}: {backend!r}"
    )


#: ``init_backend`` values of mmengine's ``init_dist``: the package each needs and its initialiser.
_INITIALISERS = {
    "deepspeed": ("deepspeed", "init_distributed"),
    "colossalai": ("colossalai", "launch_from_torch"),
}


def _check_init_backend(init_with: Any) -> None:
    """Raise (before any rendezvous) unless ``init_with`` names an initialiser that can run here."""
    if init_with == "torch":
        return
    if not isinstance(init_with, str) or init_with not in _INITIALISERS:
        raise ValueError(
            f"init_backend must be one of 'torch', {', '.join(repr(k) for k in _INITIALISERS)},"
            f" got {init_with!r}"
        )
    import importlib.util

    package = _INITIALISERS[init_with][0]
    if importlib.util.find_spec(package) is None:
        raise MissingPackageError(
            f"init_backend={init_with!r} needs the {package!r} package, which is not installed."
            f" HINT: pip install {package}, or use init_backend='torch'"
        )


def _init_with_package(init_with: str, driver: Any, launch: LaunchInfo, **kwargs: Any) -> Any:
    """Create the default group with DeepSpeed's or ColossalAI's initialiser, as mmengine does."""
    import importlib

    package, function = _INITIALISERS[init_with]
    driver.set_device(launch.local_rank)
    start = getattr(importlib.import_module(package), function)
    if init_with == "deepspeed":
        start(dist_backend=driver.torch_name, **kwargs)
    else:
        start(backend=driver.torch_name, **kwargs)
    registry.record_group(_compat.default_group(), driver)
    _exit.install(registry.forget_groups)
    return driver


def init_dist(
    launcher: str = "auto",
    backend: Union[str, int, None] = None,
    init_backend: str = "torch",
    **kwargs: Any,
) -> Optional[LaunchInfo]:
    """Initialise the default process group from the launcher's environment.

    A drop-in for ``mmengine.dist.init_dist`` (same names, same positional
    order) that also infers the launcher and the backend, binds the device by
    LOCAL rank before the group exists, and creates the per-node local groups.

    Args:
        launcher: ``'auto'`` ([`infer_launcher`][hwdist.launch.resolvers.infer_launcher]),
            ``'pytorch'`` (torchrun), ``'slurm'``, ``'mpi'``, ``'none'`` (no process group), or a
            launcher registered with [`register_launcher`][hwdist.launch.resolvers.register_launcher].
        backend: a backend name, used as named (never replaced by an
            accelerator's); a legacy integer id (``1`` mpi, ``2`` gloo,
            ``3`` nccl); or None for what [`hwdist.detect`][hwdist.detection.detect] chooses.
        init_backend: what creates the group, as in mmengine: ``'torch'``
            (hwdist's driver), ``'deepspeed'`` (``deepspeed.init_distributed``)
            or ``'colossalai'`` (``colossalai.launch_from_torch``); the latter
            two need their package installed (else a
            [`MissingPackageError`][hwdist.errors.MissingPackageError] naming it, before any rendezvous).
        **kwargs: ``timeout`` (seconds or a timedelta, for rendezvous and
            collectives), ``local_group`` (default True: create the local
            groups), ``port`` (rendezvous port; wins over ``MASTER_PORT``, as
            in mmengine); the rest goes to the initialiser
            (``torch.distributed.init_process_group``: ``init_method``,
            ``store``, ``pg_options``, ...).

    Returns:
        The [`LaunchInfo`][hwdist.launch.base.LaunchInfo] (rank, local rank, node rank, backend);
        ``node_rank`` is set on every launcher. For ``launcher='none'`` (a single process, no group:
        what ``'auto'`` picks under plain ``python``) it describes that process: rank 0 of 1, node 0,
        launcher ``'none'``, so ``info.rank`` works with or without a launcher.

    Raises:
        hwdist.BackendError: unknown or unavailable backend (lists available ones).
        hwdist.LauncherError: unknown launcher, or its environment is incomplete.
        RuntimeError: a default process group already exists.
        ValueError: an unknown ``init_backend``.
        hwdist.errors.MissingPackageError: ``init_backend``'s package is not installed.

    Examples:
        >>> # torchrun --nproc-per-node 2 train.py
        >>> info = hwdist.init_dist()            # launcher and backend inferred
        >>> info.rank, info.local_rank, info.backend
        # rank 0: (0, 0, 'gloo')   rank 1: (1, 1, 'gloo')
    """
    local_group = bool(kwargs.pop("local_group", True))
    port = kwargs.pop("port", None)
    timeout = kwargs.pop("timeout", None)
    init_with = init_backend
    _check_init_backend(init_with)
    if _compat.DIST_AVAILABLE and torch_dist.is_initialized():
        raise RuntimeError(
            f"a default process group already exists (backend {torch_dist.get_backend()!r});"
            " call hwdist.destroy() first"
        )
    name = infer_launcher() if launcher == "auto" else launcher
    resolver = get_launcher(name)
    backend_name = _backend_name(backend)
    if _as_backend.wrapped_name(backend_name) is not None:  # hwdist's own backend: torch >= 2.15, raises here
        driver = _as_backend.prepare(backend_name)[0]
    else:
        driver = registry.get_driver(backend_name)
    registry.require_available(driver, f"backend {driver.name!r} is")
    if not getattr(resolver, "distributed", True):  # one process, no group: where it sits, all the same
        single = resolver.resolve(os.environ)
        return dataclasses.replace(single, node_rank=single.node_rank or 0, backend=driver.name)
    ensure_torch_backend(driver)  # the start-up rule: raises on every rank, before any rendezvous
    launch = resolver.resolve(os.environ)
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an int in 1..65535, got {port!r}")
        launch = dataclasses.replace(launch, master_port=port)
        os.environ["MASTER_PORT"] = str(port)  # an explicit argument wins, as in mmengine
    for key, value in launch.exports().items():
        os.environ.setdefault(key, value)  # never overwrite what the user set
    import torch.multiprocessing as mp

    if mp.get_start_method(allow_none=True) is None:  # as mmengine does
        mp.set_start_method("spawn")
    td = as_timedelta(timeout)
    if init_with != "torch":  # the package reads the exported variables itself, as under mmengine
        if td is not None:
            kwargs["timeout"] = td
        used = _init_with_package(init_with, driver, launch, **kwargs)
        return _place(launch, used, local_group)
    store = kwargs.pop("store", None)
    init_method = kwargs.pop("init_method", None)
    if store is None and init_method is None:
        store = resolver.rendezvous(launch, td)
        if store is None:
            if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
                init_method = "env://"
            elif launch.world_size == 1:
                store = torch_dist.HashStore()
            else:
                raise LauncherError(
                    f"launcher {resolver.name!r}: MASTER_ADDR and MASTER_PORT must be set for"
                    f" {launch.world_size} ranks to meet (or pass init_method= / store=)"
                )
    used = _init_backend(
        backend_name,
        rank=launch.rank,
        world_size=launch.world_size,
        local_rank=launch.local_rank,
        init_method=init_method,
        store=store,
        timeout=td,
        **kwargs,
    )
    return _place(launch, used, local_group)


def _place(launch: LaunchInfo, used: Any, local_group: bool) -> LaunchInfo:
    """The launch info ``init_dist`` returns: its backend, and a node rank on every launcher.

    A launcher that does not say which node a rank is on (mpiexec) gets the index of its host among the
    job's hosts, in rank order: the same number torchrun's ``GROUP_RANK`` gives on one node (0).
    """
    nodes = _nodes(launch)
    if local_group:
        _create_local_groups(nodes)
    node_rank = launch.node_rank
    if node_rank is None:
        node_rank = next(i for i, ranks in enumerate(nodes) if launch.rank in ranks)
    return dataclasses.replace(launch, backend=used.name, node_rank=node_rank)


# --------------------------------------------------------------------------- local groups
def _create_local_groups(nodes: Sequence[Sequence[int]]) -> Any:
    """Create one group per node, on EVERY rank and in the same order; keep this rank's."""
    rank = torch_dist.get_rank()
    mine = None
    if len(nodes) == 1:
        mine = _compat.default_group()  # one node: the local group is the world
    else:
        driver = registry.resolve(None)
        for ranks in nodes:
            group = torch_dist.new_group(list(ranks))
            if rank in ranks:
                mine = group
                registry.record_group(group, driver)
    info.set_local_group(mine)
    registry.clear_cache()
    return mine


def _host_key() -> int:
    """This host as a non-negative int64 (for grouping ranks by node when no node rank is known)."""
    digest = hashlib.blake2b(socket.gethostname().encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")


def _nodes(launch: LaunchInfo) -> list[list[int]]:
    """The ranks of each node, nodes in order of their first rank (launcher's node rank, else host name).

    A collective over the default group: every rank calls it.
    """
    if launch.world_size == 1:
        return [[0]]
    key = launch.node_rank if launch.node_rank is not None else _host_key()
    table = protocol.gather_ints([key])
    nodes: dict[int, list[int]] = {}
    for rank, (k,) in enumerate(table):
        nodes.setdefault(k, []).append(rank)
    return list(nodes.values())


def init_local_group(node_rank: int, num_gpus_per_node: int) -> Any:
    """Create the process group of the ranks on this node (mmengine's signature).

    Ranks are laid out node by node: node ``i`` holds ranks
    ``i * num_gpus_per_node`` to ``(i + 1) * num_gpus_per_node - 1``. Every
    rank takes part in creating EVERY node's group, as torch requires
    (mmengine's version creates only its own node's group, which hangs
    multi-node jobs). Arguments are checked on all ranks together, so a bad
    value raises on every rank instead of hanging the others.

    Args:
        node_rank: index of this node.
        num_gpus_per_node: ranks per node (the same on every node).

    Returns:
        This rank's local group (also returned by ``hwdist.get_local_group()``).

    Raises:
        RuntimeError: not distributed (call ``init_dist`` first).
        ValueError: the layout does not fit the world (raised on every rank).

    Examples:
        >>> # 2 nodes x 2 ranks; on node 1:
        >>> g = hwdist.init_local_group(node_rank=1, num_gpus_per_node=2)
        >>> hwdist.get_local_rank(), hwdist.get_local_size()
        # rank 2: (0, 2)   rank 3: (1, 2)
    """
    for arg, value in (("node_rank", node_rank), ("num_gpus_per_node", num_gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{arg} must be an int, got {type(value).__name__}: {value!r}")
    if not (_compat.DIST_AVAILABLE and torch_dist.is_initialized()):
        raise RuntimeError("init_local_group needs a process group: call hwdist.init_dist(...) first")
    world = torch_dist.get_world_size()
    table = protocol.gather_ints([node_rank, num_gpus_per_node])
    sizes = sorted({n for _, n in table})
    if len(sizes) != 1:
        raise ValueError(f"num_gpus_per_node must be the same on every rank, got {sizes}")
    per_node = sizes[0]
    if per_node < 1 or world % per_node:
        raise ValueError(f"num_gpus_per_node={per_node} must be a positive divisor of the world size {world}")
    wrong = [(r, nr) for r, (nr, _) in enumerate(table) if nr != r // per_node]
    if wrong:
        r, nr = wrong[0]
        raise ValueError(
            f"node_rank does not match the layout: rank {r} passed node_rank={nr}, but with"
            f" num_gpus_per_node={per_node} it is on node {r // per_node}"
            f" ({len(wrong)} rank(s) disagree)"
        )
    nodes = [list(range(i * per_node, (i + 1) * per_node)) for i in range(world // per_node)]
    return _create_local_groups(nodes)


def new_group(
    ranks: Optional[Sequence[int]] = None,
    backend: Optional[str] = None,
    timeout: Union[None, float, datetime.timedelta] = None,
    **kwargs: Any,
) -> Any:
    """Create a process group through a driver (``torch.distributed.new_group`` with hwdist's rules).

    Every rank of the default group must call it, with the same arguments, as
    torch requires. The new group resolves to the driver named (or the default
    group's), even when that driver shares its torch backend with another one
    (``torch_backend = "gloo"``); a plain ``torch.distributed.new_group``
    resolves by torch's backend name instead.

    Args:
        ranks: global ranks of the group (None: every rank).
        backend: a registered backend name; None for the default group's driver.
        timeout: seconds (or a timedelta) for the group's collectives.
        **kwargs: passed on to ``torch.distributed.new_group``.

    Returns:
        The new group (torch's non-member sentinel on ranks outside ``ranks``).

    Raises:
        RuntimeError: not distributed (call ``init_dist`` first).
        hwdist.BackendError: unknown, unavailable or unstartable backend.

    Examples:
        >>> # 2 ranks, default group on gloo; a group on a driver sharing gloo:
        >>> g = hwdist.new_group(backend="mygloo")
        >>> hwdist.get_backend(g), hwdist.get_backend()
        # rank 0: ('mygloo', 'gloo')   rank 1: ('mygloo', 'gloo')
    """
    if not (_compat.DIST_AVAILABLE and torch_dist.is_initialized()):
        raise RuntimeError("new_group needs a process group: call hwdist.init_dist(...) first")
    driver = registry.resolve(None) if backend is None else registry.get_driver(backend)
    _require_startable(driver)
    td = as_timedelta(timeout)
    if td is not None:
        kwargs["timeout"] = td
    group = torch_dist.new_group(None if ranks is None else list(ranks), backend=driver.torch_name, **kwargs)
    registry.record_group(group, driver)
    return group
