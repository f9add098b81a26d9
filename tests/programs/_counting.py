"""Counting the torch.distributed collectives hwdist issues, around torch's real functions and the process
group's flat all_gather method (nothing faked)."""

from __future__ import annotations

from typing import Any

COUNTED = ("all_gather", "all_gather_into_tensor", "gather", "broadcast", "all_reduce")


class Counter:
    """Counts the torch.distributed collectives issued, around the real functions."""

    def __init__(self) -> None:
        import torch.distributed as tdist

        from hwdist import _compat

        self.n = 0
        #: calls per path: a torch.distributed function's name, "flat wrapper" (the flat all_gather torch
        #: offers on this version) or "process group" (its method, issued without torch's wrapper)
        self.by: dict[str, int] = {}
        self.real = {name: getattr(tdist, name) for name in COUNTED if hasattr(tdist, name)}
        for name, fn in self.real.items():
            setattr(tdist, name, self._wrap(fn, name))
        # the flat all_gather torch offers on this version, picked once when hwdist is imported
        self.compat_real = _compat.all_gather_into_tensor
        if self.compat_real is not None:
            _compat.all_gather_into_tensor = self._wrap(self.compat_real, "flat wrapper")

    def _wrap(self, fn: Any, path: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.n += 1
            self.by[path] = self.by.get(path, 0) + 1
            return fn(*args, **kwargs)

        return counted

    def close(self) -> None:
        import torch.distributed as tdist

        from hwdist import _compat

        for name, fn in self.real.items():
            setattr(tdist, name, fn)
        _compat.all_gather_into_tensor = self.compat_real
