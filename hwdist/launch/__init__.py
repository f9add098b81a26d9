"""Process-group start-up: launcher resolvers and init_dist."""

from __future__ import annotations

from .core import destroy, init_backend

__all__ = ["init_backend", "destroy"]
