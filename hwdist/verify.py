"""Cross-rank verification mode: catch mismatched collectives before they hang.

When on (``HWDIST_DEBUG=1`` in the environment, or :func:`verification` /
:func:`set_verification` in code), every hwdist collective first exchanges a
compact fingerprint of the call on every rank of the group: op name, call
sequence number, shapes, dtypes, devices, dict keys, object-collective role.
If the ranks disagree, every rank raises :class:`CollectiveMismatch` listing
each rank's value, e.g. ``rank 0: float32[4, 3]; rank 1: float64[4, 3]``,
instead of hanging or returning garbage.

Cost when off: one global flag test per call. Cost when on: one all_gather of
a 24-byte digest per collective, plus one more exchange of the full
descriptions only when they differ (see docs/reliability.md for figures).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from typing import Any, Iterator, Optional

import torch
import torch.distributed as torch_dist

__all__ = [
    "CollectiveMismatch",
    "verification",
    "set_verification",
    "verification_enabled",
    "describe_tensor",
    "check_call",
    "ENV_DEBUG",
]

ENV_DEBUG = "HWDIST_DEBUG"


def _env_flag(name: str) -> bool:
    # bool(os.getenv(X)) is True for "0": parse the value instead.
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


_enabled: bool = _env_flag(ENV_DEBUG)
_sequence: dict[int, int] = {}


class CollectiveMismatch(RuntimeError):
    """Ranks called a collective with different arguments (verification mode)."""


def verification_enabled() -> bool:
    """Whether verification mode is on in this process."""
    return _enabled


def set_verification(enabled: bool) -> bool:
    """Switch verification mode on or off (all ranks must agree); returns the old value."""
    global _enabled
    old, _enabled = _enabled, bool(enabled)
    _sequence.clear()
    return old


@contextlib.contextmanager
def verification(enabled: bool = True) -> Iterator[None]:
    """Context manager: verification mode on (or off) inside the block, on every rank.

    Example:
        >>> with hwdist.verification():
        ...     hwdist.all_reduce(t)   # raises on every rank if shapes differ
    """
    old = set_verification(enabled)
    try:
        yield
    finally:
        set_verification(old)


def describe_tensor(t: Any) -> str:
    """A short description such as ``float32[4, 3]@cpu``."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    dtype = str(t.dtype).replace("torch.", "")
    return f"{dtype}[{', '.join(map(str, t.shape))}]@{t.device.type}"


def check_call(op: str, group: Any, driver: Any, **fields: Any) -> None:
    """Verify that every rank of ``group`` makes the same call; no-op when off.

    Args:
        op: the collective's name.
        group: the process group (None: default).
        driver: the group's driver (decides the device the digest travels on).
        **fields: what must agree across ranks (JSON-able values).

    Raises:
        CollectiveMismatch: on every rank, listing each rank's differing values.
    """
    if not _enabled:
        return
    key = id(group)
    seq = _sequence.get(key, 0)
    _sequence[key] = seq + 1
    desc = {"op": op, "seq": seq, **fields}
    text = json.dumps(desc, sort_keys=True, default=str)
    digest = hashlib.blake2b(text.encode(), digest_size=16).digest() + struct.pack("<q", len(text))
    world = torch_dist.get_world_size(group)
    if world == 1:
        return
    device = driver.comm_device()
    mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8).to(device)
    gathered = torch.empty(world * len(digest), dtype=torch.uint8, device=device)
    _all_gather_bytes(gathered, mine, group, driver)
    rows = gathered.cpu().view(world, len(digest))
    if bool((rows == rows[0]).all()):
        return
    everyone = _exchange_descriptions(text, group, driver, world)
    raise CollectiveMismatch(_format_mismatch(op, everyone))


def _all_gather_bytes(out: torch.Tensor, inp: torch.Tensor, group: Any, driver: Any) -> None:
    plan = driver.plan("all_gather", torch.uint8)
    if plan.cast:
        out_v, in_v = out.view(plan.comm_dtype), inp.view(plan.comm_dtype)
    else:
        out_v, in_v = out, inp
    chunks = list(out_v.chunk(torch_dist.get_world_size(group)))
    torch_dist.all_gather(chunks, in_v, group=group)


def _exchange_descriptions(text: str, group: Any, driver: Any, world: int) -> list[dict[str, Any]]:
    data = text.encode()
    # Pad to a multiple of 4 so any byte-view dtype fits; sizes first (as bytes too).
    size = struct.pack("<q", len(data))
    sizes = torch.empty(world * 8, dtype=torch.uint8, device=driver.comm_device())
    _all_gather_bytes(sizes, torch.frombuffer(bytearray(size), dtype=torch.uint8).to(sizes.device), group, driver)
    lengths = [struct.unpack("<q", bytes(sizes[i * 8:(i + 1) * 8].cpu().tolist()))[0] for i in range(world)]
    width = (max(lengths) + 7) // 8 * 8
    padded = bytearray(data) + bytearray(width - len(data))
    buf = torch.empty(world * width, dtype=torch.uint8, device=sizes.device)
    _all_gather_bytes(buf, torch.frombuffer(padded, dtype=torch.uint8).to(sizes.device), group, driver)
    host = buf.cpu().numpy().tobytes()
    return [json.loads(host[i * width:i * width + lengths[i]]) for i in range(world)]


def _format_mismatch(op: str, everyone: list[dict[str, Any]]) -> str:
    keys = sorted({k for d in everyone for k in d})
    parts = []
    for k in keys:
        values = [d.get(k) for d in everyone]
        if any(v != values[0] for v in values):
            parts.append(f"{k}: " + "; ".join(f"rank {r}: {_show(v)}" for r, v in enumerate(values)))
    lines = "\n  ".join(parts) if parts else "(descriptions differ)"
    return f"collective mismatch in '{op}' across ranks (verification mode):\n  {lines}"


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) if value else "[]"
    return str(value)


def seq_reset(group: Optional[Any] = None) -> None:
    """Forget call sequence numbers (all groups, or one)."""
    if group is None:
        _sequence.clear()
    else:
        _sequence.pop(id(group), None)
