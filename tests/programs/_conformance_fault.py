"""A fault-injected driver for the conformance run's tests: gloo, but integer MIN computed as SUM.

It stands in for hardware this project has no access to: oneCCL returns integer MIN/MAX as SUM on
Intel GPUs (github.com/sgl-project/sglang/issues/31011), and no such device is here. Its process
group is a real gloo group whose allreduce, reduce and reduce_scatter turn ReduceOp.MIN into
ReduceOp.SUM on integer tensors, exactly as that library does; its driver declares gloo's table,
MIN included, as the vendor's table did. ``hwdist check --conformance --import`` of this module
must catch it, and the driver file it writes must make hwdist right again.

Importing this module registers the backend ``minsum`` with hwdist (idempotent).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import hwdist
from hwdist.drivers.gloo import GlooDriver
from hwdist.testing import EmulatedProcessGroup

BACKEND = "minsum"


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _faulty(opts: Any, tensors: Any) -> Any:
    """``opts`` as the faulty library reads them: a copy with SUM for MIN on integer tensors (never the
    caller's object, which hwdist may reuse for its next call)."""
    rop = getattr(opts, "reduceOp", None)
    if rop is None or getattr(rop, "op", rop) != dist.ReduceOp.MIN:
        return opts
    found = _tensors(tensors)
    if not found or any(t.is_floating_point() or t.is_complex() for t in found):
        return opts
    copy = type(opts)()
    for name in dir(opts):
        if not name.startswith("_"):
            try:
                setattr(copy, name, getattr(opts, name))
            except (AttributeError, TypeError):
                pass
    copy.reduceOp = dist.ReduceOp.SUM  # the fault: what the library does on integers
    return copy


class MinAsSumGroup(EmulatedProcessGroup):
    """A gloo group that computes MIN as SUM on integer tensors (every other call as gloo does)."""

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def _check(self, op: str, tensors: Any, opts: Any = None) -> None:
        return None  # gloo's own table: nothing refused on top of gloo

    def allreduce(self, tensors: Any, opts: Any) -> Any:
        return self._gloo.allreduce(tensors, _faulty(opts, tensors))

    def reduce(self, tensors: Any, opts: Any) -> Any:
        return self._gloo.reduce(tensors, _faulty(opts, tensors))

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any) -> Any:
        return self._gloo.reduce_scatter(outputs, inputs, _faulty(opts, [outputs, inputs]))

    def _reduce_scatter_base(self, output: Any, input: Any, opts: Any) -> Any:
        return self._gloo._reduce_scatter_base(output, input, _faulty(opts, [output, input]))


class MinAsSumDriver(GlooDriver):
    """gloo's table (MIN declared native on every dtype, as the faulty library's table did)."""

    description = "gloo computing integer MIN as SUM (a test-only fault injection)"
    priority = -30
    torch_backend = None

    @staticmethod
    def process_group_factory(store: Any, rank: int, size: int, timeout: Any) -> MinAsSumGroup:
        """The faulty group."""
        return MinAsSumGroup(store, rank, size, timeout)


if hwdist.registry.registered(BACKEND) is None:
    hwdist.register_backend(BACKEND, MinAsSumDriver)
