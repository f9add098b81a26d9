"""Performance tuning per backend: measured thresholds, kept out of the driver interface.

A driver says what a backend *can* do (its capabilities); this table says
what is *fast* on it, for hwdist's own internal choices. Nothing here changes
a result, only which of two correct ways hwdist takes. Backends not listed use
[`DEFAULT`][hwdist.drivers.tuning.DEFAULT] (no special handling). The
measurements behind each entry are in docs/benchmarks.md.

Examples:
    >>> from hwdist.drivers.tuning import Tuning, set_tuning, tuning
    >>> set_tuning("mycl", Tuning(pack_max_bytes=1 << 20))
    >>> tuning(hwdist.get_driver("mycl")).pack_max_bytes
    1048576
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Tuning", "DEFAULT", "TUNING", "tuning", "set_tuning", "gather_by_broadcast_floor"]


@dataclass(frozen=True)
class Tuning:
    """Thresholds hwdist's internal choices read for one backend.

    Attributes:
        pack_max_bytes: tensors of at least this many bytes are reduced in place,
            not packed into a flat buffer (0: pack all) by ``all_reduce_params``
            and the gradient synchronisers.
        gather_by_broadcast_min_bytes: a tensor ``all_gather`` of at least this
            many bytes per rank moves as one broadcast per rank into one flat
            buffer instead of the backend's all_gather (0: never); sizes are
            then agreed in the header round first.
    """

    pack_max_bytes: int = 0
    gather_by_broadcast_min_bytes: int = 0


DEFAULT = Tuning()
"""What a backend without an entry gets: pack everything, never gather by broadcasts."""

# On the CPU a packing copy costs about as much as the wire, so big tensors go as they are (gloo, mpi).
# Gloo's TCP allgather has a throughput cliff between 8 and 16 MiB per rank on one host (8.1 ms at 8 MiB,
# 40.8 ms at 16 MiB, 2 ranks), where one broadcast per rank took 0.28x (2 ranks) and 0.43-0.47x (3 ranks)
# of its time; at 8 MiB and below broadcasts lose with 3 ranks (1.13-1.31x): docs/benchmarks.md.
TUNING: dict[str, Tuning] = {
    "gloo": Tuning(pack_max_bytes=1 << 20, gather_by_broadcast_min_bytes=12 << 20),
    "mpi": Tuning(pack_max_bytes=1 << 20),
}
"""Backend name -> its tuning (the measurements behind each entry: docs/benchmarks.md)."""


_FLOOR: list[int] = []  # the smallest gather_by_broadcast_min_bytes of any backend (cached)


def gather_by_broadcast_floor() -> int:
    """The smallest nonzero ``gather_by_broadcast_min_bytes`` of any backend (0: none has one).

    A cheap test for the tensor ``all_gather``'s pass-through: below it no backend takes the broadcasts.
    """
    if not _FLOOR:
        found = [t.gather_by_broadcast_min_bytes for t in TUNING.values() if t.gather_by_broadcast_min_bytes]
        _FLOOR.append(min(found) if found else 0)
    return _FLOOR[0]


def tuning(driver: Any) -> Tuning:
    """The tuning of ``driver``'s backend (by its name), else [`DEFAULT`][hwdist.drivers.tuning.DEFAULT]."""
    return TUNING.get(driver.name, DEFAULT)


def set_tuning(name: str, value: Tuning) -> Tuning:
    """Set backend ``name``'s tuning; returns the previous one (``DEFAULT`` if it had none)."""
    if not isinstance(value, Tuning):
        raise TypeError(
            f"set_tuning: value must be a hwdist.drivers.tuning.Tuning, got {type(value).__name__}"
        )
    old = TUNING.get(name.lower(), DEFAULT)
    TUNING[name.lower()] = value
    _FLOOR.clear()
    return old
