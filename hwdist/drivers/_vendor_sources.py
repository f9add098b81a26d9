"""The vendor files, issues and wheels the capability facts of ``_vendor_caps`` were read from.

Data only: each [`Source`][hwdist.drivers._vendor_sources.Source] names a repository or wheel, the
file (and lines) or issue, the release or revision read, and what in it the facts come from. A fact
cites sources by their key here; ``tests/drivers/test_vendors.py`` checks every source is cited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

__all__ = ["Source", "SOURCES"]


@dataclass(frozen=True)
class Source:
    """A vendor file that was read, and which release or revision of it."""

    where: str  # repository, or the wheel it ships in
    path: str
    release: str
    what: str  # what in the file the facts come from


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
    "npu-a5": Source(
        "Ascend/pytorch",
        "torch_npu/csrc/distributed/ProcessGroupHCCL.cpp, lines 168-189 (checkSupportedDataType)",
        "commit 9e73e70 (master, 2026-08-21; builds torch_npu 2.13 to 2.15)",
        "uint64 and fp64 reductions accepted only when GetSocVersion() >= SocVersion::Ascend950",
    ),
    "npu-soc": Source(
        "Ascend/pytorch",
        "torch_npu/csrc/core/npu/NpuVariables.h line 35; torch_npu/npu/_backends.py line 96; HCCLUtils.cpp"
        " lines 59-60",
        "commit 9e73e70",
        "SocVersion Ascend950 = 260; torch_npu.npu.get_soc_version() (initialises the device); UInt64 and"
        " kDouble in kScalarTypeToHcclDataType",
    ),
    "xpu-minmax": Source(
        "sgl-project/sglang",
        "github.com/sgl-project/sglang/issues/31011 and /pull/31014 (2026-07-13)",
        "torch XPU builds with oneCCL, reported 2026-07",
        "all_reduce(MIN/MAX) on integer tensors silently computes SUM on xccl; the fix all_gathers and"
        " takes torch.min locally",
    ),
    "xpu-b60-max": Source(
        "intel/torch-xpu-ops",
        "github.com/intel/torch-xpu-ops/issues/3059 (2026-03-16, closed; no fixed oneCCL release named)",
        "Arc Pro B60, torch XPU 2.10-era build",
        "all_reduce(MAX) of int64 [-1] and [0] on 2 ranks returns a wrong value",
    ),
    "xpu-b60-avg": Source(
        "intel/torch-xpu-ops",
        "github.com/intel/torch-xpu-ops/issues/3020 (2026-03-10, open)",
        "torch 2.9.0+xpu on Arc Pro B60",
        "native ReduceOp.AVG divides twice for small tensors (0-d, 1-4, 28-31, 33 elements): SUM/n/n",
    ),
    "xpu-premul": Source(
        "intel/torch-xpu-ops",
        "github.com/intel/torch-xpu-ops/pull/1948 (merged 2025-08), src/xccl/ProcessGroupXCCL.cpp",
        "oneCCL >= 2021.17 (ENABLE_XCCL_PREMUL_SUM_SUPPORT)",
        "PREMUL_SUM only for all_reduce/reduce_scatter and only over XeLink, like AVG",
    ),
    "nccl2-pg": Source(
        "torch 2.15.0 wheel (PyPI, +cu132)",
        "torch/distributed/distributed_c10d.py lines 958-1026; the torch.distributed.backends entry points",
        "torch 2.15.0",
        "'nccl' builds ProcessGroupNCCL2 (torchcomms) unless TORCH_DIST_USE_NCCL2=0; 'nccl-legacy',"
        " 'nccl2', 'nccl-lazy' and 'nccl4py' registered beside it",
    ),
    "nccl2-bitwise": Source(
        "meta-pytorch/torchcomms",
        "github.com/meta-pytorch/torchcomms/pull/2082 (2026-04-15)",
        "torchcomms before the fix; torch 2.15.0's libtorch_cuda.so carries 'Cannot use ReduceOp.BAND with"
        " NCCL'",
        "BAND/BOR/BXOR were silently issued as ncclSum by torchcomms' NCCL backends; the fix raises as"
        " ProcessGroupNCCL does",
    ),
    "nccl4py-pg": Source(
        "torch 2.15.0 wheel (PyPI, +cu132)",
        "torch/distributed/_nccl4py/backend.py lines 184-210 (_get_nccl_redop)",
        "torch 2.15.0",
        "SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM; anything else raises RuntimeError",
    ),
    "xpu-draft": Source(
        "pytorch/pytorch",
        "torch/csrc/distributed/c10d/ProcessGroupXCCL.cpp",
        "commit 31eeee9 (pre-release draft)",
        "xcclDatatypes, xcclOps",
    ),
}
