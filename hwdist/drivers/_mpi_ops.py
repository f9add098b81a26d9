"""The mpi4py process group's parts below the group: its Work, its buffers and its reduce ops.

[`MpiWork`][hwdist.drivers._mpi_ops.MpiWork] is the torch Work every op of
[`MpiProcessGroup`][hwdist.drivers._mpi_pg.MpiProcessGroup] returns; ``Buf``/``Typed`` turn
tensors into the numpy buffers MPI reads and writes (raw bytes for move-only ops, a typed and, where
MPI cannot reduce the dtype, widened array for reductions), and ``mpi_op`` maps torch's reduce ops to
MPI's. The design is described in [`_mpi_pg`][hwdist.drivers._mpi_pg].
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from . import _mpi_watchdog
from ._mpi_facts import MPI_REDUCE_DTYPES

__all__ = [
    "MpiWork",
    "Buf",
    "Typed",
    "Keep",
    "mpi_module",
    "mpi_op",
    "reduce_dtype",
    "nbytes",
    "counts",
    "pack",
    "unpack",
]

# ``opts.reduceOp.op`` is a ReduceOp.RedOpType, as ``ReduceOp.SUM`` and the others are.
_RED = dist.ReduceOp


def mpi_module() -> Any:
    """The mpi4py ``MPI`` module (importing it initialises MPI once)."""
    from mpi4py import MPI

    return MPI


class MpiWork(dist.Work):
    """A torch Work for an MPI operation: done at creation, or at ``wait()`` for p2p."""

    def __init__(
        self,
        result: Sequence[torch.Tensor],
        requests: Sequence[Any] = (),
        finish: Optional[Callable[[Any], None]] = None,
        watch: Optional[_mpi_watchdog.Watch] = None,
    ) -> None:
        super().__init__()
        self._result = list(result)
        self._requests = list(requests)
        self._finish = finish
        self._watch = watch
        self._source = -1
        self._lock = threading.Lock()
        self._future: torch.futures.Future = torch.futures.Future()
        if not self._requests:
            self._complete(None)

    def _complete(self, status: Any) -> None:
        if self._finish is not None:
            self._finish(status)
        if status is not None:
            self._source = status.Get_source()
        self._requests = []
        self._future.set_result(self._result)

    def wait(self, timeout: Any = None) -> bool:  # noqa: D102 (torch's API)
        with self._lock:
            if self._requests:
                status = mpi_module().Status()
                # Only p2p works have requests, and each has exactly one.
                with _mpi_watchdog.watching(self._watch, "a point-to-point wait"):
                    self._requests[0].Wait(status)
                self._complete(status)
        return True

    def is_completed(self) -> bool:  # noqa: D102
        with self._lock:
            if self._requests:
                status = mpi_module().Status()
                if not self._requests[0].Test(status):
                    return False
                self._complete(status)
            return True

    def is_success(self) -> bool:  # noqa: D102
        return self.is_completed()

    def exception(self) -> Any:  # noqa: D102
        return None

    def source_rank(self) -> int:  # noqa: D102
        self.wait()
        return self._source

    _source_rank = source_rank

    def result(self) -> list[torch.Tensor]:  # noqa: D102
        self.wait()
        return self._result

    def synchronize(self) -> None:  # noqa: D102
        self.wait()

    def get_future(self) -> torch.futures.Future:  # noqa: D102
        # A p2p future completes when the transfer does; waiting here keeps
        # the contract "the future is done once the data is there" simple.
        self.wait()
        return self._future


# ---------------------------------------------------------------- buffers
class Buf:
    """A contiguous CPU stand-in for a tensor, copied back on ``done()`` if needed."""

    __slots__ = ("tensor", "data")

    def __init__(self, tensor: torch.Tensor, what: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise RuntimeError(
                f"{what}: the mpi4py process group works on CPU tensors only, got a tensor on"
                f" {tensor.device}; move it to the CPU (hwdist's collectives do this for you)"
            )
        self.tensor = tensor
        self.data = tensor.detach()
        if not self.data.is_contiguous():
            self.data = self.data.contiguous()

    def bytes(self) -> np.ndarray:
        """The data as a flat uint8 numpy view (no copy)."""
        flat = self.data.reshape(-1)
        if flat.dtype != torch.uint8:
            flat = flat.view(torch.uint8)
        return flat.numpy()

    def done(self) -> None:
        """Copy results back if the tensor was not contiguous."""
        if self.data.data_ptr() != self.tensor.data_ptr() or self.data.shape != self.tensor.shape:
            with torch.no_grad():
                self.tensor.copy_(self.data)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# Dtypes reduced by MPI as they are (numpy knows them; the MPI standard defines them).
NATIVE_REDUCE = MPI_REDUCE_DTYPES
_fp16_ok: Optional[bool] = None


def mpi_has_fp16() -> bool:
    """Whether this MPI library reduces float16 (MPICH does, via MPIX_C_FLOAT16).

    Probed by a real reduction on COMM_SELF: Open MPI 4.1 knows the type code ('e') but its
    Allreduce raises MPI_ERR_TYPE (seen on a GPU host's Debian Open MPI 4.1.6).
    """
    global _fp16_ok
    if _fp16_ok is None:
        MPI = mpi_module()
        try:
            MPI.COMM_SELF.Allreduce(MPI.IN_PLACE, np.ones(1, dtype=np.float16), op=MPI.SUM)
            _fp16_ok = True
        except Exception:
            _fp16_ok = False
    return _fp16_ok


def reduce_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a reduction on ``dtype`` runs in."""
    if dtype in NATIVE_REDUCE:
        return dtype
    if dtype == torch.float16:
        return dtype if mpi_has_fp16() else torch.float32
    if dtype == torch.bfloat16:
        return torch.float32
    raise TypeError(
        f"the mpi4py process group cannot reduce {dtype}; supported: float16, bfloat16, float32,"
        " float64, complex64, complex128, bool and the integer dtypes"
    )


class Typed:
    """A tensor as a flat typed numpy array for reductions (widened when MPI lacks the dtype)."""

    def __init__(self, tensor: torch.Tensor, what: str) -> None:
        self.buf = Buf(tensor, what)
        self.comm_dtype = reduce_dtype(tensor.dtype)
        flat = self.buf.data.reshape(-1)
        self.wide = flat.to(self.comm_dtype) if self.comm_dtype != tensor.dtype else flat

    def array(self) -> np.ndarray:
        return self.wide.numpy()

    def done(self) -> None:
        if self.wide.dtype != self.buf.data.dtype:
            self.buf.data.reshape(-1).copy_(self.wide)
        self.buf.done()


class Keep:
    """Keeps a p2p buffer alive until its request completes, then runs ``then`` (if any)."""

    def __init__(self, data: Any, then: Optional[Callable[[], None]] = None) -> None:
        self.data = data
        self.then = then

    def finish(self, status: Any) -> None:
        if self.then is not None:
            self.then()


def mpi_op(opts: Any, dtype: torch.dtype) -> tuple[Any, bool]:
    """(MPI op, divide-by-size afterwards) for ``opts.reduceOp`` on ``dtype``."""
    MPI = mpi_module()
    rop = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    code = getattr(rop, "op", rop)
    is_bool = dtype == torch.bool
    table = {
        _RED.SUM: MPI.LOR if is_bool else MPI.SUM,
        _RED.PRODUCT: MPI.LAND if is_bool else MPI.PROD,
        _RED.MIN: MPI.LAND if is_bool else MPI.MIN,
        _RED.MAX: MPI.LOR if is_bool else MPI.MAX,
        _RED.BAND: MPI.LAND if is_bool else MPI.BAND,
        _RED.BOR: MPI.LOR if is_bool else MPI.BOR,
        _RED.BXOR: MPI.LXOR if is_bool else MPI.BXOR,
    }
    if code in table:
        return table[code], False
    if code == _RED.AVG:
        if not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"the mpi4py process group: ReduceOp.AVG needs a floating tensor, got {dtype}")
        return MPI.SUM, True
    raise ValueError(f"the mpi4py process group does not support reduce op {rop!r} (PREMUL_SUM included)")


def counts(tensors: Sequence[torch.Tensor]) -> tuple[list[int], list[int]]:
    counts = [nbytes(t) for t in tensors]
    displs = [0] * len(counts)
    for i in range(1, len(counts)):
        displs[i] = displs[i - 1] + counts[i - 1]
    return counts, displs


def unpack(flat: np.ndarray, outs: Sequence[torch.Tensor], displs: Sequence[int]) -> None:
    src = torch.from_numpy(flat)
    with torch.no_grad():
        for out, off in zip(outs, displs):
            n = nbytes(out)
            if n == 0:
                continue
            chunk = src[off : off + n]
            if out.dtype != torch.uint8:
                chunk = chunk.view(out.dtype)
            out.copy_(chunk.reshape(out.shape))


def pack(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    parts = [Buf(t, "input").bytes() for t in tensors]
    return np.concatenate(parts) if parts else np.empty(0, np.uint8)
