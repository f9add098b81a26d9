"""Where the accelerator drivers' capability tables come from: data only, no vendor import.

Every dtype, reduce op and native op that the ``hccl``, ``gaudi``, ``cncl``, ``mccl`` and ``xccl``
drivers declare is a [`Fact`][hwdist.drivers._vendor_caps.Fact] here that names the vendor source it was read
from, and so is every one they deliberately leave out. The drivers build their tables from this module
([`table`][hwdist.drivers._vendor_caps.table]), so a table and its sources cannot drift apart;
``docs/hardware.md`` shows the same facts (a test keeps it in sync).

Where vendor releases differ, a driver declares only what holds on every release read (the
others are emulated, widened or moved as bytes, all exact), and the fact's note says what
differs. Where a source says support depends on more than the backend (the chip, the library
version), the fact carries a condition (``when``, a key of
[`CONDITIONS`][hwdist.drivers._vendor_caps.CONDITIONS]) checked against what the driver probes at
run time (``probe()``: torch_npu's SoC version, the oneCCL version); the unconditional fact is the
conservative row used when the probe says nothing. Pairs a library accepts but computes wrongly are
facts of kind ``inexact`` (``min:int32``): the planner routes them through an exact widening or
refuses them. A fact with no source is marked "from documentation only". Every table here was
read, none was measured on its hardware by this project (``hwdist check --backend NAME
--conformance`` checks one there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch

from ._vendor_sources import SOURCES, Source
from .base import ALL_OPS

__all__ = [
    "Source", "Fact", "Caps", "Condition", "SOURCES", "FACTS", "ENGINE_FACTS", "KINDS", "CONDITIONS",
    "ONECCL_KNOWN_GOOD", "applying", "table",
]

#: What a fact is about: dtypes the library moves, dtypes its reductions accept, reduce ops,
#: the collective ops its process group implements, and (``inexact``) ``op:dtype`` pairs it computes
#: wrongly.
KINDS = ("dtype", "reduce_dtype", "reduce_op", "native_op", "inexact")

#: oneCCL releases known to compute integer MIN/MAX right: none so far (no report of a fixed release
#: was found). A release joins this set when ``hwdist check --conformance`` passes on it.
ONECCL_KNOWN_GOOD: frozenset[str] = frozenset()


def _version(text: Any) -> tuple[int, ...]:
    """``'2021.15.3'`` (or a tuple) -> ``(2021, 15, 3)``; () when unreadable."""
    if isinstance(text, tuple):
        return tuple(int(x) for x in text if isinstance(x, int))
    parts = []
    for piece in str(text).split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


@dataclass(frozen=True)
class Condition:
    """What a conditional fact depends on: one probed key, tested."""

    key: str  # what the driver's probe() reports: 'soc' (torch_npu SocVersion number), 'oneccl'
    test: Callable[[Any], bool]
    what: str  # in words, for docs/hardware.md and ``hwdist env``

    def holds(self, probed: Optional[Mapping[str, Any]]) -> bool:
        """Whether the probe answered ``key`` and the answer passes; False when unknown (conservative)."""
        if not probed or probed.get(self.key) is None:
            return False
        try:
            return bool(self.test(probed[self.key]))
        except (TypeError, ValueError):
            return False


#: Condition name -> Condition. torch_npu's SocVersion numbers: Ascend950 = 260 (NpuVariables.h).
CONDITIONS: Mapping[str, Condition] = {
    "ascend950": Condition("soc", lambda v: int(v) >= 260, "an Ascend950-class chip (SocVersion >= 260)"),
    "oneccl>=2021.15": Condition(
        "oneccl", lambda v: _version(v) >= (2021, 15), "oneCCL 2021.15 or newer (XCCL_HAS_AVG)"
    ),
    "oneccl-known-good": Condition(
        "oneccl", lambda v: str(v) in ONECCL_KNOWN_GOOD, "a oneCCL release in ONECCL_KNOWN_GOOD"
    ),
}


@dataclass(frozen=True)
class Fact:
    """One capability of one backend: declared or not, and why."""

    kind: str
    name: str
    declared: bool
    sources: tuple[str, ...]  # keys of SOURCES; () means from documentation only
    note: str = ""
    when: str = ""  # a key of CONDITIONS: the fact holds only where the probe says so; "" always



def _facts(
    kind: str, names: str, declared: bool, sources: tuple[str, ...], note: str = "", when: str = ""
) -> tuple[Fact, ...]:
    return tuple(Fact(kind, name, declared, sources, note, when) for name in names.split())


def _pairs(ops: str, dtypes: str) -> str:
    return " ".join(f"{op}:{d}" for op in ops.split() for d in dtypes.split())


_XPU_INTS = "uint8 int8 int32 int64 bool"


_BITWISE_REFUSED = 'refused by the process group ("Cannot use ReduceOp.BAND/BOR/BXOR")'

FACTS: Mapping[str, tuple[Fact, ...]] = {
    "hccl": (
        *_facts(
            "dtype",
            "uint8 int8 int16 int32 int64 float16 bfloat16 float32 bool",
            True,
            ("npu-map", "npu-types"),
        ),
        *_facts(
            "dtype",
            "float64",
            True,
            ("npu-map", "npu-types"),
            "kDouble -> HCCL_DATA_TYPE_FP64 in every revision read (hwdist used to move it as bytes)",
        ),
        *_facts(
            "dtype",
            "complex64 complex128",
            False,
            ("npu-map",),
            "not in the map: hwdist moves complex tensors as bytes and reduces them as real",
        ),
        *_facts("reduce_dtype", "int8 int16 int32 int64 float16 bfloat16 float32", True, ("npu-pg",)),
        *_facts(
            "reduce_dtype",
            "uint8 bool",
            False,
            ("npu-pg",),
            "refused by checkSupportedDataType in current revisions; older ones cast to int32 inside"
            " allreduce/reduce. hwdist widens to int32 itself on every release",
        ),
        *_facts(
            "reduce_dtype",
            "float64",
            False,
            ("npu-pg", "npu-types", "npu-a5"),
            "HCCL_DATA_TYPE_FP64 exists, but all_reduce/reduce refuse it below Ascend950",
        ),
        *_facts(
            "reduce_dtype",
            "float64 uint64",
            True,
            ("npu-a5", "npu-soc"),
            "checkSupportedDataType adds uint64/fp64 on Ascend950 (Atlas A5); needs the SoC probe",
            when="ascend950",
        ),
        *_facts(
            "dtype",
            "uint64",
            False,
            ("npu-soc",),
            "mapped at commit 9e73e70, not in older revisions: moved as bytes (a torch >= 2.3 dtype)",
        ),
        *_facts(
            "reduce_dtype",
            "uint64",
            False,
            ("npu-a5",),
            "refused below Ascend950: hwdist has no lossless widening for uint64",
        ),
        *_facts("reduce_op", "sum product min max", True, ("npu-pg", "npu-types")),
        *_facts(
            "reduce_op",
            "avg",
            False,
            ("npu-pg", "npu-types"),
            "no HCCL_REDUCE_AVG; recent revisions issue AVG as SUM then divide, as hwdist does itself",
        ),
        *_facts("reduce_op", "band bor bxor", False, ("npu-pg",), _BITWISE_REFUSED),
        *_facts(
            "native_op",
            "all_reduce broadcast all_gather reduce reduce_scatter all_to_all send recv barrier",
            True,
            ("npu-header", "npu-pg"),
        ),
        *_facts(
            "native_op",
            "gather",
            False,
            ("npu-gather", "npu-pg"),
            'ProcessGroupHCCL::gather throws "does not support gather"; torch_npu routes'
            " torch.distributed.gather to all_gather by default: hwdist emulates with all_gather",
        ),
        *_facts(
            "native_op",
            "scatter",
            False,
            ("npu-pg",),
            'implemented in recent revisions, "does not support scatter" in older ones (release boundary'
            " not identified): hwdist emulates with broadcast on every release",
        ),
    ),
    "gaudi": (
        *_facts(
            "dtype",
            "uint8 int8 int32 float16 bfloat16 float32 bool",
            True,
            ("hpu-utils",),
            "moved as float32 or bfloat16 words of the same bytes (an odd number of bytes is padded)",
        ),
        *_facts("dtype", "int16", False, ("hpu-utils",), "not in hcclDataType: the process group refuses it"),
        *_facts(
            "dtype",
            "int64 float64",
            False,
            ("hpu-utils", "hpu-matrix-doc"),
            "moved as 4-byte values unless int64 support is on (PT_ENABLE_INT64_SUPPORT, a runtime setting"
            " hwdist cannot see); the HPU has no float64: hwdist moves them as bytes (lossless, never as"
            " 4-byte values) and refuses their reductions (float32 holds neither exactly)",
        ),
        *_facts(
            "dtype",
            "complex64 complex128",
            False,
            ("hpu-utils", "hpu-matrix-doc"),
            "not in hcclDataType, no complex on the HPU",
        ),
        *_facts("reduce_dtype", "bfloat16 float32", True, ("hpu-pg", "hpu-hccl-doc")),
        *_facts(
            "reduce_dtype",
            "uint8 int8 int32 float16 bool",
            False,
            ("hpu-pg",),
            "all_reduce and reduce convert them to float32 and back, which loses int32 values beyond 2**24;"
            " reduce_scatter passes them to HCCL as they are. hwdist widens float16 to float32 itself;"
            " MIN/MAX of bool, uint8, int8 and int16 go through float32 (it holds each value, so the order is"
            " exact); other integer reductions are refused (no lossless route)",
        ),
        *_facts("reduce_op", "sum min max", True, ("hpu-utils", "hpu-hccl-doc")),
        *_facts(
            "reduce_op",
            "product",
            False,
            ("hpu-utils", "hpu-hccl-doc"),
            "hcclOp maps PRODUCT to hcclProd, which the HCCL documentation says is not supported",
        ),
        *_facts("reduce_op", "avg", False, ("hpu-utils", "hpu-hccl-doc"), "no hcclAvg: sum then divide"),
        *_facts("reduce_op", "band bor bxor", False, ("hpu-utils",), "not in hcclOp"),
        *_facts(
            "native_op",
            "all_reduce broadcast all_gather reduce reduce_scatter all_to_all send recv barrier",
            True,
            ("hpu-header", "hpu-register"),
        ),
        *_facts(
            "native_op",
            "gather scatter",
            True,
            ("hpu-pg",),
            "implemented as loops of send/recv by the process group",
        ),
    ),
    "cncl": (
        *_facts(
            "dtype",
            "uint8 int8 int32 float16 bfloat16 float32 bool",
            True,
            ("mlu-pg",),
            "bool and bfloat16 are missing only from torch 1.x-era revisions, below hwdist's torch floor",
        ),
        *_facts(
            "dtype",
            "int16",
            False,
            ("mlu-pg",),
            "no kShort in any revision read (hwdist used to declare it): moved as bytes, reduced as int32",
        ),
        *_facts(
            "dtype",
            "int64",
            False,
            ("mlu-pg",),
            "kLong -> cnclInt64 in recent revisions, -> cnclInt32 in older ones: moved as bytes,"
            " reductions refused (no lossless cast)",
        ),
        *_facts(
            "dtype",
            "float64",
            False,
            ("mlu-pg",),
            "kDouble is sent as cnclFloat (32-bit) in every revision read: hwdist never hands it float64, it"
            " moves float64 as bytes and refuses float64 reductions (never sent as fp32)",
        ),
        *_facts("dtype", "complex64 complex128", False, ("mlu-pg",), "not in the map"),
        *_facts("reduce_op", "sum product min max", True, ("mlu-pg",)),
        *_facts(
            "reduce_op",
            "avg",
            False,
            ("mlu-pg",),
            "older revisions refuse AVG; commit 036a1a7 issues it as SUM with pre/post processing",
        ),
        *_facts("reduce_op", "band bor bxor", False, ("mlu-pg",), _BITWISE_REFUSED),
        *_facts(
            "native_op",
            "all_reduce broadcast all_gather reduce reduce_scatter all_to_all send recv barrier",
            True,
            ("mlu-header", "mlu-pg"),
        ),
        *_facts(
            "native_op",
            "gather scatter",
            False,
            ("mlu-pg",),
            'implemented at commit 036a1a7, "Not supported yet" in older revisions: hwdist emulates them',
        ),
    ),
    "mccl": (
        *_facts("dtype", "uint8 int8 int32 int64 float16 float32 float64 bool", True, ("musa-pg",)),
        *_facts(
            "dtype",
            "bfloat16",
            False,
            ("musa-pg",),
            "mapped only when torch_musa is built with MCCL_BF16_SUPPORTED: moved as bytes, reduced in"
            " float32",
        ),
        *_facts(
            "dtype",
            "int16 complex64 complex128",
            False,
            ("musa-pg",),
            "not in mcclDataType (hwdist used to declare every dtype)",
        ),
        *_facts("reduce_op", "sum product min max", True, ("musa-pg",)),
        *_facts("reduce_op", "avg", True, ("musa-pg",), "mcclAvg in mcclOp (newly declared)"),
        *_facts("reduce_op", "band bor bxor", False, ("musa-pg",), "not in mcclOp"),
        *_facts("native_op", " ".join(sorted(ALL_OPS)), True, ("musa-header", "musa-pg")),
    ),
    "xccl": (
        *_facts("dtype", "uint8 int8 int32 int64 float16 bfloat16 float32 float64 bool", True, ("xpu-pg",)),
        *_facts(
            "dtype",
            "int16",
            False,
            ("xpu-pg", "xpu-draft"),
            "only the pre-release draft in pytorch/pytorch mapped kShort (hwdist used to declare every"
            " dtype)",
        ),
        *_facts(
            "dtype",
            "complex64 complex128",
            False,
            ("xpu-pg",),
            "not in xcclDatatypes: hwdist moves complex as bytes and reduces it as real",
        ),
        *_facts("reduce_op", "sum product min max", True, ("xpu-pg", "xpu-draft")),
        *_facts(
            "inexact",
            _pairs("min max", _XPU_INTS),
            True,
            ("xpu-minmax", "xpu-b60-max"),
            "oneCCL returns integer MIN/MAX as SUM: hwdist reduces bool/uint8/int8 in float32 and int32 in"
            " float64 (exact), and refuses int64 MIN/MAX (no lossless route), on every oneCCL release not"
            " known good",
        ),
        *_facts(
            "inexact",
            _pairs("min max", _XPU_INTS),
            False,
            ("xpu-minmax",),
            "a oneCCL release that `hwdist check --conformance` found right",
            when="oneccl-known-good",
        ),
        *_facts(
            "reduce_op",
            "avg",
            False,
            ("xpu-pg", "xpu-draft"),
            "native only with oneCCL >= 2021.15 (XCCL_HAS_AVG), otherwise issued as SUM then divided by"
            " torch-xpu-ops; the draft refused it: hwdist sums and divides",
        ),
        *_facts(
            "reduce_op",
            "avg",
            False,
            ("xpu-pg", "xpu-b60-avg"),
            "native from oneCCL 2021.15, but it divides twice on small tensors on Arc Pro B60: still summed"
            " and divided by hwdist",
            when="oneccl>=2021.15",
        ),
        *_facts(
            "reduce_op",
            "premul_sum",
            False,
            ("xpu-premul",),
            "oneCCL >= 2021.17 and XeLink only; hwdist never issues PREMUL_SUM (it scales, then sums)",
        ),
        *_facts("reduce_op", "band bor bxor", False, ("xpu-pg",), "not in xcclOps"),
        *_facts("native_op", " ".join(sorted(ALL_OPS)), True, ("xpu-pg",)),
    ),
}

#: The NCCL engines of torch 2.15 (``hwdist env`` shows which one 'nccl' builds): facts about them
#: that hwdist's NCCL table relies on. The table is the same for every engine: no bitwise op.
ENGINE_FACTS: Mapping[str, tuple[Fact, ...]] = {
    "nccl": (
        *_facts(
            "reduce_op",
            "band bor bxor",
            False,
            ("nccl2-pg", "nccl2-bitwise"),
            "ProcessGroupNCCL refuses them; torchcomms (nccl2, nccl-lazy) issued them as SUM before"
            " its fix (torchcomms/pull/2082) and raises since: hwdist never issues them on any engine",
        ),
        *_facts(
            "reduce_op",
            "sum product min max avg",
            True,
            ("nccl2-pg", "nccl4py-pg"),
            "every engine of torch 2.15 (nccl, nccl-legacy, nccl2, nccl-lazy, nccl4py) maps them",
        ),
    ),
}


@dataclass(frozen=True)
class Caps:
    """A driver's capability table, built from its facts."""

    native_ops: frozenset[str]
    reduce_ops: frozenset[str]
    dtypes: frozenset[torch.dtype]
    reduce_dtypes: Optional[frozenset[torch.dtype]]
    inexact: frozenset[tuple[str, torch.dtype]] = frozenset()


def applying(backend: str, probed: Optional[Mapping[str, Any]] = None) -> list[Fact]:
    """The facts of ``backend`` that hold for ``probed`` (what its driver's probe reported): each entry's
    unconditional fact, replaced by a conditional one whose condition holds."""
    chosen: dict[tuple[str, str], Fact] = {}
    for f in FACTS[backend]:
        if not f.when:
            chosen.setdefault((f.kind, f.name), f)
    for f in FACTS[backend]:
        if f.when and CONDITIONS[f.when].holds(probed):
            chosen[(f.kind, f.name)] = f
    return list(chosen.values())


def table(backend: str, probed: Optional[Mapping[str, Any]] = None) -> Caps:
    """The capability table of ``backend`` ('hccl', 'gaudi', 'cncl', 'mccl' or 'xccl') from its facts.

    ``probed``: what the driver's ``probe()`` reported (None: nothing, the conservative table). A dtype
    this torch lacks (uint64 before torch 2.3) is left out.
    """
    facts = applying(backend, probed)

    def names(kind: str) -> list[str]:
        return [f.name for f in facts if f.kind == kind and f.declared]

    def dtypes(kind: str) -> frozenset[torch.dtype]:
        return frozenset(d for d in (getattr(torch, n, None) for n in names(kind)) if d is not None)

    reduce_dtypes = dtypes("reduce_dtype") if any(f.kind == "reduce_dtype" for f in facts) else None
    inexact = set()
    for pair in names("inexact"):
        op, _, dtype = pair.partition(":")
        found = getattr(torch, dtype, None)
        if found is not None:
            inexact.add((op, found))
    return Caps(
        native_ops=frozenset(names("native_op")),
        reduce_ops=frozenset(n for n in names("reduce_op") if n != "premul_sum"),
        dtypes=dtypes("dtype"),
        reduce_dtypes=reduce_dtypes,
        inexact=frozenset(inexact),
    )
