"""A torch ``ProcessGroup`` implemented in Python with mpi4py (CPU tensors).

Stock PyPI torch is built without MPI, so ``backend='mpi'`` cannot reach
torch's own ``ProcessGroupMPI``. This module provides the replacement that the
MPI driver registers with torch under [`PY_MPI_BACKEND`][hwdist.drivers._mpi_facts.PY_MPI_BACKEND]
(the name ``'mpi'`` is reserved by torch).

Design:

* **Which MPI processes form a group.** torch calls the factory once per
  group (default group and every ``new_group``) with the group's prefixed
  store, the caller's rank in the group and the group size, and only on the
  group's members. Each member writes its ``MPI.COMM_WORLD`` rank into that
  store and reads everyone else's, so the factory learns the group's MPI
  ranks in group-rank order without relying on torch's private options.
  The members then build the sub-communicator with ``Comm.Create_group``,
  which is collective over the members only (exactly who calls the factory).
  If two torch ranks report the same MPI rank, the processes were not
  started by one ``mpiexec``; every member sees the same table and raises.
* **Data.** Move-only ops (broadcast, gathers, scatter, all-to-all, p2p)
  transfer raw bytes (``MPI.BYTE``), so every dtype moves, bfloat16 included.
  Reductions use the numpy dtype; dtypes MPI cannot reduce (bfloat16;
  float16 where the MPI library lacks it) are reduced in float32 and cast
  back, bool reductions use MPI's logical ops. hwdist's own collectives
  never rely on that: the driver declares these dtypes so its plans cast
  before calling torch.
* **Work.** Collectives run to completion before returning (blocking MPI
  calls; mpi4py releases the GIL while they run), and return a completed
  [`MpiWork`][hwdist.drivers._mpi_ops.MpiWork] whose ``get_future()`` is already done, which is what
  DDP's communication hooks need. Point-to-point ops are non-blocking
  (``Isend``/``Irecv``); their work completes in ``wait()``.
* **No endless waits.** Every blocking MPI call is marked in flight for the
  watchdog ([`_mpi_watchdog`][hwdist.drivers._mpi_watchdog]), which aborts the job when a rank raises
  or exits while others wait for it, or when a call exceeds the group's
  timeout.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from . import _mpi_watchdog
from ._mpi_ops import Buf as _Buf
from ._mpi_ops import Keep as _Keep
from ._mpi_ops import MpiWork
from ._mpi_ops import Typed as _Typed
from ._mpi_ops import counts as _counts
from ._mpi_ops import mpi_module as _mpi
from ._mpi_ops import mpi_op as _mpi_op
from ._mpi_ops import nbytes as _nbytes
from ._mpi_ops import pack as _pack
from ._mpi_ops import reduce_dtype as _reduce_dtype
from ._mpi_ops import unpack as _unpack
from ._mpi_facts import PY_MPI_BACKEND

__all__ = ["MpiProcessGroup", "MpiWork", "create_mpi_process_group", "MPI_BACKEND_NAME"]

#: Name reported by ``getBackendName`` (and used with torch's registry).
MPI_BACKEND_NAME = PY_MPI_BACKEND

# torch's stubs overload the op methods with their Python call forms; a Python process group implements
# the options form torch calls, which no stub matches: the base is typed loosely for that reason.
_ProcessGroup: Any = dist.ProcessGroup


class MpiProcessGroup(_ProcessGroup):
    """torch ProcessGroup over an MPI communicator (CPU tensors, mpi4py)."""

    def __init__(self, comm: Any, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self.comm = comm
        self._rank = rank
        self._size = size
        MPI = _mpi()
        # Without MPI_THREAD_MULTIPLE, calls from torch's threads (DDP) are serialised.
        self._lock: Optional[threading.Lock] = (
            None if MPI.Query_thread() >= MPI.THREAD_MULTIPLE else threading.Lock()
        )
        #: Members and timeout for the watchdog (hwdist/drivers/_mpi_watchdog.py); set by the factory.
        self._watch: Optional[_mpi_watchdog.Watch] = None

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return MPI_BACKEND_NAME

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with _mpi_watchdog.watching(self._watch, f"MPI {getattr(fn, '__name__', 'call')}"):
            if self._lock is None:
                return fn(*args, **kwargs)
            with self._lock:
                return fn(*args, **kwargs)

    def _check_root(self, root: int, what: str) -> None:
        if not 0 <= root < self._size:
            raise ValueError(f"{what}: root rank {root} is outside the group (size {self._size})")

    def _check_count(self, items: list[Any], what: str, kind: str) -> None:
        if len(items) != self._size:
            raise ValueError(f"{what}: expected {self._size} {kind}, got {len(items)}")

    # ---- reductions ---------------------------------------------------------
    def _allreduce_one(self, t: torch.Tensor, opts: Any) -> None:
        typed = _Typed(t, "all_reduce")
        op, divide = _mpi_op(opts, t.dtype)
        arr = typed.array()
        self._call(self.comm.Allreduce, _mpi().IN_PLACE, arr, op=op)
        if divide:
            typed.wide.div_(self._size)
        typed.done()

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> MpiWork:  # noqa: D102
        for t in tensors:
            self._allreduce_one(t, opts)
        return MpiWork(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> MpiWork:  # noqa: D102
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> MpiWork:  # noqa: D102
        MPI = _mpi()
        root = int(opts.rootRank)
        self._check_root(root, "reduce")
        for t in tensors:
            typed = _Typed(t, "reduce")
            op, divide = _mpi_op(opts, t.dtype)
            arr = typed.array()
            if self._rank == root:
                self._call(self.comm.Reduce, MPI.IN_PLACE, arr, op=op, root=root)
                if divide:
                    typed.wide.div_(self._size)
                typed.done()
            else:
                self._call(self.comm.Reduce, arr, None, op=op, root=root)
        return MpiWork(tensors)

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> MpiWork:  # noqa: D102
        for out, ins in zip(outputs, inputs):
            self._check_count(ins, "reduce_scatter", "input tensors")
            comm_dtype = _reduce_dtype(out.dtype)
            send = torch.cat([i.detach().reshape(-1).to(comm_dtype) for i in ins])
            recv = _Typed(out, "reduce_scatter")
            op, divide = _mpi_op(opts, out.dtype)
            counts = [i.numel() for i in ins]
            if counts[self._rank] != out.numel():
                raise ValueError(
                    f"reduce_scatter: output has {out.numel()} elements, input {self._rank} has"
                    f" {counts[self._rank]}"
                )
            self._call(self.comm.Reduce_scatter, send.numpy(), recv.array(), recvcounts=counts, op=op)
            if divide:
                recv.wide.div_(self._size)
            recv.done()
        return MpiWork(outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> MpiWork:  # noqa: D102
        if input.numel() != output.numel() * self._size:
            raise ValueError(
                f"reduce_scatter: input has {input.numel()} elements, expected output size"
                f" {output.numel()} x group size {self._size}"
            )
        send = _Typed(input, "reduce_scatter input")
        recv = _Typed(output, "reduce_scatter output")
        op, divide = _mpi_op(opts, output.dtype)
        self._call(self.comm.Reduce_scatter_block, send.array(), recv.array(), op=op)
        if divide:
            recv.wide.div_(self._size)
        recv.done()
        return MpiWork([output])

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> MpiWork:  # noqa: D102
        for out, inp in zip(outputs, inputs):
            self._reduce_scatter_base(out, inp, opts)
        return MpiWork(outputs)

    # ---- data movement --------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> MpiWork:  # noqa: D102
        root = int(opts.rootRank)
        self._check_root(root, "broadcast")
        for t in tensors:
            buf = _Buf(t, "broadcast")
            self._call(self.comm.Bcast, buf.bytes(), root=root)
            buf.done()
        return MpiWork(tensors)

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> MpiWork:  # noqa: D102
        MPI = _mpi()
        for outs, inp in zip(outputs, inputs):
            self._check_count(outs, "all_gather", "output tensors")
            counts, displs = _counts(outs)
            src = _Buf(inp, "all_gather input")
            if _nbytes(inp) != counts[self._rank]:
                raise ValueError(
                    f"all_gather: input has {_nbytes(inp)} bytes, output {self._rank} expects"
                    f" {counts[self._rank]}"
                )
            flat = np.empty(sum(counts), np.uint8)
            self._call(self.comm.Allgatherv, src.bytes(), [flat, counts, displs, MPI.BYTE])
            _unpack(flat, outs, displs)
        return MpiWork([t for outs in outputs for t in outs])

    def allgather_coalesced(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> MpiWork:  # noqa: D102
        return self.allgather(outputs, inputs, opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> MpiWork:  # noqa: D102
        if _nbytes(output) != _nbytes(input) * self._size:
            raise ValueError(
                f"all_gather_into_tensor: output has {output.numel()} elements, expected"
                f" {input.numel()} x group size {self._size}"
            )
        out = _Buf(output, "all_gather output")
        src = _Buf(input, "all_gather input")
        self._call(self.comm.Allgather, src.bytes(), out.bytes())
        out.done()
        return MpiWork([output])

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> MpiWork:  # noqa: D102
        for out, inp in zip(outputs, inputs):
            self._allgather_base(out, inp, opts)
        return MpiWork(outputs)

    def _rooted(self, opts: Any, what: str, lists: list[list[torch.Tensor]], kind: str) -> tuple[int, Any]:
        """The root of a gather/scatter, checked, and on the root its tensor list with counts and displs."""
        root = int(opts.rootRank)
        self._check_root(root, what)
        if self._rank != root:
            return root, None
        tensors = lists[0]
        self._check_count(tensors, what, kind)
        return root, (tensors, *_counts(tensors))

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> MpiWork:  # noqa: D102
        root, mine = self._rooted(opts, "gather", outputs, "output tensors on the root")
        src = _Buf(inputs[0], "gather input")
        if mine is None:
            self._call(self.comm.Gatherv, src.bytes(), None, root=root)
            return MpiWork([])
        outs, counts, displs = mine
        flat = np.empty(sum(counts), np.uint8)
        self._call(self.comm.Gatherv, src.bytes(), [flat, counts, displs, _mpi().BYTE], root=root)
        _unpack(flat, outs, displs)
        return MpiWork(outs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> MpiWork:  # noqa: D102
        root, mine = self._rooted(opts, "scatter", inputs, "input tensors on the root")
        out = _Buf(outputs[0], "scatter output")
        if mine is None:
            self._call(self.comm.Scatterv, None, out.bytes(), root=root)
        else:
            ins, counts, displs = mine
            self._call(self.comm.Scatterv, [_pack(ins), counts, displs, _mpi().BYTE], out.bytes(), root=root)
        out.done()
        return MpiWork(outputs)

    def alltoall_base(  # noqa: D102
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> MpiWork:
        MPI = _mpi()
        out = _Buf(output, "all_to_all output")
        src = _Buf(input, "all_to_all input")
        scounts, sdispls = self._splits(input, input_split_sizes, "input")
        rcounts, rdispls = self._splits(output, output_split_sizes, "output")
        self._call(
            self.comm.Alltoallv,
            [src.bytes(), scounts, sdispls, MPI.BYTE],
            [out.bytes(), rcounts, rdispls, MPI.BYTE],
        )
        out.done()
        return MpiWork([output])

    def _splits(self, t: torch.Tensor, splits: Sequence[int], what: str) -> tuple[list[int], list[int]]:
        rows = t.shape[0] if t.dim() > 0 else 1
        row_bytes = _nbytes(t) // rows if rows else 0
        if not splits:
            if rows % self._size:
                raise ValueError(
                    f"all_to_all: {what} has {rows} rows, not divisible by group size {self._size}"
                )
            splits = [rows // self._size] * self._size
        if len(splits) != self._size or sum(splits) != rows:
            raise ValueError(
                f"all_to_all: {what} split sizes {list(splits)} do not cover {rows} rows in {self._size}"
                " parts"
            )
        counts = [int(s) * row_bytes for s in splits]
        displs = [0] * len(counts)
        for i in range(1, len(counts)):
            displs[i] = displs[i - 1] + counts[i - 1]
        return counts, displs

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> MpiWork:  # noqa: D102
        MPI = _mpi()
        if len(outputs) != self._size or len(inputs) != self._size:
            raise ValueError(f"all_to_all: expected {self._size} input and output tensors")
        scounts, sdispls = _counts(inputs)
        rcounts, rdispls = _counts(outputs)
        flat = np.empty(sum(rcounts), np.uint8)
        self._call(
            self.comm.Alltoallv,
            [_pack(inputs), scounts, sdispls, MPI.BYTE],
            [flat, rcounts, rdispls, MPI.BYTE],
        )
        _unpack(flat, outputs, rdispls)
        return MpiWork(outputs)

    # torch>=2.13 calls these names on the group object itself (a Python process
    # group has no per-device backends to forward them to).
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> MpiWork:  # noqa: D102
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> MpiWork:  # noqa: D102
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    all_to_all_single = alltoall_base  # torch's other name of the same call

    # ---- point to point -------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> MpiWork:  # noqa: D102
        self._check_root(dst, "send")
        buf = _Buf(tensors[0], "send")
        data = buf.bytes()
        req = self._call(self.comm.Isend, data, dest=dst, tag=tag)
        # The work keeps ``data`` (and so the buffer) alive until completion.
        return MpiWork(tensors, [req], finish=_Keep(data).finish, watch=self._watch)

    def _recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> MpiWork:
        buf = _Buf(tensors[0], "recv")
        data = buf.bytes()
        req = self._call(self.comm.Irecv, data, source=src, tag=tag)
        return MpiWork(tensors, [req], finish=_Keep(data, buf.done).finish, watch=self._watch)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> MpiWork:  # noqa: D102
        self._check_root(src, "recv")
        return self._recv(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> MpiWork:  # noqa: D102
        return self._recv(tensors, _mpi().ANY_SOURCE, tag)

    def barrier(self, opts: Any = None) -> MpiWork:  # noqa: D102
        self._call(self.comm.Barrier)
        return MpiWork([])


_KEY = "hwdist_mpi/world_rank/"


def _group_world_ranks(store: Any, rank: int, size: int) -> list[int]:
    """The MPI_COMM_WORLD rank of each group rank, exchanged over the group's store."""
    me = _mpi().COMM_WORLD.Get_rank()
    store.set(f"{_KEY}{rank}", str(me))
    return [int(store.get(f"{_KEY}{r}").decode()) for r in range(size)]


def create_mpi_process_group(store: Any, rank: int, size: int, timeout: Any) -> MpiProcessGroup:
    """torch backend factory: the mpi4py process group for one torch group.

    Called by torch on each member of a new group (the default group and
    every ``new_group``). The first call starts the watchdog; ``timeout``
    (``init_dist(timeout=...)``) bounds every MPI call of the group.

    Raises:
        RuntimeError: the processes are not one MPI job (started by one
            ``mpiexec``/``mpirun``), raised identically on every member.
    """
    MPI = _mpi()
    world = MPI.COMM_WORLD
    ranks = _group_world_ranks(store, rank, size)
    if len(set(ranks)) != len(ranks) or max(ranks) >= world.Get_size():
        raise RuntimeError(
            f"backend 'mpi' needs every rank started by one mpiexec/mpirun: torch ranks 0..{size - 1}"
            f" map to MPI_COMM_WORLD ranks {ranks} (MPI world size {world.Get_size()}). Start the job"
            " with `mpiexec -n N python ...` and hwdist.init_dist('mpi', backend='mpi'),"
            " or use backend 'gloo' under other launchers"
        )
    if size == world.Get_size() and ranks == list(range(size)):
        comm = world.Dup()
    else:
        comm = world.Create_group(world.Get_group().Incl(ranks))
    pg = MpiProcessGroup(comm, rank, size)
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
    pg._watch = _mpi_watchdog.Watch(frozenset(ranks), float(seconds) if seconds else None)
    _mpi_watchdog.install(store, world.Get_rank())
    return pg
