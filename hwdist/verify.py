"""Verification mode, public name: ``hwdist.verify``.

The mode lives with the collectives it checks (``hwdist.collectives.verify``:
the engine's hook compares every call's fingerprint across ranks before it
runs). This module is its public face, so ``from hwdist import verify`` and
``hwdist.verify.verification()`` keep working.
"""

from __future__ import annotations

from .collectives.verify import *  # noqa: F401,F403
from .collectives.verify import __all__  # noqa: F401
