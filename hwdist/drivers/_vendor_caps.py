"""Where the accelerator drivers' capability tables come from: data only, no vendor import.

Every dtype, reduce op and native op that the ``hccl``, ``gaudi``, ``cncl``, ``mccl`` and ``xccl``
drivers declare is a [`Fact`][hwdist.drivers._vendor_caps.Fact] here that names the vendor source it was read
from, and so is every one they deliberately leave out. The drivers build their tables from this module
([`table`][hwdist.drivers._vendor_caps.table]), so a table and its sources cannot drift apart;
``docs/hardware.md`` shows the same facts (a test keeps it in sync).

Where vendor releases differ, a driver declares only what holds on every release read (the
others are emulated, widened or moved as bytes, all exact), and the fact's note says what
differs. A fact with no source is marked "from documentation only". Every table here was read, none
was measured on its hardware by this project (``hwdist check --backend NAME --measure`` measures one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch

from .base import ALL_OPS

__all__ = ["Source", "Fact", "Caps", "SOURCES", "FACTS", "KINDS", "table"]

#: What a fact is about: dtypes the library moves, dtypes its reductions accept, reduce ops,
#: and the collective ops its process group implements.
KINDS = ("dtype", "reduce_dtype", "reduce_op", "native_op")


@dataclass(frozen=True)
class Source:
    """A vendor file that was read, and which release or revision of it."""

    where: str  # repository, or the wheel it ships in
    path: str
    release: str
    what: str  # what in the file the facts come from


@dataclass(frozen=True)
class Fact:
    """One capability of one backend: declared or not, and why."""

    kind: str
    name: str
    declared: bool
    sources: tuple[str, ...]  # keys of SOURCES; () means from documentation only
    note: str = ""


_WHEEL = "torch-npu 2.14.0 wheel (PyPI)"
# Intel Gaudi's PyTorch bridge (the habana_frameworks package) is not on PyPI: its source on GitHub was read.
_GAUDI = "HabanaAI/gaudi-pytorch-bridge (habana_frameworks; GitHub, not on PyPI)"

SOURCES: Mapping[str, Source] = {
    "npu-types": Source(
        _WHEEL,
        "torch_npu/include/third_party/hccl/inc/hccl/hccl_types.h",
        "torch-npu 2.14.0",
        "the HcclDataType and HcclReduceOp enums",
    ),
    "npu-header": Source(
        _WHEEL,
        "torch_npu/include/torch_npu/csrc/distributed/ProcessGroupHCCL.hpp",
        "torch-npu 2.14.0",
        "the c10d ops ProcessGroupHCCL overrides; HCCL_BACKEND_NAME",
    ),
    "npu-gather": Source(
        _WHEEL,
        "torch_npu/distributed/distributed_c10d.py (_gather) and _init/patches/distributed_patches.py",
        "torch-npu 2.14.0",
        "torch.distributed.gather is replaced; by default it runs all_gather",
    ),
    "npu-map": Source(
        "Ascend/pytorch",
        "torch_npu/csrc/distributed/HCCLUtils.cpp",
        "commit 00f1d60 (older revisions: the same map in ProcessGroupHCCL.cpp)",
        "kScalarTypeToHcclDataType (torch dtype to HCCL dtype)",
    ),
    "npu-pg": Source(
        "Ascend/pytorch",
        "torch_npu/csrc/distributed/ProcessGroupHCCL.cpp",
        "commit 0017cdf and older revisions",
        "checkSupportedDataType (dtypes of all_reduce/reduce), hcclOp and unsupportedOp, gather/scatter"
        " bodies",
    ),
    "hpu-utils": Source(
        _GAUDI,
        "backend/helpers/collective_utils.cpp",
        "commit 0982a0f (read, not run)",
        "hcclDataType (torch dtype to HCCL type), hcclOp (reduce ops), getCountDatatype (data moves as"
        " float32 or bfloat16 words of the same bytes)",
    ),
    "hpu-pg": Source(
        _GAUDI,
        "python_packages/habana_frameworks/torch/distributed/hccl/process_group_hccl_base.cpp",
        "commit 0e41ee7 (read, not run)",
        "allreduce/reduce convert dtypes other than bfloat16 and float32 to float32 and back; gather and"
        " scatter as send/recv loops; alltoall, alltoall_base, reduce_scatter bodies",
    ),
    "hpu-header": Source(
        _GAUDI,
        "python_packages/habana_frameworks/torch/distributed/hccl/process_group_hccl_base.hpp and"
        " process_group_eager_hccl.hpp",
        "commits 0fb7a5f, 0fec5b9 (read, not run)",
        "the c10d ops ProcessGroupHcclBase and ProcessGroupEagerHCCL (barrier) override; getBackendName"
        " 'hccl'",
    ),
    "hpu-register": Source(
        _GAUDI,
        "python_packages/habana_frameworks/torch/distributed/hccl/__init__.py",
        "commit 5a56187 (read, not run)",
        "Backend.register_backend('hccl', ..., devices=['hpu'], extended_api=True): the torch name and"
        " device",
    ),
    "hpu-hccl-doc": Source(
        "Intel Gaudi documentation (docs.habana.ai), documentation only",
        "API_Reference_Guides/HCCL_APIs/C_API.html",
        "latest (1.2x) and v1.11 pages",
        "hcclDataType_t (float32, bfloat16, float16, int32, uint32) and hcclRedOp_t (sum, min, max;"
        " hcclProd and hcclAvg not supported); the primitives list",
    ),
    "hpu-matrix-doc": Source(
        "Intel Gaudi documentation (docs.habana.ai), documentation only",
        "PyTorch/Reference/PyTorch_Support_Matrix.html",
        "latest",
        "data types on HPU: no float64, no complex",
    ),
    "mlu-pg": Source(
        "Cambricon/torch_mlu",
        "torch_mlu/csrc/framework/distributed/process_group_cncl.cpp",
        "commit 036a1a7 and older revisions",
        "cncl_data_type, cncl_op, getCnclReduceOp, gather/scatter bodies",
    ),
    "mlu-header": Source(
        "Cambricon/torch_mlu",
        "torch_mlu/csrc/framework/distributed/process_group_cncl.hpp",
        "commit 036a1a7",
        "the c10d ops ProcessGroupCNCL overrides",
    ),
    "musa-pg": Source(
        "MooreThreads/torch_musa",
        "torch_musa/csrc/distributed/ProcessGroupMCCL.cpp",
        "commit 101c131",
        "mcclDataType, mcclOp, gather_impl/scatter_impl",
    ),
    "musa-header": Source(
        "MooreThreads/torch_musa",
        "torch_musa/csrc/distributed/ProcessGroupMCCL.h",
        "commit 101c131",
        "the c10d ops ProcessGroupMCCL overrides",
    ),
    "xpu-pg": Source(
        "intel/torch-xpu-ops (built into torch's XPU wheels)",
        "src/xccl/ProcessGroupXCCL.cpp",
        "commit 0029c2c",
        "xcclDatatypes, xcclOps and XCCL_HAS_AVG (oneCCL >= 2021.15), the op bodies",
    ),
    "xpu-draft": Source(
        "pytorch/pytorch",
        "torch/csrc/distributed/c10d/ProcessGroupXCCL.cpp",
        "commit 31eeee9 (pre-release draft)",
        "xcclDatatypes, xcclOps",
    ),
}


def _facts(
    kind: str, names: str, declared: bool, sources: tuple[str, ...], note: str = ""
) -> tuple[Fact, ...]:
    return tuple(Fact(kind, name, declared, sources, note) for name in names.split())


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
            ("npu-pg", "npu-types"),
            "HCCL_DATA_TYPE_FP64 exists, but all_reduce/reduce refuse it",
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
            " hwdist cannot see); the HPU has no float64: hwdist moves them as bytes",
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
            " reduce_scatter passes them to HCCL as they are. hwdist widens float16 to float32 itself and"
            " refuses integer reductions (no lossless route)",
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
            "kDouble is sent as cnclFloat (32-bit) in every revision read: moved as bytes",
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
            "reduce_op",
            "avg",
            False,
            ("xpu-pg", "xpu-draft"),
            "native only with oneCCL >= 2021.15 (XCCL_HAS_AVG), otherwise issued as SUM; the draft refused"
            " it."
            " hwdist cannot see the oneCCL version without a device, so it sums and divides (was declared)",
        ),
        *_facts("reduce_op", "band bor bxor", False, ("xpu-pg",), "not in xcclOps"),
        *_facts("native_op", " ".join(sorted(ALL_OPS)), True, ("xpu-pg",)),
    ),
}


@dataclass(frozen=True)
class Caps:
    """A driver's capability table, built from its facts."""

    native_ops: frozenset[str]
    reduce_ops: frozenset[str]
    dtypes: frozenset[torch.dtype]
    reduce_dtypes: Optional[frozenset[torch.dtype]]


def table(backend: str) -> Caps:
    """The capability table of ``backend`` ('hccl', 'gaudi', 'cncl', 'mccl' or 'xccl') from its facts."""
    facts = FACTS[backend]

    def names(kind: str) -> frozenset[str]:
        return frozenset(f.name for f in facts if f.kind == kind and f.declared)

    reduce_dtypes = None
    if any(f.kind == "reduce_dtype" for f in facts):
        reduce_dtypes = frozenset(getattr(torch, n) for n in names("reduce_dtype"))
    return Caps(
        native_ops=names("native_op"),
        reduce_ops=names("reduce_op"),
        dtypes=frozenset(getattr(torch, n) for n in names("dtype")),
        reduce_dtypes=reduce_dtypes,
    )
