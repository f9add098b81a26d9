"""``vis4d.common.distributed`` on hwdist: every public name, vis4d's signatures and behaviour.

``import hwdist.compat.vis4d as dist`` runs code written for vis4d's module
unchanged. Ranks and sizes come from the launcher's environment before the
process group exists (vis4d's rule: ``RANK``/``WORLD_SIZE``, then Slurm's
variables unless the job is an interactive ``bash`` allocation) and from the
process group once it does; every exchange runs through hwdist's public
operations on the group's driver, so the GPU-only paths of vis4d
(``serialize_to_tensor``, ``all_gather_object_gpu``, ``all_reduce_dict``) work
on any backend, using the driver's communication device.

A call whose arguments are wrong on one rank raises on every rank (hwdist's
agreement exchange) instead of leaving the others waiting; where vis4d
raised (``AssertionError``, ``KeyError``, ``RuntimeError``), the same type is
raised.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections import OrderedDict
from functools import wraps
from typing import Any, Callable, Optional, TypeVar, cast

import torch
from torch import Tensor, nn

import hwdist

from ..collectives.protocol import agree
from ..drivers.nccl import NcclDriver
from ..errors import ArgumentAssertionError, CollectiveArgumentError
from ..launch.resolvers import env_int
from ._legacy_common import agree_on_layout, agree_or_raise, layout_digest, shown

__all__ = [
    "all_gather_object_cpu",
    "all_gather_object_gpu",
    "all_reduce_dict",
    "broadcast",
    "create_tmpdir",
    "distributed_available",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "is_module_wrapper",
    "obj2tensor",
    "pad_to_largest_tensor",
    "rank_zero_only",
    "reduce_mean",
    "serialize_to_tensor",
    "synchronize",
    "tensor2obj",
]

F = TypeVar("F", bound=Callable[..., Any])

#: vis4d's default ``device`` of ``obj2tensor`` (NCCL's device); left as is, the driver's device is used.
_DEFAULT_DEVICE = torch.device(NcclDriver.device_type)


def _env_int(name: str) -> Optional[int]:
    """A launcher variable as an int (None when unset or blank); a ValueError names a malformed one."""
    return env_int(os.environ, name)


# ----------------------------------------------------------------------------- ranks and sizes
def get_world_size() -> int:
    """The number of processes: the process group's, else the launcher's environment.

    Before the group exists: ``WORLD_SIZE``, else ``SLURM_NTASKS`` (unless
    ``SLURM_JOB_NAME`` is ``bash``, an interactive allocation), else 1.

    Examples:
        >>> # torchrun --nproc-per-node 2, before init
        >>> dist.get_world_size()
        # rank 0: 2   rank 1: 2
    """
    if hwdist.is_distributed():
        return hwdist.get_world_size()
    size = _env_int("WORLD_SIZE")
    if size is not None:
        return size
    if os.environ.get("SLURM_JOB_NAME") != "bash":
        size = _env_int("SLURM_NTASKS")
        if size is not None:
            return size
    return 1


def get_local_rank() -> int:
    """This process's rank on its node: ``LOCAL_RANK``, else ``SLURM_LOCALID``, else 0."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        value = _env_int(name)
        if value is not None:
            return value
    return 0


# Mirrors get_world_size's env fallback on purpose: vis4d's functions read the launcher the same way.
def get_rank() -> int:
    """The global rank: the process group's, else the launcher's environment.

    Before the group exists: ``RANK``; in an interactive Slurm job
    (``SLURM_JOB_NAME=bash``) the local rank; else ``SLURM_PROCID``; else the
    local rank.

    Examples:
        >>> dist.get_rank()
        # rank 0: 0   rank 1: 1
    """
    if hwdist.is_distributed():
        return hwdist.get_rank()
    rank = _env_int("RANK")
    if rank is not None:
        return rank
    if os.environ.get("SLURM_JOB_NAME") == "bash":
        return get_local_rank()
    rank = _env_int("SLURM_PROCID")
    return rank if rank is not None else get_local_rank()


def distributed_available() -> bool:
    """Whether a process group exists (torch.distributed is available and initialised)."""
    return hwdist.is_distributed()


def synchronize() -> None:
    """Barrier over every process; does nothing without a process group or with one process."""
    if not distributed_available() or get_world_size() == 1:
        return
    hwdist.barrier()


def rank_zero_only(func: F) -> F:
    """Run the decorated function on global rank 0 only (others get None).

    The rank is [`get_rank`][hwdist.compat.vis4d.get_rank]'s, so it also holds
    before the process group exists (a rank started by torchrun or Slurm).

    Examples:
        >>> @dist.rank_zero_only
        ... def log(msg): return msg
        >>> log("hi")
        # rank 0: 'hi'   rank 1: None
    """

    @wraps(func)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if get_rank() == 0:
            return func(*args, **kwargs)
        return None

    return cast(F, wrapped)


# ----------------------------------------------------------------------------- objects
def broadcast(obj: Any, src: int = 0) -> Any:
    """``src``'s object, on every rank (``obj`` itself without a process group).

    Raises:
        ValueError: ``src`` is not a rank of the group (on that rank), or the ranks' ``src`` differ; the
            other ranks raise ``CollectiveArgumentError``.

    Examples:
        >>> dist.broadcast({"step": rank}, src=1)
        # rank 0: {'step': 1}   rank 1: {'step': 1}
    """
    if not distributed_available():
        return obj
    problem: Optional[BaseException] = None
    world = hwdist.get_world_size()
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world:
        problem = ValueError(f"broadcast: src must be a rank in [0, {world - 1}], got {src!r}")
    if world > 1:  # one rank's bad or different src: every rank raises (no rank waits for the others)
        agree_or_raise("broadcast", None, problem, [0 if problem else int(src)], "src", f"src={src!r}")
    elif problem is not None:
        raise problem
    return hwdist.broadcast_object(obj, src)


def obj2tensor(pyobj: Any, device: torch.device = _DEFAULT_DEVICE) -> Tensor:
    """The pickle bytes of ``pyobj`` as a 1-D ``uint8`` tensor on ``device``.

    Args:
        pyobj: any picklable object.
        device: where the tensor goes. vis4d's default is ``cuda``; left at
            that default, hwdist puts it on the driver's communication device
            (``cuda:N`` on NVIDIA machines, the CPU or another accelerator
            elsewhere).

    Returns:
        ``torch.uint8`` tensor of ``len(pickle.dumps(pyobj))`` elements.

    Examples:
        >>> t = dist.obj2tensor({"a": 1}, device=torch.device("cpu"))
        >>> dist.tensor2obj(t)
        {'a': 1}
    """
    data = bytearray(pickle.dumps(pyobj))
    tensor = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return tensor.to(device=hwdist.get_comm_device() if device is _DEFAULT_DEVICE else device)


def tensor2obj(tensor: Tensor) -> Any:
    """The object whose pickle bytes ``tensor`` holds.

    The inverse of [`obj2tensor`][hwdist.compat.vis4d.obj2tensor]; the tensor may be on any device.
    """
    return pickle.loads(tensor.cpu().numpy().tobytes())


def serialize_to_tensor(data: Any) -> Tensor:
    """The pickle bytes of ``data`` as a ``uint8`` tensor on the process group's communication device.

    vis4d accepts only gloo (CPU) and NCCL (``cuda``); hwdist accepts every
    backend and uses its driver's communication device.

    Raises:
        AssertionError: no process group (vis4d asks the group for its backend).
    """
    if not distributed_available():
        raise ArgumentAssertionError(
            "serialize_to_tensor: needs a process group (the tensor goes to its communication device);"
            " call hwdist.init_dist(...) first"
        )
    return obj2tensor(data, hwdist.get_comm_device())


def pad_to_largest_tensor(tensor: Tensor) -> tuple[list[int], Tensor]:
    """Every rank's element count, and ``tensor`` padded with zeros to the largest one.

    Args:
        tensor: a 1-D tensor (e.g. from [`serialize_to_tensor`][hwdist.compat.vis4d.serialize_to_tensor]).

    Returns:
        ``(sizes, padded)``: ``sizes[r]`` is rank ``r``'s ``numel()``.

    Raises:
        TypeError: ``tensor`` is not a tensor (on that rank; the others raise ``CollectiveArgumentError``).

    Examples:
        >>> sizes, t = dist.pad_to_largest_tensor(torch.ones(rank + 1, dtype=torch.uint8))
        # rank 0: [1, 2], tensor([1, 0])   rank 1: [1, 2], tensor([1, 1])
    """
    problem: Optional[BaseException] = None
    if not isinstance(tensor, Tensor):
        got = type(tensor).__name__
        problem = TypeError(f"pad_to_largest_tensor: tensor must be a torch.Tensor, got {got}")
    if distributed_available() and hwdist.get_world_size() > 1:
        agree_or_raise("pad_to_largest_tensor", None, problem, [], "")
    elif problem is not None:
        raise problem
    local = int(tensor.numel())
    sizes = [int(s) for s in hwdist.all_gather_object(local) or ()] if distributed_available() else [local]
    largest = max(sizes)
    if local != largest:
        padding = torch.zeros((largest - local,), dtype=tensor.dtype, device=tensor.device)
        tensor = torch.cat((tensor, padding), dim=0)
    return sizes, tensor


def all_gather_object_gpu(data: Any, rank_zero_return_only: bool = True) -> Optional[list[Any]]:
    """Every rank's ``data``, through the driver's communication device.

    Args:
        data: any picklable object.
        rank_zero_return_only: if True, ranks other than 0 get None.

    Returns:
        ``[data of rank 0, data of rank 1, ...]`` (``[data]`` with one process).

    Examples:
        >>> dist.all_gather_object_gpu(rank * 10, rank_zero_return_only=False)
        # rank 0: [0, 10]   rank 1: [0, 10]
    """
    if get_world_size() == 1 or not distributed_available():
        return [data]
    gathered = hwdist.all_gather_object(data)
    if rank_zero_return_only and get_rank() != 0:
        return None
    return gathered


def create_tmpdir(rank: int, tmpdir: Optional[str] = None, use_system_tmp: bool = True) -> str:
    """A directory every process shares: ``tmpdir`` (created), else one rank 0 makes and broadcasts.

    Rank ``rank == 0`` creates a fresh directory under
    ``<system tmp>/.dist_tmp`` (``use_system_tmp=True``) or
    ``vis4d-workspace/.dist_tmp``. Every process must call it; they must all
    give a ``tmpdir`` or all give none (else every rank raises, instead of
    some waiting for a broadcast the others skip).

    Args:
        rank: this process's rank (rank 0 creates the directory).
        tmpdir: a directory to use (created if missing) instead.
        use_system_tmp: where rank 0 creates it when ``tmpdir`` is None.

    Returns:
        The directory's path (the same on every rank).

    Raises:
        ValueError: some ranks gave ``tmpdir`` and others did not (every rank).

    Examples:
        >>> dist.create_tmpdir(dist.get_rank())
        # rank 0: '/tmp/.dist_tmp/tmpab12cd'   rank 1: '/tmp/.dist_tmp/tmpab12cd'
    """
    if distributed_available() and hwdist.get_world_size() > 1:
        got = agree("create_tmpdir", None, words=[int(tmpdir is None)])
        if not got.same:
            raise CollectiveArgumentError(
                "create_tmpdir: some ranks passed tmpdir and others did not; pass it on every rank"
                " (a shared directory) or on none"
            )
    if tmpdir is not None:
        os.makedirs(tmpdir, exist_ok=True)
        return tmpdir
    made: Optional[str] = None
    if rank == 0:
        base = tempfile.gettempdir() if use_system_tmp else "vis4d-workspace"
        parent = os.path.join(base, ".dist_tmp")
        os.makedirs(parent, exist_ok=True)
        made = tempfile.mkdtemp(dir=parent)
    return cast(str, broadcast(made))


def all_gather_object_cpu(
    data: Any,
    tmpdir: Optional[str] = None,
    rank_zero_return_only: bool = True,
    use_system_tmp: bool = False,
) -> Optional[list[Any]]:
    """Every rank's ``data``, through files in a directory all processes share.

    Args:
        data: any picklable object.
        tmpdir: the shared directory (None: [`create_tmpdir`][hwdist.compat.vis4d.create_tmpdir] makes one).
        rank_zero_return_only: if True, ranks other than 0 get None.
        use_system_tmp: where ``create_tmpdir`` makes the directory.

    Returns:
        ``[data of rank 0, data of rank 1, ...]`` (``[data]`` with one process); the
        directory is removed by rank 0 afterwards.

    Raises:
        CollectiveArgumentError: some rank's ``data`` cannot be pickled (every rank, before anything is
            written), or, with ``rank_zero_return_only=False``, some rank could not read a part.

    Examples:
        >>> dist.all_gather_object_cpu({"r": rank})
        # rank 0: [{'r': 0}, {'r': 1}]   rank 1: None
    """
    if get_world_size() == 1 or not distributed_available():
        return [data]
    rank, world = get_rank(), get_world_size()
    problem: Optional[BaseException] = None
    try:
        payload = pickle.dumps(data)
    except Exception as exc:  # an unpicklable object: every rank raises, before anything is written
        problem = CollectiveArgumentError(
            f"all_gather_object_cpu: rank {rank}'s data cannot be pickled ({type(exc).__name__}: {exc})"
        )
        problem.__cause__ = exc
    agree_or_raise("all_gather_object_cpu", None, problem, [], "")
    folder = create_tmpdir(rank, tmpdir, use_system_tmp)
    with open(os.path.join(folder, f"part_{rank}.pkl"), "wb") as f:
        f.write(payload)
    synchronize()
    if rank_zero_return_only and rank != 0:
        return None
    parts = []
    failed: Optional[BaseException] = None
    try:
        for i in range(world):
            with open(os.path.join(folder, f"part_{i}.pkl"), "rb") as f:
                parts.append(pickle.load(f))
    except Exception as exc:
        failed = exc
    if not rank_zero_return_only:  # every rank has read (or failed to) before rank 0 removes the directory
        agree_or_raise("all_gather_object_cpu", None, failed, [], "")
    elif failed is not None:
        raise failed
    if rank == 0:
        shutil.rmtree(folder)
    return parts


# ----------------------------------------------------------------------------- tensors
def reduce_mean(tensor: Tensor) -> Tensor:
    """The mean of ``tensor`` over the ranks, as a new tensor that keeps ``tensor``'s autograd graph.

    As in vis4d, the gradient flows back as if through ``tensor / world_size``
    (the exchange itself is not differentiated). Without a process group:
    ``tensor`` itself.

    Raises:
        TypeError: ``tensor`` is not a tensor (on that rank; the others raise ``CollectiveArgumentError``).
        CollectiveArgumentError: the ranks' shapes or dtypes differ (every rank).

    Examples:
        >>> dist.reduce_mean(torch.tensor([float(rank)]))
        # rank 0: tensor([0.5000])   rank 1: tensor([0.5000])
    """
    if not distributed_available():
        return tensor
    problem: Optional[BaseException] = None
    if not isinstance(tensor, Tensor):
        problem = TypeError(f"reduce_mean: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if get_world_size() > 1:  # a bad value, or another shape or dtype, on one rank: every rank raises
        mine = shown(tensor)
        what = "the tensor's shape and dtype"
        agree_or_raise("reduce_mean", None, problem, [layout_digest(mine)], what, mine)
    elif problem is not None:
        raise problem
    out = tensor.clone().div_(get_world_size())
    hwdist.all_reduce(
        out.data, "sum"
    )  # .data: the reduction is not recorded by autograd (vis4d's behaviour)
    return out


def all_reduce_dict(
    py_dict: dict[str, Any], reduce_op: str = "sum", to_float: bool = True
) -> dict[str, Any]:
    """A new dict with every tensor of ``py_dict`` reduced over the ranks.

    Keys come in rank 0's order (an ``OrderedDict`` keeps its own order and
    comes back as an ``OrderedDict``); every rank must hold the same keys with
    the same shapes. Values are packed into one flat tensor (as ``float32``
    when ``to_float``) and reduced in one collective on the group's driver.

    Args:
        py_dict: ``{key: tensor}``.
        reduce_op: ``'sum'`` or ``'mean'``.
        to_float: convert every value to ``float32`` first.

    Returns:
        A new dict of reduced tensors (``py_dict`` itself with one process).

    Raises:
        ValueError: ``reduce_op`` is neither 'sum' nor 'mean' (vis4d summed silently).
        KeyError: a rank lacks one of rank 0's keys (every rank).
        ValueError: the ranks' shapes or dtypes differ (every rank).

    Examples:
        >>> dist.all_reduce_dict({"loss": torch.tensor(rank + 1.0)}, reduce_op="mean")
        # rank 0: {'loss': tensor(1.5000)}   rank 1: {'loss': tensor(1.5000)}
    """
    problem: Optional[BaseException] = None
    if reduce_op not in ("sum", "mean"):
        problem = ValueError(f"all_reduce_dict: reduce_op must be 'sum' or 'mean', got {reduce_op!r}")
    world = get_world_size()
    if world == 1 or not distributed_available():
        if problem is not None:
            raise problem
        return py_dict
    ordered = isinstance(py_dict, OrderedDict)
    keys = list(py_dict.keys()) if isinstance(py_dict, dict) else []
    # rank 0's keys and kind of dict, on every rank (an OrderedDict on one rank and a dict on another must
    # not make only some ranks take part in this broadcast)
    keys0, ordered0 = hwdist.broadcast_object((keys, ordered), 0)
    if not ordered:
        keys = keys0
    missing = [k for k in keys if k not in py_dict] if isinstance(py_dict, dict) else []
    if problem is not None:
        pass
    elif not isinstance(py_dict, dict):
        got = type(py_dict).__name__
        problem = CollectiveArgumentError(f"all_reduce_dict: py_dict must be a dict, got {got}")
    elif ordered != ordered0:
        problem = CollectiveArgumentError(
            f"all_reduce_dict: rank {hwdist.get_rank()} passed {'an OrderedDict' if ordered else 'a dict'}"
            f" where rank 0 passed {'an OrderedDict' if ordered0 else 'a dict'}; every rank must pass the"
            " same kind (an OrderedDict keeps each rank's own key order)"
        )
    elif missing:
        problem = KeyError(
            f"all_reduce_dict: rank {hwdist.get_rank()} lacks key(s) {missing!r} that rank 0 has"
        )
    elif not all(isinstance(py_dict[k], Tensor) for k in keys):
        bad = next(k for k in keys if not isinstance(py_dict[k], Tensor))
        problem = CollectiveArgumentError(
            f"all_reduce_dict: py_dict[{bad!r}] must be a tensor, got {type(py_dict[bad]).__name__}"
        )
    layout = "" if problem else repr(
        [(k, tuple(py_dict[k].shape), py_dict[k].dtype) for k in keys] + [bool(to_float), reduce_op]
    )
    agree_on_layout(
        "all_reduce_dict", None, problem, layout,
        "the ranks' values differ in shape or dtype, or their to_float or reduce_op differ; every rank"
        " must hold the same keys with values of the same shape and dtype, and pass the same to_float and"
        " reduce_op",
    )
    shapes = [py_dict[k].shape for k in keys]
    numels = [py_dict[k].numel() for k in keys]
    parts = [py_dict[k].flatten().float() if to_float else py_dict[k].flatten() for k in keys]
    flat = torch.cat(parts) if parts else torch.zeros(0)
    hwdist.all_reduce(flat, "sum")
    if reduce_op == "mean":
        flat /= world
    values = [x.reshape(shape) for x, shape in zip(torch.split(flat, numels), shapes)]
    out: dict[str, Any] = dict(zip(keys, values))
    return OrderedDict(out) if ordered else out


def is_module_wrapper(module: nn.Module) -> bool:
    """Whether ``module`` or any module inside it is a wrapper (``DataParallel``, DDP).

    Unlike ``hwdist.is_module_wrapper`` (mmengine's, which follows ``.module``),
    vis4d's searches every child module recursively.

    Examples:
        >>> dist.is_module_wrapper(torch.nn.Sequential(torch.nn.DataParallel(torch.nn.Linear(1, 1))))
        True
    """
    if hwdist.is_module_wrapper(module):
        return True
    return any(is_module_wrapper(child) for child in module.children())
