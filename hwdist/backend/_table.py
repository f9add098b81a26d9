"""What the ``hwdist`` backend wraps: the name and the per-device table ``register`` fills.

Kept apart from the package's ``__init__`` so that the wrapper module reads it without importing the
package that imports the wrapper.
"""

from __future__ import annotations

import threading

__all__ = ["NAME", "registered_wraps"]

NAME = "hwdist"
"""The torch backend name: ``init_process_group("cpu:hwdist")``; hwdist's own spelling ``"hwdist:<name>"``."""

LOCK = threading.Lock()
#: device type -> the hwdist driver name the wrapper wraps there (what ``register`` set last)
WRAPS: dict[str, str] = {}
#: the device types registered with torch under NAME so far
DEVICES: list[str] = []


def registered_wraps() -> dict[str, str]:
    """What groups created now wrap: ``{device type: hwdist backend name}`` ({} before ``register``)."""
    with LOCK:
        return dict(WRAPS)
