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

__all__ = ["Tuning", "DEFAULT", "TUNING", "tuning", "set_tuning"]


@dataclass(frozen=True)
class Tuning:
    """Thresholds hwdist's internal choices read for one backend.

    Attributes:
        pack_max_bytes: tensors of at least this many bytes are reduced in place,
            not packed into a flat buffer (0: pack all) by ``all_reduce_params``
            and the gradient synchronisers.
        reduce_by_gather_max_bytes: hwdist's own small flat reductions
            (``all_reduce_dict``, the internal transport) whose gathered size
            (bytes x ranks) is at most this go as one all_gather plus a local
            reduction (0: always all_reduce). Public ``all_reduce`` calls always
            issue torch's all_reduce.
    """

    pack_max_bytes: int = 0
    reduce_by_gather_max_bytes: int = 0


DEFAULT = Tuning()
"""What a backend without an entry gets: pack everything, always all_reduce."""

# On the CPU a packing copy costs about as much as the wire, so big tensors go as they are (gloo, mpi).
# Gloo's ring all_reduce pays 2(n-1) synchronised steps even for a few bytes and its all_gather n-1:
# measured on 2 cores, 20 floats to 16 KiB, all_gather + local sum took 0.22-0.34x the all_reduce's time
# at 2 ranks and 0.75-0.87x at 3; a 64 KiB all_gather per rank was erratic (up to 5x slower), so the
# limit stays well below it.
TUNING: dict[str, Tuning] = {
    "gloo": Tuning(pack_max_bytes=1 << 20, reduce_by_gather_max_bytes=32 << 10),
    "mpi": Tuning(pack_max_bytes=1 << 20),
}
"""Backend name -> its tuning (the measurements behind each entry: docs/benchmarks.md)."""


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
    return old
