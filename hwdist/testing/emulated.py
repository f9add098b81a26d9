"""An emulated accelerator: a backend with an accelerator's limits, run on gloo.

Backend ``"emu"`` (device type ``cpu``) declares what a constrained
accelerator library might: no int64/bool/bfloat16/complex on the wire, no
native gather/scatter/reduce_scatter/all_to_all, no AVG, no bitwise
reductions, and torch's object collectives unusable. Its process group wraps
a real ``ProcessGroupGloo`` and *refuses* anything outside those limits, so a
test on ``emu`` fails loudly if hwdist ever hands the library what the driver
said it cannot take. CI uses it to exercise every cast and emulation path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .. import _compat
from ..drivers.base import ALL_OPS, Driver
from ..registry import register_backend, registered

__all__ = ["EmulatedDriver", "EmulatedProcessGroup", "EMULATED_BACKEND", "register_emulated"]

EMULATED_BACKEND = "emu"
"""Backend name of the emulated accelerator (registered by ``import hwdist.testing``)."""

_REDOP_NAMES = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
    dist.ReduceOp.AVG: "avg",
}


class EmulatedDriver(Driver):
    """Driver of the emulated accelerator (see module docstring)."""

    name = EMULATED_BACKEND
    device_type = "cpu"
    priority = -20  # never chosen by detection
    description = "emulated accelerator on gloo (hwdist.testing): accelerator limits, CPU tensors"
    native_ops = ALL_OPS - {"gather", "scatter", "reduce_scatter", "all_to_all"}
    # the flat all_gather where the gloo group it wraps has one (not on torch 2.1), as the gloo driver
    flat_ops = frozenset({"all_gather"} if _compat.GLOO_HAS_ALL_GATHER_INTO_TENSOR else set())
    reduce_ops = frozenset({"sum", "product", "min", "max"})
    dtypes = frozenset({torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32})
    native_object_collectives = False

    @staticmethod
    def process_group_factory(store: Any, rank: int, size: int, timeout: Any) -> "EmulatedProcessGroup":
        """Create the checking wrapper around a gloo process group."""
        return EmulatedProcessGroup(store, rank, size, timeout)


# torch's stubs overload these methods with their Python call forms; a Python process group implements
# the options form torch calls (and ProcessGroupGloo's stub hides its ops), which no stub matches.
_ProcessGroup: Any = dist.ProcessGroup


class EmulatedProcessGroup(_ProcessGroup):
    """A gloo process group that rejects what [`EmulatedDriver`][hwdist.testing.emulated.EmulatedDriver]
    declares unsupported.
    """

    def __init__(self, store: Any, rank: int, size: int, timeout: Any) -> None:
        super().__init__(rank, size)
        self._gloo: Any = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._caps = EmulatedDriver().caps

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return EMULATED_BACKEND

    def _check(self, op: str, tensors: Any, opts: Any = None) -> None:
        if op not in self._caps.native_ops:
            raise RuntimeError(f"emulated accelerator: op '{op}' is not supported")
        for t in _flatten(tensors):
            if not self._caps.can_move(t.dtype):
                raise RuntimeError(f"emulated accelerator: dtype {t.dtype} is not supported by '{op}'")
        rop = getattr(opts, "reduceOp", None)
        if rop is not None:
            name = _REDOP_NAMES.get(getattr(rop, "op", rop), str(rop))
            if name not in self._caps.reduce_ops:
                raise RuntimeError(f"emulated accelerator: reduce op '{name}' is not supported")

    def allreduce(self, tensors: Any, opts: Any) -> Any:
        self._check("all_reduce", tensors, opts)
        return self._gloo.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors: Any, opts: Any) -> Any:
        self._check("all_reduce", tensors, opts)
        return self._gloo.allreduce_coalesced(tensors, opts)

    def reduce(self, tensors: Any, opts: Any) -> Any:
        self._check("reduce", tensors, opts)
        return self._gloo.reduce(tensors, opts)

    def broadcast(self, tensors: Any, opts: Any) -> Any:
        self._check("broadcast", tensors)
        return self._gloo.broadcast(tensors, opts)

    def _all_gather(self, method: str, output: Any, input: Any, opts: Any) -> Any:
        """all_gather's list and flat forms; without ``opts`` gloo's own defaults apply."""
        self._check("all_gather", [output, input])
        fn = getattr(self._gloo, method)
        return fn(output, input) if opts is None else fn(output, input, opts)

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._all_gather("allgather", outputs, inputs, opts)

    def _allgather_base(self, output: Any, input: Any, opts: Any = None) -> Any:
        return self._all_gather("_allgather_base", output, input, opts)

    def gather(self, outputs: Any, inputs: Any, opts: Any) -> Any:
        self._check("gather", [outputs, inputs])
        return self._gloo.gather(outputs, inputs, opts)

    def scatter(self, outputs: Any, inputs: Any, opts: Any) -> Any:
        self._check("scatter", [outputs, inputs])
        return self._gloo.scatter(outputs, inputs, opts)

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any) -> Any:
        self._check("reduce_scatter", [outputs, inputs], opts)
        return self._gloo.reduce_scatter(outputs, inputs, opts)

    def _reduce_scatter_base(self, output: Any, input: Any, opts: Any) -> Any:
        self._check("reduce_scatter", [output, input], opts)
        return self._gloo._reduce_scatter_base(output, input, opts)

    def alltoall_base(self, output: Any, input: Any, out_splits: Any, in_splits: Any, opts: Any) -> Any:
        self._check("all_to_all", [output, input])
        return self._gloo.alltoall_base(output, input, out_splits, in_splits, opts)

    def alltoall(self, outputs: Any, inputs: Any, opts: Any) -> Any:
        self._check("all_to_all", [outputs, inputs])
        return self._gloo.alltoall(outputs, inputs, opts)

    # torch>=2.13 calls these names on a Python process group itself.
    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(
        self, output: Any, input: Any, out_splits: Any, in_splits: Any, opts: Any = None
    ) -> Any:
        return self.alltoall_base(output, input, out_splits, in_splits, opts)

    def send(self, tensors: Any, dst: int, tag: int) -> Any:
        self._check("send", tensors)
        return self._gloo.send(tensors, dst, tag)

    def recv(self, tensors: Any, src: int, tag: int) -> Any:
        self._check("recv", tensors)
        return self._gloo.recv(tensors, src, tag)

    def recv_anysource(self, tensors: Any, tag: int) -> Any:
        self._check("recv", tensors)
        return self._gloo.recv_anysource(tensors, tag)

    def barrier(self, opts: Any) -> Any:
        return self._gloo.barrier(opts)


def _flatten(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list[torch.Tensor] = []
    if isinstance(obj, (list, tuple)):
        for item in obj:
            out.extend(_flatten(item))
    return out


def register_emulated() -> Driver:
    """Register the emulated accelerator under ``'emu'`` (idempotent)."""
    existing = registered(EMULATED_BACKEND)
    if isinstance(existing, EmulatedDriver):
        return existing
    return register_backend(EMULATED_BACKEND, EmulatedDriver)
