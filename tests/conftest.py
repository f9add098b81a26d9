"""The suite's configuration: the pooled-ranks plugin, and the ``unit`` and ``dist`` markers.

A test is ``dist`` when it uses a multi-rank fixture (``dist``, ``rank_pools``, ``combo`` from
``hwdist.testing.pytest_plugin``, or a module's own ``ranks`` pool) or when its module, class or
function is marked ``pytest.mark.dist`` (tests that start ranks themselves: ``run_distributed``,
``torchrun``, ``mpiexec``). A ``hardware`` test is neither. Every other test is ``unit``, so
``pytest -m unit`` and ``pytest -m dist`` split the suite in two.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest_plugins = ["hwdist.testing.pytest_plugin"]

#: Fixtures that run a test's checks on several ranks.
DIST_FIXTURES = frozenset({"dist", "rank_pools", "combo", "ranks"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if item.get_closest_marker("hardware") is not None:
            continue
        if item.get_closest_marker("dist") is None and DIST_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.dist)
        if item.get_closest_marker("dist") is None:
            item.add_marker(pytest.mark.unit)
