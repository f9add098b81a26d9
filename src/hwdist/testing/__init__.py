"""Testing distributed code: real ranks, clear failures, an emulated accelerator.

Importing this module registers the emulated accelerator backend ``'emu'``.
"""

from __future__ import annotations

from .emulated import EMULATED_BACKEND, EmulatedDriver, EmulatedProcessGroup, register_emulated
from .harness import DEFAULT_PG_TIMEOUT, DEFAULT_TIMEOUT, RankFailure, RankPool, RankSkip, run_distributed

register_emulated()

# The public face of hwdist.testing: re-lists the harness names on purpose.
__all__ = [
    "RankPool",
    "RankFailure",
    "RankSkip",
    "run_distributed",
    "DEFAULT_TIMEOUT",
    "DEFAULT_PG_TIMEOUT",
    "EMULATED_BACKEND",
    "EmulatedDriver",
    "EmulatedProcessGroup",
    "register_emulated",
]
