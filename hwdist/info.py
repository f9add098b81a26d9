"""Distributed-environment queries with mmengine.dist's names and semantics.

Every function works in a non-distributed process too, returning what a
single process would (rank 0, world size 1, no-op barrier).
"""

from __future__ import annotations

import functools
import os
import warnings
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import torch
import torch.distributed as torch_dist

from . import _compat, registry
from .launch_env import LOCAL_RANK_VARS, LOCAL_SIZE_VARS

__all__ = [
    "is_distributed",
    "get_default_group",
    "get_backend",
    "get_world_size",
    "get_rank",
    "get_local_rank",
    "get_local_size",
    "get_local_group",
    "get_dist_info",
    "is_main_process",
    "master_only",
    "rank_zero_only",
    "get_data_device",
    "get_comm_device",
    "cast_data_device",
]

F = TypeVar("F", bound=Callable[..., Any])

# Set by hwdist.launch.init_local_group: a weak reference to the group (torch owns it: once torch
# destroys it, it is gone here too, and its last reference never falls to the interpreter's finalisation,
# the teardown order that aborts gloo now and then); None until then.
_local_ref: Optional[Callable[[], Any]] = None


def set_local_group(group: Any) -> None:
    global _local_ref
    try:
        _local_ref = None if group is None else weakref.ref(group)
    except TypeError:  # not weakly referenceable: kept as it is
        _local_ref = lambda: group  # noqa: E731


def _local_group() -> Any:
    return None if _local_ref is None else _local_ref()


def is_distributed() -> bool:
    """Whether a default process group exists (torch.distributed initialised)."""
    return _compat.DIST_AVAILABLE and torch_dist.is_initialized()


def get_default_group() -> Optional[Any]:
    """The default process group, or None when not distributed."""
    return _compat.default_group() if is_distributed() else None


def get_backend(group: Optional[Any] = None) -> Optional[str]:
    """The backend name of ``group`` (default group if None), or None when not distributed.

    For a group hwdist created (``init_dist``, ``init_backend``, the local
    groups, ``hwdist.new_group``) it is the name of the driver that created it
    (the one ``hwdist.resolve`` returns), even when that driver shares a torch
    backend (``torch_backend = "gloo"``). For any other group it is torch's
    string (e.g. ``gloo``, ``nccl``, or ``cpu:gloo,cuda:nccl``), except that a
    name a driver registered with torch under another name (the mpi4py process
    group) is reported as the driver's name (``'mpi'``).
    """
    if not is_distributed():
        return None
    return registry.group_backend_name(group)


_launch_warned: list[bool] = [False]


def warn_if_launched(stacklevel: int = 3) -> None:
    """Warn once per process when a launcher's variables say several ranks but no process group exists.

    Under torchrun (or any launcher that sets ``RANK`` and ``WORLD_SIZE``) a script that forgot
    ``init_dist`` runs every rank as "rank 0 of 1": ``is_main_process()`` is True everywhere and every
    collective is a no-op. Called on the not-distributed path of the rank queries and collectives.
    """
    if _launch_warned[0]:
        return
    world = os.environ.get("WORLD_SIZE", "").strip()
    if not (world.isdigit() and int(world) > 1 and os.environ.get("RANK", "").strip()):
        return
    _launch_warned[0] = True
    warnings.warn(
        f"RANK={os.environ['RANK'].strip()} and WORLD_SIZE={world} are set (a launcher started this process)"
        " but no process group is initialised: every hwdist call acts as rank 0 of 1 on every rank"
        " (is_main_process() is True everywhere, collectives do nothing). HINT: call"
        " hwdist.init_dist('pytorch') (or torch.distributed.init_process_group) first",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


def get_world_size(group: Optional[Any] = None) -> int:
    """Number of ranks in ``group`` (default group if None); 1 when not distributed."""
    if not is_distributed():
        warn_if_launched()
        return 1
    return torch_dist.get_world_size(group)


def get_rank(group: Optional[Any] = None) -> int:
    """This process's rank in ``group`` (default group if None); 0 when not distributed."""
    if not is_distributed():
        warn_if_launched()
        return 0
    return torch_dist.get_rank(group)


def _env_int(*names: str) -> Optional[int]:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None
    return None


# Launcher variables that carry the local rank / local world size, most specific first (the launcher table).
_LOCAL_RANK_VARS = LOCAL_RANK_VARS
_LOCAL_SIZE_VARS = LOCAL_SIZE_VARS


def get_local_group() -> Optional[Any]:
    """The process group of the ranks on this node (see ``init_local_group``), or None."""
    return _local_group() if is_distributed() else None


def _local(what: str, from_group: Callable[[Any], int], variables: Sequence[str], serial: int) -> int:
    """The local group's value, else the launcher's variables, else ``serial`` when not distributed."""
    local = _local_group() if is_distributed() else None
    if local is not None:
        return from_group(local)
    value = _env_int(*variables)
    if value is not None:
        return value
    if not is_distributed():
        return serial
    raise RuntimeError(
        f"local {what} unknown: no local process group and none of "
        f"{', '.join(variables)} is set. HINT: hwdist.init_local_group(node_rank, num_gpus_per_node)"
    )


def get_local_rank() -> int:
    """This process's rank within its node.

    Uses the local group when one was created (``init_local_group``), else
    the launcher's environment (``LOCAL_RANK``, ``SLURM_LOCALID``,
    ``OMPI_COMM_WORLD_LOCAL_RANK``, ...); 0 when not distributed. Unlike
    mmengine, this works before a process group exists (vis4d semantics).
    """
    return _local("rank", torch_dist.get_rank, _LOCAL_RANK_VARS, 0)


def get_local_size() -> int:
    """Number of ranks on this node (local group, else launcher environment); 1 when not distributed."""
    return _local("size", torch_dist.get_world_size, _LOCAL_SIZE_VARS, 1)


def get_dist_info(group: Optional[Any] = None) -> tuple[int, int]:
    """``(rank, world_size)`` of ``group``; ``(0, 1)`` when not distributed."""
    return get_rank(group), get_world_size(group)


def is_main_process(group: Optional[Any] = None) -> bool:
    """Whether this is rank 0 of ``group`` (True when not distributed)."""
    return get_rank(group) == 0


def master_only(func: F) -> F:
    """Decorator: run ``func`` on the main process only (others return None)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_main_process():
            return func(*args, **kwargs)
        return None

    return wrapper  # type: ignore[return-value]


rank_zero_only = master_only
"""Alias of [`master_only`][hwdist.info.master_only] (vis4d / Lightning name)."""


def get_data_device(data: Any) -> torch.device:
    """The device of a tensor, or of every tensor in a (nested) sequence or mapping.

    Raises:
        ValueError: the tensors are on different devices, or ``data`` is empty.
        TypeError: ``data`` holds something that is not a tensor.
    """
    if isinstance(data, torch.Tensor):
        return data.device
    if isinstance(data, (Mapping, Iterable)) and not isinstance(data, (str, bytes)):
        values = data.values() if isinstance(data, Mapping) else data
        found: Optional[torch.device] = None
        for item in values:
            dev = get_data_device(item)
            if found is None:
                found = dev
            elif dev != found:
                raise ValueError(f"device type in data should be consistent, but got {dev} and {found}")
        if found is None:
            raise ValueError("data should not be empty")
        return found
    raise TypeError(
        f"data should be a Tensor, sequence of tensor or dict, but got {type(data).__name__}: {data!r}"
    )


def get_comm_device(group: Optional[Any] = None) -> torch.device:
    """The device collectives on ``group`` must run on (its driver's ``comm_device``).

    ``cpu`` when not distributed.
    """
    if not is_distributed():
        return torch.device("cpu")
    return registry.resolve(group).comm_device()


def cast_data_device(data: Any, device: Union[torch.device, str], out: Optional[Any] = None) -> Any:
    """Move a tensor or a nested list/tuple/dict of tensors to ``device``.

    Containers keep their type (namedtuples too). With ``out``, results are
    copied into ``out``'s tensors (same structure) and ``out`` is returned.

    Raises:
        TypeError: ``data`` holds a non-tensor, or ``out`` has another type.
        ValueError: ``data`` is empty, or ``out`` has a different length/keys.
    """
    if out is not None and type(data) is not type(out):
        raise TypeError(
            f"out should be the same type as data: got {type(out).__name__} and {type(data).__name__}"
        )
    if isinstance(data, torch.Tensor):
        if out is None:
            return data.to(device)
        out.copy_(data)
        return out
    if isinstance(data, Mapping):
        if not data:
            raise ValueError("data should not be empty")
        if out is not None:
            if set(out) != set(data):
                raise ValueError(f"out should have the same keys as data: {sorted(out)} != {sorted(data)}")
            for k, v in data.items():
                cast_data_device(v, device, out[k])
            return out
        return type(data)({k: cast_data_device(v, device) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
        items = list(data)
        if not items:
            raise ValueError("data should not be empty")
        if out is not None:
            outs = list(out)
            if len(outs) != len(items):
                raise ValueError(f"out should have the same length as data: {len(outs)} != {len(items)}")
            for v, o in zip(items, outs):
                cast_data_device(v, device, o)
            return out
        cast = [cast_data_device(v, device) for v in items]
        if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
            return type(data)(*cast)
        return type(data)(cast)  # type: ignore[call-arg]
    raise TypeError(f"data should be a Tensor, list of tensor or dict, but got {type(data).__name__}")
