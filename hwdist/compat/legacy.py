"""The ``torch.distributed`` API of torch 0.3/0.4, on hwdist's drivers.

``import hwdist.compat.legacy as dist`` runs code written for that API (the
``dist_backend`` and ``reduce_op`` classes, ``group.WORLD``,
``init_process_group(backend, init_method, world_size=, rank=, group_name=)``,
``gather(tensor, dst=, gather_list=)`` with the list on the root only, the
``*_multigpu`` calls, ``tensor=`` keywords) unchanged. Every call goes through
hwdist's public operations, so it gains hwdist's drivers (any registered
backend name works in ``init_process_group``) and casting rules.

Bad input raises what torch 0.3 raised (``RuntimeError`` for bad backend
names and misplaced gather/scatter lists, ``AssertionError`` before
``init_process_group``), with hwdist's message, on every rank: when one
rank's arguments are wrong (a ``gather_list`` on a non-root rank, none on the
root, ranks that disagree on ``dst``), all ranks raise together within one
small exchange instead of one raising and the others waiting forever.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as torch_dist

import hwdist

from ..drivers import LEGACY_BACKEND_IDS, LEGACY_BACKENDS
from ..errors import ArgumentAssertionError, CollectiveArgumentError, LegacyBackendError
from ._legacy_common import (
    DistributedRequest,
    agree_or_raise,
    dist_backend,
    fingerprint,
    shown,
    group,
    group_of,
    reduce_op,
    require_pg,
)
from ._legacy_multigpu import all_gather_multigpu, all_reduce_multigpu, broadcast_multigpu, reduce_multigpu

__all__ = [
    "dist_backend",
    "reduce_op",
    "group",
    "is_available",
    "init_process_group",
    "destroy_process_group",
    "is_initialized",
    "get_rank",
    "get_world_size",
    "send",
    "recv",
    "isend",
    "irecv",
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "barrier",
    "new_group",
    "broadcast_multigpu",
    "all_reduce_multigpu",
    "reduce_multigpu",
    "all_gather_multigpu",
    "DistributedRequest",
]


# ----------------------------------------------------------------------------- set-up and state
def is_available() -> bool:
    """Whether this torch was built with distributed support."""
    return bool(torch_dist.is_available())


def init_process_group(backend: Any, init_method: str = "env://", **kwargs: Any) -> None:
    """Initialise the default process group (torch 0.3's signature).

    Args:
        backend: a backend name (``'gloo'``, ``'mpi'``, ``'nccl'``, or any backend
            registered with hwdist, e.g. ``'hccl'``) or a
            [`dist_backend`][hwdist.compat.legacy.dist_backend] id.
        init_method: ``env://``, ``tcp://host:port`` or ``file:///path``.
        **kwargs: ``world_size`` (default -1: from the init method),
            ``rank`` (default -1: from the init method), ``group_name``
            (accepted, unused, as in torch 1.x).

    Raises:
        AssertionError: an unexpected keyword argument (as in torch 0.3).
        RuntimeError: an unknown backend (a
            [`LegacyBackendError`][hwdist.errors.LegacyBackendError]), or the group already exists.

    Examples:
        >>> dist.init_process_group("gloo", init_method="file:///tmp/rdv", world_size=2, rank=r)
        >>> dist.get_rank(), dist.get_world_size()
        # rank 0: (0, 2)   rank 1: (1, 2)
    """
    world_size = kwargs.pop("world_size", -1)
    kwargs.pop("group_name", "")
    rank = kwargs.pop("rank", -1)
    if kwargs:
        raise ArgumentAssertionError(
            f"init_process_group: got unexpected keyword arguments: {', '.join(kwargs)}"
        )
    if not is_available():
        raise RuntimeError("init_process_group: PyTorch built without distributed support")
    if hwdist.is_distributed():
        raise RuntimeError("init_process_group: trying to initialize torch.distributed twice!")
    name = _backend(backend)
    hwdist.init_backend(
        name,
        rank=rank,
        world_size=world_size,
        local_rank=hwdist.get_local_rank(),
        init_method=init_method,
    )


def _backend(backend: Any) -> str:
    known = ", ".join(hwdist.list_backends())
    if isinstance(backend, int) and not isinstance(backend, bool):
        if backend in LEGACY_BACKEND_IDS:
            return LEGACY_BACKEND_IDS[backend]
        if backend == dist_backend.TCP:
            raise LegacyBackendError(
                f"init_process_group: backend id {backend}: {LEGACY_BACKENDS['tcp']}"
            )
        raise LegacyBackendError(
            f"init_process_group: invalid distributed backend id {backend}; legacy ids:"
            f" {', '.join(f'{k} ({v})' for k, v in LEGACY_BACKEND_IDS.items())}"
        )
    if not isinstance(backend, str):
        raise LegacyBackendError(
            f"init_process_group: backend must be a name or a dist_backend id, got {type(backend).__name__}"
        )
    if backend in LEGACY_BACKENDS:
        raise LegacyBackendError(f"init_process_group: {LEGACY_BACKENDS[backend]}")
    if backend not in hwdist.list_backends():
        raise LegacyBackendError(
            f"Invalid distributed backend name: {backend!r}; registered: {known}."
            f" HINT: hwdist.register_backend({backend!r}, ...)"
        )
    return backend


def destroy_process_group() -> None:
    """Destroy the default process group (and every group created since); safe to call twice."""
    hwdist.destroy()


def is_initialized() -> bool:
    """Whether the default process group exists."""
    return hwdist.is_distributed()


def get_rank() -> int:
    """This process's rank in the default group.

    Raises:
        AssertionError: no process group yet (as in torch 0.3).
    """
    require_pg("get_rank")
    return hwdist.get_rank()


def get_world_size() -> int:
    """The number of processes in the default group.

    Raises:
        AssertionError: no process group yet (as in torch 0.3).
    """
    require_pg("get_world_size")
    return hwdist.get_world_size()


def new_group(ranks: Optional[Sequence[int]] = None) -> Any:
    """Create a group of ``ranks`` (every rank); every process must call it, in the same order.

    Args:
        ranks: global ranks of the members (None: every rank).

    Returns:
        A group handle for the collectives' ``group=`` argument.

    Examples:
        >>> g = dist.new_group([0, 1])
        >>> t = torch.ones(1); dist.all_reduce(t, group=g)
        # rank 0: tensor([2.])   rank 1: tensor([2.])
    """
    require_pg("new_group")
    return hwdist.new_group(None if ranks is None else list(ranks))


# ----------------------------------------------------------------------------- point to point
def send(tensor: torch.Tensor, dst: int) -> None:
    """Send ``tensor`` to rank ``dst`` (blocking).

    Examples:
        >>> t = torch.tensor([7.0]) if rank == 0 else torch.zeros(1)
        >>> dist.send(t, 1) if rank == 0 else dist.recv(t, 0)
        # rank 1: t == tensor([7.])
    """
    require_pg("send")
    hwdist.send(tensor, dst)


def recv(tensor: torch.Tensor, src: Optional[int] = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank if None); returns the sender's rank."""
    require_pg("recv")
    return int(hwdist.recv(tensor, src))


def isend(tensor: torch.Tensor, dst: int) -> DistributedRequest:
    """Start sending ``tensor`` to ``dst``.

    Returns:
        A [`DistributedRequest`][hwdist.compat.legacy.DistributedRequest] (``wait()``, ``is_completed()``).
    """
    require_pg("isend")
    return DistributedRequest(hwdist.isend(tensor, dst))


def irecv(tensor: torch.Tensor, src: int) -> DistributedRequest:
    """Start receiving into ``tensor`` from ``src``.

    Returns:
        A [`DistributedRequest`][hwdist.compat.legacy.DistributedRequest]; after ``wait()``
        the data is in ``tensor``.
    """
    require_pg("irecv")
    return DistributedRequest(hwdist.irecv(tensor, src))


# ----------------------------------------------------------------------------- collectives
def broadcast(tensor: torch.Tensor, src: int, group: Any = group.WORLD) -> None:
    """Copy ``src``'s ``tensor`` into every rank's ``tensor``, in place.

    Examples:
        >>> t = torch.tensor([float(rank)])
        >>> dist.broadcast(t, 0)
        # rank 0: tensor([0.])   rank 1: tensor([0.])
    """
    require_pg("broadcast")
    hwdist.broadcast(tensor, src, group_of(group))


def all_reduce(tensor: torch.Tensor, op: Any = reduce_op.SUM, group: Any = group.WORLD) -> None:
    """Reduce ``tensor`` over the ranks; every rank gets the result, in place.

    Examples:
        >>> t = torch.tensor([rank + 1.0])
        >>> dist.all_reduce(t, op=dist.reduce_op.MAX)
        # rank 0: tensor([2.])   rank 1: tensor([2.])
    """
    require_pg("all_reduce")
    hwdist.all_reduce(tensor, op, group_of(group))


def reduce(tensor: torch.Tensor, dst: int, op: Any = reduce_op.SUM, group: Any = group.WORLD) -> None:
    """Reduce ``tensor`` over the ranks into ``dst``'s ``tensor`` (in place)."""
    require_pg("reduce")
    hwdist.reduce(tensor, dst, op, group_of(group))


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = group.WORLD) -> None:
    """Fill ``tensor_list[i]`` with rank ``i``'s ``tensor``, on every rank.

    Args:
        tensor_list: one tensor of ``tensor``'s shape and dtype per rank.
        tensor: this rank's contribution.
        group: the group (default ``group.WORLD``).

    Raises:
        RuntimeError: ``tensor_list`` has the wrong length or shapes, or the
            ranks' tensors differ in shape or dtype (every rank).

    Examples:
        >>> out = [torch.zeros(1) for _ in range(2)]
        >>> dist.all_gather(out, torch.tensor([float(rank)]))
        # rank 0: [tensor([0.]), tensor([1.])]   rank 1: the same
    """
    require_pg("all_gather")
    grp = group_of(group)
    world = hwdist.get_world_size(grp)
    problem = _list_problem("all_gather", "tensor_list", tensor_list, tensor, world)
    agree_or_raise(
        "all_gather", grp, problem, [fingerprint(tensor)], "the tensor's shape and dtype", shown(tensor)
    )
    for out, got in zip(tensor_list, hwdist.all_gather(tensor, grp, same_shape=True)):
        out.copy_(got)


def _list_problem(fn: str, name: str, items: Any, tensor: Any, world: int) -> Optional[BaseException]:
    if not isinstance(tensor, torch.Tensor):
        return CollectiveArgumentError(
            f"{fn}: tensor must be a torch.Tensor, got {type(tensor).__name__}"
        )
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in items):
        return CollectiveArgumentError(
            f"{fn}: {name} must be a list of tensors, got {type(items).__name__}"
        )
    if len(items) != world:
        return CollectiveArgumentError(
            f"{fn}: {name} must hold {world} tensors (one per rank), got {len(items)}"
        )
    for i, t in enumerate(items):
        if t.shape != tensor.shape or t.dtype != tensor.dtype:
            return CollectiveArgumentError(
                f"{fn}: {name}[{i}] is {tuple(t.shape)} {t.dtype}; expected {tuple(tensor.shape)}"
                f" {tensor.dtype} (the tensor's shape and dtype)"
            )
    return None


def _root_and_list(
    fn: str, kwargs: dict[str, Any], root_key: str, list_key: str
) -> tuple[int, Any, Any, Any]:
    me = get_rank()
    root = kwargs.pop(root_key, me)
    items = kwargs.pop(list_key, None)
    grp = group_of(kwargs.pop("group", group.WORLD))
    problem: Optional[BaseException] = None
    if kwargs:
        problem = CollectiveArgumentError(
            f"{fn}: got unexpected kwargs {', '.join(sorted(kwargs))}; expected {root_key}, {list_key}, group"
        )
    elif isinstance(root, bool) or not isinstance(root, int):
        problem = CollectiveArgumentError(f"{fn}: {root_key} must be an int rank, got {root!r}")
    return root, items, grp, problem


def _checked_root_and_list(
    fn: str, kwargs: dict[str, Any], root_key: str, list_key: str, role: str, tensor: torch.Tensor
) -> tuple[int, Any, Any, int]:
    """Parse gather/scatter's keywords and agree on them: every rank raises together on a bad call."""
    root, items, grp, problem = _root_and_list(fn, kwargs, root_key, list_key)
    me = hwdist.get_rank()
    if problem is None:
        if root == me:
            if items is None:
                problem = CollectiveArgumentError(
                    f"{fn}: {list_key} is a required argument in {fn} {role} (rank {me})"
                )
            else:
                problem = _list_problem(fn, list_key, items, tensor, hwdist.get_world_size(grp))
        elif items:
            problem = CollectiveArgumentError(
                f"{fn}: non-empty {list_key} can be given only to {fn} {role} (rank {root});"
                f" rank {me} gave one"
            )
    words = [root if problem is None else 0, fingerprint(tensor)]
    agree_or_raise(
        fn, grp, problem, words, f"{root_key} or the tensor's shape and dtype",
        f"{root_key}={words[0]}, {shown(tensor)}",
    )
    return root, items, grp, me


def gather(tensor: torch.Tensor, **kwargs: Any) -> None:
    """Gather every rank's ``tensor`` into ``gather_list`` on ``dst`` (torch 0.3's keywords).

    Args:
        tensor: this rank's contribution.
        **kwargs: ``dst`` (required on every rank but the destination; it
            defaults to this rank), ``gather_list`` (one tensor per rank, on
            the destination only), ``group``.

    Raises:
        RuntimeError: ``gather_list`` missing on the destination or given
            elsewhere, the ranks disagree on ``dst``, or an unexpected keyword
            (on every rank, before any data moves).

    Examples:
        >>> t = torch.tensor([float(rank)])
        >>> if rank == 0:
        ...     out = [torch.zeros(1) for _ in range(2)]
        ...     dist.gather(t, gather_list=out)      # dst defaults to this rank
        ... else:
        ...     dist.gather(t, dst=0)
        # rank 0: out == [tensor([0.]), tensor([1.])]
    """
    require_pg("gather")
    dst, gather_list, grp, me = _checked_root_and_list(
        "gather", kwargs, "dst", "gather_list", "destination", tensor
    )
    got = hwdist.gather(tensor, dst, grp, same_shape=True)
    if me == dst:
        for out, value in zip(gather_list, got):
            out.copy_(value)


def scatter(tensor: torch.Tensor, **kwargs: Any) -> None:
    """Receive ``scatter_list[rank]`` from ``src`` into ``tensor`` (torch 0.3's keywords).

    Args:
        tensor: output on every rank.
        **kwargs: ``src`` (required on every rank but the source; it
            defaults to this rank), ``scatter_list`` (one tensor per rank,
            on the source only), ``group``.

    Raises:
        RuntimeError: ``scatter_list`` missing on the source or given
            elsewhere, the ranks disagree on ``src``, or an unexpected keyword
            (on every rank, before any data moves).

    Examples:
        >>> t = torch.zeros(1)
        >>> if rank == 0:
        ...     dist.scatter(t, scatter_list=[torch.tensor([5.0]), torch.tensor([6.0])])
        ... else:
        ...     dist.scatter(t, src=0)
        # rank 0: tensor([5.])   rank 1: tensor([6.])
    """
    require_pg("scatter")
    src, scatter_list, grp, me = _checked_root_and_list(
        "scatter", kwargs, "src", "scatter_list", "source", tensor
    )
    hwdist.scatter(tensor, list(scatter_list) if me == src else None, src, grp)


def barrier(group: Any = group.WORLD) -> None:
    """Wait until every rank of ``group`` has entered."""
    require_pg("barrier")
    hwdist.barrier(group_of(group))

