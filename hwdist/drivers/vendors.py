"""The vendor accelerator drivers (HCCL on Ascend, HCCL on Gaudi, CNCL, MCCL, XCCL): one table of data.

Each driver is its row of ``VENDORS`` (device, priority, description, vendor
package, environment variables) plus its capability table, read from the
vendor's source: every entry names its source in
[`hwdist.drivers._vendor_caps`][hwdist.drivers._vendor_caps] (and docs/hardware.md).
None of them has been run on its hardware by this project. The vendor package
is imported lazily, never at ``import hwdist``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from .. import _compat
from . import _probes
from ._common import AcceleratorDriver
from ._planner import Capabilities
from ._vendor_caps import table


class Vendor(NamedTuple):
    """One vendor driver's data (besides its capability table)."""

    device_type: str
    priority: int
    description: str
    vendor_module: Optional[str]
    env_vars: tuple[str, ...]
    native_object_collectives: bool = False
    #: The name torch knows the backend by, when it is not the driver's (a name two vendors share).
    torch_backend: Optional[str] = None


#: Backend name -> its driver's data. ``priority`` orders detection: HCCL comes before CUDA because
#: torch_npu can make torch.cuda look available.
VENDORS: dict[str, Vendor] = {
    "hccl": Vendor(
        "npu", 50, "Huawei HCCL (Ascend NPUs, needs torch_npu)", "torch_npu", ("HCCL_*", "ASCEND_*")
    ),
    # Intel Gaudi's library is called HCCL too, and registers with torch as 'hccl' on device 'hpu': the same
    # torch name as Ascend's, another device. A group torch reports as 'hccl' resolves by its device type.
    "gaudi": Vendor(
        "hpu", 45, "Intel Gaudi HCCL (HPUs, needs habana_frameworks)", "habana_frameworks.torch",
        ("HABANA_VISIBLE_MODULES", "HLS_MODULE_ID", "PT_HPU_*", "HCCL_*"), torch_backend="hccl",
    ),
    "cncl": Vendor(
        "mlu", 40, "Cambricon CNCL (MLUs, needs torch_mlu)", "torch_mlu", ("CNCL_*", "MLU_VISIBLE_DEVICES")
    ),
    "mccl": Vendor(
        "musa", 35, "Moore Threads MCCL (MUSA GPUs, needs torch_musa)", "torch_musa",
        ("MCCL_*", "MUSA_VISIBLE_DEVICES"),
    ),
    # Built into torch >= 2.8 XPU builds (oneCCL): no vendor package; torch's own object collectives work.
    "xccl": Vendor(
        "xpu", 30, "Intel XCCL (XPU GPUs)", None, ("CCL_*", "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR"),
        native_object_collectives=True,
    ),
}


class VendorDriver(AcceleratorDriver):
    """A driver whose data is its row of ``VENDORS`` and its ``_vendor_caps`` table (set per subclass).

    The class declares the conservative table (what holds whatever the chip or library version);
    ``probes`` name what the driver asks at run time (``probe()``), and once a probe answers, the
    instance's table is the one its facts give for that answer (an Ascend950 reduces float64).
    """

    #: Probe name -> function returning its answer or None (see ``_probes``).
    probes: dict[str, Callable[[], Any]] = {}
    _probed: Optional[tuple[tuple[str, Any], ...]] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        row = VENDORS.get(cls.name)
        if row is None:  # a user's subclass of a vendor driver keeps what it inherits
            return
        for field, value in row._asdict().items():
            setattr(cls, field, value)
        caps = table(cls.name)
        cls.native_ops, cls.reduce_ops = caps.native_ops, caps.reduce_ops
        cls.dtypes, cls.reduce_dtypes = caps.dtypes, caps.reduce_dtypes
        cls.inexact_reductions = caps.inexact

    def probe(self) -> dict[str, Any]:
        """What the probes answer now (only the keys that answered)."""
        found = {}
        for key, fn in self.probes.items():
            value = fn()
            if value is not None:
                found[key] = value
        return found

    @property
    def caps(self) -> Capabilities:
        """The table for what the probes answered (the class's conservative table until one answers)."""
        if self.probes and type(self).name == self.name and self._probed is None:
            probed = self.probe()
            if probed:
                self._probed = tuple(sorted(probed.items()))
                found = table(self.name, probed)
                self.native_ops, self.reduce_ops = found.native_ops, found.reduce_ops
                self.dtypes, self.reduce_dtypes = found.dtypes, found.reduce_dtypes
                self.inexact_reductions = found.inexact
                self._caps = None
                self._plans = {}
        return super().caps

    def details(self) -> dict[str, Any]:
        """The vendor's runtime facts, and what the probes answered (what the table was chosen by)."""
        facts = super().details()
        probed = self.probe()
        if self.probes:
            facts["probed"] = probed or "nothing yet (the conservative table applies)"
        return facts


class HcclDriver(VendorDriver):
    """HCCL on Ascend NPUs.

    gather runs as all_gather (as torch_npu itself does), scatter as broadcast (older torch_npu
    releases lack it); reductions refuse uint8/bool/float64 (widened by hwdist). torch_npu replaces
    torch's gather_object; hwdist's portable object path is the same everywhere.
    """

    name = "hccl"
    probes = {"soc": _probes.npu_soc}


class GaudiDriver(VendorDriver):
    """HCCL on Intel Gaudi HPUs (habana_frameworks), torch backend 'hccl' on device 'hpu'.

    Its table comes from the Gaudi PyTorch bridge's source and Intel's documentation, not from a run:
    reductions only on bfloat16 and float32 (the bridge reduces other dtypes through float32), no
    product or avg, every dtype of another size moved as bytes.
    """

    name = "gaudi"


class CnclDriver(VendorDriver):
    """CNCL on Cambricon MLUs (torch_mlu)."""

    name = "cncl"


class McclDriver(VendorDriver):
    """MCCL on Moore Threads MUSA GPUs (torch_musa)."""

    name = "mccl"


class XcclDriver(VendorDriver):
    """XCCL on Intel XPU devices (oneCCL).

    No 'avg' in its reduce ops: native only with oneCCL >= 2021.15 and wrong on small tensors on Arc Pro
    B60 even then; mean is sum / n. Integer MIN/MAX are declared inexact (oneCCL returns SUM) on every
    oneCCL release not known good: reduced through an exact float, int64 refused.
    """

    name = "xccl"
    probes = {"oneccl": _probes.oneccl_version}

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        checker = _compat.is_xccl_available
        if checker is None:
            return (
                "this torch has no XCCL backend (torch.distributed.is_xccl_available appeared in torch 2.7;"
                " XPU builds of torch >= 2.8 ship XCCL)"
            )
        if not checker():
            return "torch was built without XCCL"
        return super().unavailable_reason()
