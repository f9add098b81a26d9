"""Cross-rank verification: catch mismatched collectives before they hang or return garbage.

On by default (``HWDIST_VERIFY=0`` turns it off for the process,
[`set_verification`][hwdist.collectives.verify.set_verification] /
[`verification`][hwdist.collectives.verify.verification] in code, ``verify=False`` for one call): every
collective first runs the one header round carrying a fingerprint and a description of the call, so when the
ranks disagree every rank raises [`CollectiveMismatch`][hwdist.collectives.verify.CollectiveMismatch] listing
each rank's value, before any data moves. Debug mode (``HWDIST_DEBUG=1``, or ``call_sites=True``) also
compares the line of user code each rank calls from. Collectives reach the check through the hook in
``call_entry``'s slot, installed while the mode is on (docs/architecture.md, docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import os
import sys
import warnings
from typing import Any, Iterator, NamedTuple, Optional

import torch
import torch.distributed as torch_dist

from .. import _compat, _state, registry, settings
from ..errors import CollectiveMismatch
from . import call_entry, protocol
from .wire import op_field

__all__ = [
    "CollectiveMismatch", "verification", "set_verification", "verification_enabled", "describe_tensor",
    "describe_dtype", "check_call", "ENV_DEBUG",
]  # fmt: skip

ENV_DEBUG = "HWDIST_DEBUG"
ENV_VERIFY = "HWDIST_VERIFY"


def _env_flag(name: str) -> bool:
    """``settings.flag(name)``; a value that is none of its words turns the mode on, with a warning (asking
    for debugging and silently not getting it is the worse mistake)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        on = settings.flag(name)
    if caught:
        warnings.warn(
            f"{name}={os.environ.get(name, '')!r} is not one of 0/false/no/off (off) or 1/2/.../true/yes/on"
            " (on); debug mode (call-site comparison) is ON",
            stacklevel=2,
        )
    return on


def _mode_changed() -> None:
    """The switch moved: mirror it, restart the call numbers, install or remove the engine's hook."""
    global _call_sites, _generation
    enabled, _call_sites = _MODE.get()
    _generation += 1
    call_entry.set_hook(_hook if enabled else None)


def _initial() -> tuple[bool, bool]:
    """``HWDIST_VERIFY`` (on unless 0) and ``HWDIST_DEBUG`` (call sites; turns verification on too)."""
    debug = _env_flag(ENV_DEBUG)
    return (debug or settings.flag(ENV_VERIFY)), debug


#: Verification as (enabled, call_sites): ``HWDIST_VERIFY`` and ``HWDIST_DEBUG`` give the initial value.
_MODE: settings.Switch[tuple[bool, bool]] = settings.Switch(
    _initial, lambda value: (bool(value[0]), bool(value[1])), _mode_changed
)
# whether the fingerprint holds the caller's line (catches a rank that skipped one of two equal calls)
_call_sites: bool
_generation = 0  # bumped on every switch: a group's call numbers restart
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def verification_enabled() -> bool:
    """Whether verification is on in this process (it is unless turned off)."""
    return _MODE.get()[0]


def _sites(call_sites: Optional[bool]) -> bool:
    return settings.flag(ENV_DEBUG) if call_sites is None else bool(call_sites)


def set_verification(enabled: bool, *, call_sites: Optional[bool] = None) -> bool:
    """Switch verification on or off (all ranks must agree); returns the old value.

    Args:
        enabled: on or off.
        call_sites: also compare the line of user code each rank calls the collective from (None: as
            ``HWDIST_DEBUG`` says; off by default, since correct code may call one collective from different
            lines).

    Examples:
        >>> hwdist.set_verification(False)   # same on every rank: collectives skip the header round
        True
    """
    return _MODE.set((enabled, _sites(call_sites)))[0]


@contextlib.contextmanager
def verification(enabled: bool = True, *, call_sites: Optional[bool] = None) -> Iterator[None]:
    """Context manager: verification on (or off) inside the block, on every rank.

    Examples:
        >>> with hwdist.verification(call_sites=True):
        ...     hwdist.all_reduce(t)   # also compares each rank's calling line
    """
    with _MODE.override((enabled, _sites(call_sites))):
        yield


def _hook(op: str, group: Any, sample: Any, fields: dict[str, Any]) -> None:
    """The hook while the mode is on: check the described call (a rank outside the group, torch's
    ``NON_GROUP_MEMBER``, has no one to compare with: the call's own checks decide)."""
    if not torch_dist.is_initialized() or group is _compat.NON_GROUP_MEMBER:
        return
    device = sample.device if isinstance(sample, torch.Tensor) else None
    check_call(op, group, registry.resolve(group, device), **fields)


def describe_tensor(t: Any) -> str:
    """A short description such as ``float32[4, 3]@cpu`` (the type name for a non-tensor)."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    text = f"{str(t.dtype)[6:]}[{', '.join(map(str, t.shape))}]@{t.device.type}"  # [6:]: no "torch."
    return text if t.layout is torch.strided else f"{text}/{str(t.layout)[6:]}"  # a sparse value differs too


def rank_field(value: Any) -> Any:
    """A ``src``/``dst`` argument as the fingerprint shows it: an int for any integer, else its repr."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    return repr(value)


def _is_rank(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(rank_field(value), int)


def describe_dtype(t: Any) -> str:
    """``float32@cpu`` for a tensor (shape left out), the type name otherwise."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{str(t.dtype)[6:]}@{t.device.type}"


def _call_site() -> str:
    """``file.py:LINE`` of the first caller outside hwdist (the user's call of the collective)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _next_seq(group: Any) -> int:
    """This group's next call number from 1, as the flight recorder counts (restarts with the mode)."""
    state = _state.of(group if group is not None else torch_dist.GroupMember.WORLD)
    gen, seq = state.verify_seq or (-1, 0)
    if gen != _generation:
        seq = 0
    state.verify_seq = (_generation, seq + 1)
    return seq + 1


def check_call(op: str, group: Any, driver: Any, /, **fields: Any) -> None:
    """Verify that every rank of ``group`` makes the same call; no-op when off.

    The collectives reach it through the engine's hook, installed only while verification is on. Every rank of
    the group must reach this call (it is itself a collective: the header round, one all_gather of one header
    per rank).

    Args:
        op: the collective's name.
        group: the process group (None: default).
        driver: the group's driver (decides the device the header travels on).
        **fields: what must agree across ranks (JSON-able values; dicts and lists are compared item by item in
            the error message).

    Raises:
        CollectiveMismatch: on every rank, listing each rank's differing values.
    """
    st = stamp(op, group, fields)
    if st is None or torch_dist.get_world_size(group) == 1 or not _carries_headers(driver):
        return
    rows = protocol.exchange_rows(call_header(op, st), group, driver)
    if protocol.rows_agree(rows):  # the common case: no header is decoded
        return
    raise_if_mismatch(op, protocol.parse_rows(rows), st, group, driver)


_HEADERLESS: dict[Any, bool] = {}  # driver -> whether it can carry the header round's bytes


def _carries_headers(driver: Any) -> bool:
    """Whether ``driver`` moves bytes for an all_gather (some integer dtype as it is). A backend that moves
    none (a float-only library) cannot carry the header round: its tensor collectives go unverified, with
    one warning per backend, rather than failing."""
    known = _HEADERLESS.get(driver)
    if known is None:
        known = _HEADERLESS[driver] = protocol.carries(driver, "all_gather")
        if not known:
            warnings.warn(
                f"hwdist: backend '{driver.name}' moves no integer dtype, so its collectives cannot be"
                " verified across ranks (the header round travels as bytes); they run unverified."
                " HINT: add one integer dtype (e.g. torch.int32) to the driver's dtypes",
                RuntimeWarning,
                stacklevel=4,
            )
    return known


class Stamp(NamedTuple):
    """What a verified call adds to its header: its call number, fingerprint, call site and description."""

    seq: int
    fingerprint: int
    site: int
    text: str


def stamp(op: str, group: Any, fields: dict[str, Any]) -> Optional[Stamp]:
    """The [`Stamp`][hwdist.collectives.verify.Stamp] of this call while verification is on (it takes the
    group's next call number), else None.

    An op that runs a header round of its own (an uneven gather, an object collective's records) puts it in
    that header (``protocol.stamp``) and calls
    [`raise_if_mismatch`][hwdist.collectives.verify.raise_if_mismatch] on what it received: verification then
    costs it no collective of its own.
    """
    if not call_entry.verifying() or _compat.is_compiling():
        return None  # (while torch.compile traces, the header's bytes would be traced, not exchanged)
    seq = _next_seq(group)
    if _call_sites:
        site_text = _call_site()
        text = json.dumps({**fields, "op": op, "call site": site_text}, sort_keys=True, default=str)
        return Stamp(seq, protocol.digest(text), protocol.digest(site_text), text)
    items = tuple(fields.items())
    try:
        text, fingerprint = _described(op, items)
    except TypeError:  # a field value that is not hashable (a dict's keys): described afresh
        text, fingerprint = _described.__wrapped__(op, items)
    return Stamp(seq, fingerprint, 0, text)


@functools.lru_cache(maxsize=512)
def _described(op: str, items: tuple[tuple[str, Any], ...]) -> tuple[str, int]:
    """A call's description and its fingerprint (the same fields give the same text: computed once)."""
    text = json.dumps({**dict(items), "op": op}, sort_keys=True, default=str)
    return text, protocol.digest(text)


def call_header(op: str, st: Stamp, **words: Any) -> protocol.Header:
    """The header of a verified call with no payload: the stamp, the description inline, ``words``."""
    return protocol.Header(
        op=protocol.op_code(op), seq=st.seq, fingerprint=st.fingerprint, site=st.site,
        inline=st.text.encode(), flags=protocol.DESCRIBED, **words,
    )  # fmt: skip


def agrees(headers: list[protocol.Header]) -> bool:
    """Whether every rank's header fingerprints the same call."""
    first = headers[0]
    return all(
        h.framed and h.fingerprint == first.fingerprint and h.op == first.op and h.seq == first.seq
        for h in headers
    )


def raise_if_mismatch(op: str, headers: list[protocol.Header], own: Stamp, group: Any, driver: Any) -> None:
    """Raise [`CollectiveMismatch`][hwdist.errors.CollectiveMismatch] on every rank unless every rank's
    header (from one header round) fingerprints the same call as ``own``, this rank's stamp. The
    descriptions come from the headers where each carries its own whole, else from one more exchange."""
    if agrees(headers):
        return
    if not all(h.framed for h in headers):
        sides = (f"rank {h.rank}: {'this call' if h.framed else 'another kind of exchange'}" for h in headers)
        raise CollectiveMismatch(f"collective mismatch in '{op}' across ranks: " + "; ".join(sides))
    whole = all(h.flags & protocol.DESCRIBED and not h.flags & protocol.INLINE_CUT for h in headers)
    if whole:
        texts = [h.message for h in headers]
    else:
        texts = [t.decode() for t in protocol.gather_bytes(own.text.encode(), group, driver)]
    everyone = []
    for h, t in zip(headers, texts):
        try:
            desc = json.loads(t)
        except ValueError:
            desc = {"op": protocol.op_name(h.op)}
        desc["seq"] = h.seq  # the call number travels in its own word
        everyone.append(desc)
    raise CollectiveMismatch(_format_mismatch(op, everyone))


_MISSING = "(missing)"
_MAX_LINES = 8


def _format_mismatch(op: str, everyone: list[dict[str, Any]]) -> str:
    ops = [d.get("op") for d in everyone]
    seqs = [d.get("seq") for d in everyone]
    keys = sorted({k for d in everyone for k in d} - {"seq"})
    parts: list[str] = []
    for k in keys:
        values = [d.get(k, _MISSING) for d in everyone]
        if all(v == values[0] for v in values):
            continue
        if k != "op" and any(o != ops[0] for o in ops):
            continue  # different collectives: their arguments differ anyway
        parts.extend(_diff(k, values))
    if any(s != seqs[0] for s in seqs):
        parts.append("call number: " + "; ".join(f"rank {r}: {s}" for r, s in enumerate(seqs)))
    if len(parts) > _MAX_LINES:
        parts = parts[:_MAX_LINES] + [f"... and {len(parts) - _MAX_LINES} more differences"]
    lines = "\n  ".join(parts) if parts else "(descriptions differ)"
    hint = ""
    if all(p.startswith("call site") for p in parts):
        hint = (
            "\nHINT: a rank skipped one of several equal calls (its data met another call's data), or ranks"
            " call this collective from different lines on purpose: call sites are compared only in debug"
            " mode (HWDIST_DEBUG=1, or call_sites=True); turn it off for such a program"
        )
    return (
        f"collective mismatch in '{op}' (call #{seqs[0]} on this group) across ranks"
        f" (verification):\n  {lines}{hint}"
    )


def _diff(name: str, values: list[Any]) -> list[str]:
    """Lines naming each rank's value of ``name``; dicts and equal-length lists item by item."""
    if all(isinstance(v, dict) for v in values):
        subs: Any = sorted({s for v in values for s in v})
        rows = [[v.get(s, _MISSING) for v in values] for s in subs]
    elif all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
        subs = range(len(values[0]))
        rows = [[v[i] for v in values] for i in subs]
    else:
        return [_line(name, values)]
    return [_line(f"{name}[{s}]", items) for s, items in zip(subs, rows) if any(x != items[0] for x in items)]


def _line(name: str, values: list[Any]) -> str:
    return f"{name}: " + "; ".join(f"rank {r}: {_show(v)}" for r, v in enumerate(values))


def _show(value: Any) -> str:
    if isinstance(value, list):
        text = ", ".join(map(str, value)) if value else "[]"
        return text if len(text) <= 200 else text[:200] + f"... ({len(value)} items)"
    return str(value)


_mode_changed()  # the initial value (HWDIST_VERIFY, HWDIST_DEBUG): mirrors and the engine's hook
call_entry.set_verifier(_hook)  # what verify=True calls while the mode is off


# ---------------------------------------------------------------------------
# what verification mode compares for each tensor collective
# ---------------------------------------------------------------------------
#: ``(group, sample, fields)``; fields None: the op verifies the call in its own header round
Fields = tuple[Any, Any, Optional[dict[str, Any]]]


def _describe_many(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [describe_tensor(t) for t in value]
    return describe_tensor(value)


class TensorFields:
    """What verification mode compares for each tensor collective: one describer per op.

    Each takes the collective's own arguments and returns ``(group, sample, fields)``: a tensor of the call
    picks the driver; ``fields`` is what every rank must agree on. They run before the argument checks, so a
    rank with bad arguments still takes part and every rank raises. Point-to-point calls are not described
    (one partner, not the group).
    """

    @staticmethod
    def all_reduce(
        data: Any, op: Any = "sum", group: Optional[Any] = None, *, async_op: bool = False
    ) -> Fields:
        return group, data, {"data": describe_tensor(data), "reduce_op": op_field(op)}

    @staticmethod
    def reduce(
        data: Any, dst: Any = 0, op: Any = "sum", group: Optional[Any] = None, *, async_op: bool = False
    ) -> Fields:
        return group, data, {"data": describe_tensor(data), "reduce_op": op_field(op), "dst": rank_field(dst)}

    @staticmethod
    def broadcast(data: Any, src: Any = 0, group: Optional[Any] = None, *, async_op: bool = False) -> Fields:
        return group, data, {"data": describe_tensor(data), "src": rank_field(src)}

    @staticmethod
    def all_gather(
        data: Any, group: Optional[Any] = None, *, same_shape: bool = False, async_op: bool = False
    ) -> Fields:
        if not same_shape and isinstance(data, torch.Tensor):  # verified in the gather's own header round
            return group, data, None
        desc = describe_tensor(data) if same_shape else describe_dtype(data)
        return group, data, {"data": desc, "same_shape": bool(same_shape)}

    @staticmethod
    def gather(
        data: Any,
        dst: Any = 0,
        group: Optional[Any] = None,
        *,
        same_shape: bool = False,
        async_op: bool = False,
    ) -> Fields:
        if not same_shape and isinstance(data, torch.Tensor) and _is_rank(dst):  # in the gather's own round
            return group, data, None
        desc = describe_tensor(data) if same_shape else describe_dtype(data)
        return group, data, {"data": desc, "same_shape": bool(same_shape), "dst": rank_field(dst)}

    @staticmethod
    def pad_to_largest_tensor(tensor: Any, group: Optional[Any] = None) -> Fields:
        return group, tensor, {"tensor": describe_dtype(tensor)}

    @staticmethod
    def scatter(
        data: Any,
        scatter_list: Any = None,
        src: Any = 0,
        group: Optional[Any] = None,
        *,
        async_op: bool = False,
    ) -> Fields:
        return group, data, {"data": describe_tensor(data), "src": rank_field(src)}

    @staticmethod
    def reduce_scatter(
        output: Any, input_list: Any, op: Any = "sum", group: Optional[Any] = None, *, async_op: bool = False
    ) -> Fields:
        fields = {
            "output": describe_tensor(output),
            "input": _describe_many(input_list),
            "reduce_op": op_field(op),
        }
        return group, output, fields

    @staticmethod
    def all_to_all(
        output_list: Any,
        input_list: Any,
        group: Optional[Any] = None,
        *,
        async_op: bool = False,
        check: bool = False,
    ) -> Fields:
        # piece sizes may differ by design: dtype and count here, sizes in the strategy's header round
        # (_strategies.AllToAll), which verifies well-formed calls itself (``check``: the fields it stamps)
        first = input_list[0] if isinstance(input_list, (list, tuple)) and input_list else input_list
        pieces = [
            len(x) if isinstance(x, (list, tuple)) else type(x).__name__ for x in (input_list, output_list)
        ]
        fields = {"input": describe_dtype(first), "pieces": pieces}
        if check:
            return group, first, fields
        # well-formed (as many tensors as ranks, one dtype): the strategy's own header round verifies it
        ws = torch_dist.get_world_size(group) if torch_dist.is_initialized() else 1
        dtype = getattr(first, "dtype", None)
        well_formed = all(
            isinstance(x, (list, tuple)) and len(x) == ws
            and all(isinstance(t, torch.Tensor) and t.dtype == dtype for t in x)
            for x in (input_list, output_list)
        )  # fmt: skip
        return group, first, None if well_formed else fields

    @staticmethod
    def barrier(group: Optional[Any] = None) -> Fields:
        return group, None, {}
