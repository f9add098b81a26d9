"""Testing distributed code: real ranks, clear failures, an emulated accelerator.

Importing this module registers the emulated accelerator backend ``'emu'``.
"""

from __future__ import annotations

from . import emulated, harness
from .emulated import *  # noqa: F401,F403
from .emulated import register_emulated
from .harness import *  # noqa: F401,F403

register_emulated()

# The public face of hwdist.testing: the harness's and the emulated accelerator's names.
__all__ = [*harness.__all__, *emulated.__all__]
