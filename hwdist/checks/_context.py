"""What a check body needs on one rank, and where it records what it found.

A body calls ``ctx.case(label, call, verify, op=..., reduce_op=...)`` once per
sub-case. ``case`` asks the group's driver whether it declares a plan for the
op on the dtype. If it does, the call must succeed and ``verify`` must find
the expected value (a ``hwdist.PlanError`` then is a failure). If it does not,
the call must raise on every rank, with ``hwdist.PlanError`` or an error that
carries the driver's reason (the declared limit, honoured).
``ctx.expect(label, got, want)`` compares by value: tensors dtype-exact,
floats within the dtype's precision, bool byte-exact.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

import hwdist

from ._data import DTYPES

__all__ = ["Context", "INJECT_ENV", "same", "describe"]

#: Environment variable that makes one check fail on purpose (tests of the
#: failure path): ``NAME`` or ``NAME:DTYPE`` corrupts the expected value,
#: ``NAME:DTYPE:raise`` raises on the last rank. Declared in ``hwdist.settings``.
INJECT_ENV = "HWDIST_CHECK_INJECT"


class Context:
    """One rank's view of one check: rank, world, device, dtype, and the findings so far.

    Args:
        dtype: the dtype name of the row (None: float32, for checks with no dtype).
        inject: ``"fail"`` corrupts the first expected value, ``"raise"`` raises on the last rank.
        placement: ``"comm"`` puts inputs on the group's communication device (what a
            user of the backend does), ``"cpu"`` keeps them on the CPU (hwdist must
            move them to the backend's device and back).
    """

    def __init__(self, dtype: Optional[str], inject: str = "", placement: str = "comm") -> None:
        if placement not in ("comm", "cpu"):
            raise ValueError(f"placement must be 'comm' or 'cpu', got {placement!r}")
        self.rank: int = hwdist.get_rank()
        self.world: int = hwdist.get_world_size()
        self.comm_device: torch.device = hwdist.get_comm_device()
        self.device = torch.device("cpu") if placement == "cpu" else self.comm_device
        self.dtype: torch.dtype = DTYPES[dtype] if dtype else torch.float32
        self.covered: list[str] = []
        self.refused: list[str] = []
        self.why: list[str] = []
        self.problems: list[str] = []
        self.values: dict[str, Any] = {}
        self._inject = inject
        if inject == "raise" and self.rank == self.world - 1:
            raise RuntimeError(f"failure injected by {INJECT_ENV}")

    def tensor(self, values: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """``values`` (a wide CPU tensor from ``hwdist.checks._data``) as ``dtype`` on this rank's device."""
        dt = dtype or self.dtype
        src = (values != 0) if dt == torch.bool else values.to(dt)
        return src.to(self.device)

    def refusal(
        self, op: str, reduce_op: Optional[str] = None, dtype: Optional[torch.dtype] = None
    ) -> Optional[str]:
        """The group's driver's reason why ``op`` cannot run on ``dtype``, or None if it declares a plan.

        The one place the checks ask the capability table (a backend's declared limits).
        """
        driver = hwdist.resolve(None, self.comm_device)
        try:
            driver.plan(op, dtype or self.dtype, reduce_op)
        except hwdist.PlanError as exc:
            return str(exc)
        return None

    def case(
        self,
        label: str,
        call: Callable[[], Any],
        verify: Callable[[Any], None],
        *,
        op: Optional[str] = None,
        reduce_op: Optional[str] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        """Run one sub-case: a refusal where the driver declares no plan, else a verified result.

        Args:
            label: the sub-case's name in the table's detail column.
            call: makes the collective call(s); its return value goes to ``verify``.
            verify: records problems through ``expect``.
            op: the op to ask the driver about; None (object collectives, results):
                a ``hwdist.PlanError`` from the call is the table's refusal.
            reduce_op: the reduce op to ask about.
            dtype: the dtype to ask about (default: the row's).
        """
        why = self.refusal(op, reduce_op, dtype) if op is not None else None
        try:
            out = call()
        except Exception as exc:
            # A refusal: the driver declared no plan and the error carries its reason, or no op
            # to ask about and a PlanError. Anything else (a refusal where the driver declared
            # a plan included) is a failure, with the rank's traceback.
            declared = why is not None and (isinstance(exc, hwdist.PlanError) or why in str(exc))
            if not (declared or (op is None and isinstance(exc, hwdist.PlanError))):
                raise
            self.refused.append(label)
            self.why.append(str(exc))
            return
        if why is not None and self.world > 1:
            self.problems.append(
                f"rank {self.rank}: {label}: the driver declares no plan ({why}) but the call returned"
            )
            return
        # (One rank with no plan: hwdist moves nothing, so there is nothing to refuse; check the result.)
        before = len(self.problems)
        verify(out)
        if len(self.problems) == before:
            self.covered.append(label)

    def expect(self, label: str, got: Any, want: Any) -> None:
        """Record a problem unless ``got`` equals ``want`` (see ``same``)."""
        if self._inject == "fail":
            self._inject = ""
            want = _corrupt(want)
        if not same(got, want):
            self.problems.append(f"rank {self.rank}: {label}: got {_short(got)}, expected {_short(want)}")


def _corrupt(want: Any) -> Any:
    if isinstance(want, torch.Tensor):
        bad = want.clone()
        flat = bad.view(-1)
        if flat.numel():
            flat[0] = ~flat[0] if bad.dtype == torch.bool else flat[0] + 1
        return bad
    if isinstance(want, list):
        return [_corrupt(want[0]), *want[1:]] if want else [None]
    if isinstance(want, dict):
        return {**want, "__injected__": True}
    return ("injected", want)


def _tolerance(dtype: torch.dtype) -> float:
    if dtype.is_complex:
        dtype = torch.float32 if dtype == torch.complex64 else torch.float64
    return 1e-2 if torch.finfo(dtype).bits <= 16 else 1e-6


def same(a: Any, b: Any) -> bool:
    """Whether ``a`` equals ``b``: tensors with the same shape and dtype, by value (floats within
    the dtype's precision, bool byte-exact), containers item by item, anything else by ``==``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        a, b = a.detach().cpu(), b.detach().cpu()
        if b.dtype == torch.bool:
            # Byte-exact: a bool holding 3 prints as True but breaks later arithmetic.
            return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        if b.is_complex():
            tol = _tolerance(b.dtype)
            return bool(torch.allclose(a.to(torch.complex128), b.to(torch.complex128), rtol=tol, atol=0.0))
        if b.is_floating_point():
            tol = _tolerance(b.dtype)
            return bool(torch.allclose(a.double(), b.double(), rtol=tol, atol=0.0, equal_nan=True))
        return torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def describe(x: Any) -> str:
    """``x`` as the detail column shows it: tensors as ``dtype[values]``, flagging non-canonical bools."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        text = f"{str(t.dtype).replace('torch.', '')}{t.tolist()}"
        if t.dtype == torch.bool and bool((t.view(torch.uint8) > 1).any()):
            text += f" (non-canonical bool bytes {t.view(torch.uint8).tolist()})"
        return text
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        inner = ", ".join(describe(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    return repr(x)


def _short(x: Any, limit: int = 160) -> str:
    text = describe(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."
