"""A ``cuda`` device that is not NVIDIA's: identified, reported, and planned with its vendor's table.

No MUSA, Kunlunxin or T-Head device is here: each test puts in place a test-only stand-in for what
that vendor's stack makes visible (torchada's ``torch.version.musa``, an initialised device's name)
and makes the nccl driver report itself available; the identification, the driver's table and
``detect()`` are the real code.
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch

import hwdist
from hwdist import cli_env
from hwdist.drivers import impostors
from hwdist.drivers._vendor_caps import table
from hwdist.drivers.nccl import NcclDriver


def _fresh() -> NcclDriver:
    drv = NcclDriver()
    drv.name = "nccl"
    return drv


@pytest.fixture
def visible_cuda(monkeypatch):
    """The registered nccl driver reports two devices (a stand-in: this machine has none), and looks again
    for its vendor."""
    drv = hwdist.get_driver("nccl")
    monkeypatch.setattr(type(drv), "unavailable_reason", lambda self: None)
    monkeypatch.setattr(type(drv), "device_count", lambda self: 2)
    monkeypatch.setattr(drv, "_looked", False, raising=False)
    monkeypatch.setattr(drv, "_impostor", None, raising=False)
    # adopting a vendor's table replaces these on the driver: put NVIDIA's back for the tests after this one
    for attr in (
        "native_ops",
        "reduce_ops",
        "dtypes",
        "reduce_dtypes",
        "inexact_reductions",
        "_caps",
        "_plans",
    ):
        monkeypatch.setattr(drv, attr, getattr(drv, attr), raising=False)
    monkeypatch.setattr(drv, "_adopted", False, raising=False)
    monkeypatch.setenv("HWDIST_BACKEND", "nccl")
    return drv


def test_nothing_to_report_on_this_machine():
    assert impostors.identify() is None
    assert hwdist.get_driver("nccl").vendor_note() is None
    assert hwdist.detect().vendor_note is None


def test_musa_behind_torchada_plans_with_mccls_table(monkeypatch):
    monkeypatch.setattr(torch.version, "musa", "4.1.0", raising=False)  # what torch_musa sets
    found = impostors.identify()
    assert found is not None and found.table == "mccl" and "torch.version.musa" in found.evidence
    drv = _fresh()
    mccl = table("mccl")
    assert drv.caps.dtypes == mccl.dtypes and drv.caps.reduce_ops == mccl.reduce_ops
    assert drv.plan("all_gather", torch.bfloat16).view  # MCCL lacks bfloat16 where NCCL has it
    assert torch.bfloat16 in NcclDriver.dtypes  # the class keeps NVIDIA's table


@pytest.mark.parametrize(
    "name, vendor",
    [("P800 OAM", "Kunlunxin (P800)"), ("PPU-ZW810E", "T-Head (PPU, SAIL)")],
)
def test_a_vendor_without_a_table_keeps_nvidias_and_says_so(monkeypatch, name, vendor):
    monkeypatch.setattr(impostors, "_initialised_name", lambda: name)  # an initialised device's name
    found = impostors.identify()
    assert found is not None and found.vendor == vendor and found.table is None
    drv = _fresh()
    with pytest.warns(UserWarning, match="NVIDIA's table is assumed"):
        caps = drv.caps
    assert caps.dtypes == frozenset(NcclDriver.dtypes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert drv.caps is caps  # said once


def test_detect_and_env_report_the_vendor(monkeypatch, visible_cuda):
    monkeypatch.setattr(torch.version, "musa", "4.1.0", raising=False)
    found = hwdist.detect()
    assert found.backend == "nccl" and found.vendor_note and "Moore Threads" in found.vendor_note
    assert "'mccl' table" in found.vendor_note
    report = cli_env.env_report()
    assert report["detection"]["vendor_note"] == found.vendor_note
    out = io.StringIO()
    cli_env._print_env(report, out)
    assert f"vendor: {found.vendor_note}" in out.getvalue()
