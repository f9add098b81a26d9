"""pytest plugin: a ``dist`` fixture that runs check functions on pooled ranks.

Enable with ``pytest_plugins = ["hwdist.testing.pytest_plugin"]`` in a
conftest. In a test::

    @pytest.mark.parametrize("world_size", world_sizes())
    @pytest.mark.parametrize("backend", backends())
    def test_sum(dist, world_size, backend):
        results = dist(check_sum, world_size, backend)   # one result per rank

Pools are kept per (world size, backend) for the whole session (at most
``HWDIST_TEST_MAX_POOLS``, default 6, alive at once) and replaced after a
failure. ``HWDIST_TEST_WORLD_SIZES`` (default ``1,2,3``) and
``HWDIST_TEST_BACKENDS`` (default ``gloo,emu``) drive the matrix.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Callable, Iterator, Optional

import pytest

from .. import settings as _settings
from .harness import RankFailure, RankPool

__all__ = ["world_sizes", "backends", "one_backend", "PoolCache", "capture_error"]


def capture_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Optional[tuple[str, str]]:
    """``(exception type name, message)`` if ``fn(*args, **kwargs)`` raises, else None.

    Rank functions return it so the parent can assert that every rank raised the same error.
    """
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the caller inspects type and message
        return type(exc).__name__, str(exc)
    return None


def world_sizes() -> list[int]:
    """World sizes to test, from ``HWDIST_TEST_WORLD_SIZES`` (default 1,2,3)."""
    return _settings.integer_list("HWDIST_TEST_WORLD_SIZES", 1, 4096)


def backends() -> list[str]:
    """Backends to test, from ``HWDIST_TEST_BACKENDS`` (default gloo,emu)."""
    raw = os.environ.get("HWDIST_TEST_BACKENDS", "gloo,emu")
    return [x.strip() for x in raw.split(",") if x.strip()]


def one_backend() -> list[str]:
    """The first backend of [`backends`][hwdist.testing.pytest_plugin.backends] only (gloo by default).

    For scenarios whose behaviour does not depend on the device or the driver's table (the compat
    modules' argument handling, verification mode's protocol, the harness itself): running them on
    the emulated accelerator too would repeat the same code path.
    """
    return backends()[:1]


class PoolCache:
    """Live [`RankPool`][hwdist.testing.harness.RankPool] objects keyed by (world size, backend),
    LRU-bounded."""

    def __init__(self, max_pools: int = 4) -> None:
        self.max_pools = max_pools
        self._pools: "OrderedDict[tuple[int, Optional[str]], RankPool]" = OrderedDict()

    def get(self, world_size: int, backend: Optional[str]) -> RankPool:
        """A healthy pool for (world_size, backend), created if needed."""
        key = (world_size, backend)
        pool = self._pools.pop(key, None)
        if pool is not None and pool.broken:
            pool.close()
            pool = None
        if pool is None:
            while len(self._pools) >= self.max_pools:
                _, old = self._pools.popitem(last=False)
                old.close()
            pool = RankPool(world_size, backend)
        self._pools[key] = pool
        return pool

    # Same signature as mpi_suite's run on purpose: one test body runs under either.
    def run(
        self,
        fn: Callable[..., Any],
        world_size: int = 2,
        backend: Optional[str] = "gloo",
        *args: Any,
        **kwargs: Any,
    ) -> list[Any]:
        """Run ``fn`` on a pooled (world_size, backend) group; results by rank."""
        return self.get(world_size, backend).run(fn, *args, **kwargs)

    def close(self) -> None:
        """Stop every pool."""
        while self._pools:
            _, pool = self._pools.popitem()
            pool.close()


_COMBOS = [(ws, be) for be in backends() for ws in world_sizes()]


@pytest.fixture(scope="session", params=_COMBOS, ids=[f"{ws}-{be}" for ws, be in _COMBOS])
def combo(request: Any) -> tuple[int, str]:
    """``(world_size, backend)`` over the test matrix; session scope, so pytest runs the
    tests of one combination together and each pool is spawned once."""
    return request.param


@pytest.fixture(scope="session")
def rank_pools() -> Iterator[PoolCache]:
    """The session's pool cache."""
    cache = PoolCache(_settings.bounded("HWDIST_TEST_MAX_POOLS", 1, 1000, integer=True, what="rank pools"))
    yield cache
    cache.close()


@pytest.fixture
def dist(rank_pools: PoolCache) -> Callable[..., list[Any]]:
    """``dist(fn, world_size=2, backend='gloo', *args, **kwargs)`` -> results by rank."""
    return rank_pools.run


__all__ += ["RankFailure"]
