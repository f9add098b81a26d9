"""The agreement primitive: every rank raises the same error together, or none does.

A collective that checks its arguments on each rank alone would let one rank
raise while the others wait forever in the collective it skipped.
[`agree`][hwdist.collectives.consensus.agree] runs on every rank before the real
work: one header round ([`protocol`][hwdist.collectives.protocol]) carrying

- whether this rank's arguments were invalid, and its message (inline),
- a few integers every rank must hold the same (fingerprints of shapes, dtypes,
  keys, configuration),
- a flag whose maximum over the ranks the caller wants (e.g. "someone needs the
  slow path").

When some rank's arguments were invalid, every rank knows it, and why, from that
one exchange: every rank raises an error naming the rank and what was wrong
there. The rank whose input was bad raises its own exception.

[`check_same_dicts`][hwdist.collectives.consensus.check_same_dicts] is that
agreement for a dict of tensors (``average_metrics``): a fingerprint of its
keys, shapes and dtypes, and on a mismatch a message naming where the ranks'
dicts differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Optional, Sequence

import numpy as np
import torch.distributed as torch_dist

from .. import registry
from ..errors import ArgumentAssertionError, CollectiveArgumentError, PlanError
from . import protocol, transport

__all__ = ["Agreement", "agree", "Raiser", "check_same_dicts", "dict_fingerprint", "max_over_ranks"]

#: What ``agree(raise_as=...)`` calls on every rank on the error path: ``(this rank's own problem or
#: None, {rank: (exception type name, message)} of every rank that gave one)`` -> the exception to raise.
Raiser = Callable[[Optional[BaseException], "dict[int, tuple[str, str]]"], BaseException]

_WORD = (1 << 31) - 1  # words are compared as 31-bit ints
_FAILED = 1


@dataclass(frozen=True)
class Agreement:
    """What every rank learned from one [`agree`][hwdist.collectives.consensus.agree] call.

    Attributes:
        flag: the maximum of ``flag`` over the ranks.
        same: whether every rank gave the same ``words``.
        highest: the element-wise maximum of ``words``.
        lowest: the element-wise minimum of ``words``.
    """

    flag: int
    same: bool
    highest: tuple[int, ...]
    lowest: tuple[int, ...]


def agree(
    fn: str,
    group: Any,
    *,
    problem: Optional[BaseException] = None,
    words: Sequence[int] = (),
    flag: int = 0,
    driver: Any = None,
    raise_as: Optional[Raiser] = None,
) -> Agreement:
    """Run on every rank of ``group`` before a collective: raise together, or return what all agree on.

    Args:
        fn: the public op's name (starts every message).
        group: the process group (None: the default group).
        problem: this rank's argument error, if any (raised here, on this rank, after the exchange).
        words: integers every rank should hold the same (reduced to 31 bits each; at most 100).
        flag: a small non-negative int; the result carries its maximum over the ranks.
        driver: the group's driver when the caller already has it.
        raise_as: on the error path, every rank (the ones that gave a ``problem`` too) raises
            ``raise_as(problem, failures)`` instead of the default below; for ops whose errors
            keep an older form (the same message on every rank).

    Returns:
        An [`Agreement`][hwdist.collectives.consensus.Agreement]; deciding what a difference in
        ``words`` means is the caller's job.

    Raises:
        BaseException: ``problem`` itself, on the rank that gave it.
        CollectiveArgumentError: on every other rank when some rank gave a ``problem``
            (a ``TypeError`` and a ``ValueError``), naming that rank and its message.
    """
    driver = driver if driver is not None else registry.resolve(group)
    mine = [int(w) & _WORD for w in words]
    if problem is not None:
        text = f"{type(problem).__name__}: {problem}".encode("utf-8", "replace")
        head = protocol.Header(status=_FAILED, op=protocol.OPS["agree"], nbytes=flag, inline=text)
    else:
        packed = np.array(mine, dtype="<i8").view(np.uint8)
        head = protocol.Header(op=protocol.OPS["agree"], nbytes=int(flag), nchunks=len(mine), inline=packed)
    headers = protocol.exchange(head, group, driver)
    failed = {h.rank: h.message.partition(": ") for h in headers if h.status != protocol.OK or not h.framed}
    if failed:
        _raise(fn, group, problem, {r: (kind, msg) for r, (kind, _, msg) in failed.items()}, raise_as)
    rows = [h.inline.copy().view("<i8").tolist() if h.inline is not None else [] for h in headers]
    if len({len(r) for r in rows}) > 1:  # another agreement on some rank: nothing in common to compare
        hi: tuple[int, ...] = (1,) * len(mine)
        lo: tuple[int, ...] = (0,) * len(mine)
    else:
        hi = tuple(max(col) for col in zip(*rows))
        lo = tuple(min(col) for col in zip(*rows))
    return Agreement(flag=max(h.nbytes for h in headers), same=hi == lo, highest=hi, lowest=lo)


def _raise(
    fn: str,
    group: Any,
    problem: Optional[BaseException],
    failures: dict[int, tuple[str, str]],
    raise_as: Optional[Raiser],
) -> NoReturn:
    """The error path of [`agree`][hwdist.collectives.consensus.agree]: every rank raises, naming the
    ranks that gave a problem (``failures``: rank -> (exception type name, message))."""
    if raise_as is not None:
        raise raise_as(problem, failures)
    if problem is not None:
        raise problem
    first = min(failures)
    kind, msg = failures[first]
    raise CollectiveArgumentError(
        f"{fn}: rank {first} was given invalid arguments ({kind}: {msg});"
        f" rank {torch_dist.get_rank(group)} raises too so that no rank waits forever",
        {r: f"{k}: {m}" for r, (k, m) in failures.items()},
    )


def max_over_ranks(values: Sequence[int], group: Any, driver: Any = None) -> list[int]:
    """The element-wise maximum over the ranks of 31-bit non-negative ints (one header round)."""
    return list(agree("max", group, words=values, driver=driver).highest)


# ---------------------------------------------------------------------------
# every rank holds the same dict (keys, shapes, dtypes): all_reduce_dict, average_metrics
# ---------------------------------------------------------------------------
def describe_dict(keys: Sequence[Any], values: Sequence[Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(repr of key, shape, dtype name) of each value: what the ranks compare and what errors show."""
    return [(repr(k), tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in zip(keys, values)]


def dict_fingerprint(op: Optional[str], keys: Sequence[Any], values: Sequence[Any]) -> tuple[int, int]:
    """Two 31-bit words of a hash of the keys, shapes and dtypes (and ``op``): what the ranks compare."""
    desc = describe_dict(keys, values)
    text = repr(desc if op is None else [("op", (), op), *desc])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "little") >> 1, int.from_bytes(digest[4:], "little") >> 1


def check_same_dicts(
    fn: str,
    keys: Sequence[Any],
    values: Sequence[Any],
    problem: Optional[Exception],
    group: Any,
    *,
    op: Optional[str] = None,
    driver: Any = None,
    words: Optional[tuple[int, int]] = None,
    what: str = "",
) -> None:
    """Every rank raises together unless every rank holds the same keys, shapes and dtypes (and ``op``).

    One header round (``collectives.consensus.agree``) of a fingerprint and of
    ``problem`` (this rank's bad argument, found before any communication). When some rank's
    argument was bad, every rank raises the same message (``problem``'s type where it was this
    rank's, else ValueError); when the layouts differ, the descriptions are exchanged (error path
    only) and every rank raises a ValueError naming the difference.

    Args:
        fn: the public op's name (starts every message).
        keys: the dict's keys, sorted.
        values: their tensors, in that order.
        problem: this rank's bad argument (its message without ``fn``), or None.
        group: the process group.
        op: the reduce op, when every rank must pass the same one.
        driver: the group's driver when the caller has it.
        words: the layout's fingerprint when the caller has it.
        what: what every rank must pass the same of, in the mismatch message
            (default: keys, shapes and dtypes, and op when given).
    """
    if problem is not None:
        words = (0, 0)
    elif words is None:
        words = dict_fingerprint(op, keys, values)

    def raise_as(mine: Optional[BaseException], failures: dict[int, tuple[str, str]]) -> BaseException:
        texts = [msg for _, msg in failures.values()]
        if len(failures) == torch_dist.get_world_size(group) and len(set(texts)) == 1:
            explained = texts[0]  # the same bad argument on every rank: no rank list needed
        else:
            explained = "; ".join(f"rank {r}: {msg}" for r, (_, msg) in sorted(failures.items()))
        kinds = (TypeError, ValueError, ArgumentAssertionError, PlanError)
        kind = type(mine) if mine is not None and type(mine) in kinds else ValueError
        if all(name == "PlanError" for name, _ in failures.values()):
            kind = PlanError  # no plan for a dtype: the type all_reduce raises, on every rank
        return kind(f"{fn}: {explained}")

    same = agree(fn, group, problem=problem, words=words, driver=driver, raise_as=raise_as).same
    if same:
        return
    text = repr([op, describe_dict(keys, values)])
    texts = [t.decode() for t in transport.gather_bytes(text.encode(), group, driver)]
    what = what or ("keys, shapes and dtypes" if op is None else "keys, shapes, dtypes and op")
    raise ValueError(f"{fn}: {_explain(texts)}; every rank must pass the same {what}")


def _explain(texts: list[str]) -> str:
    """Where the ranks' layouts differ from rank 0's (``texts``: each rank's ``repr([op, description])``)."""
    import ast

    parsed = [ast.literal_eval(t) for t in texts]
    ops = [op for op, _ in parsed]
    descs = [{k: (s, d) for k, s, d in desc} for _, desc in parsed]
    ref = descs[0]
    parts = []
    for r, other in enumerate(descs[1:], start=1):
        if ops[r] != ops[0]:
            parts.append(f"op is '{ops[0]}' on rank 0 but '{ops[r]}' on rank {r}")
        missing = sorted(set(ref) - set(other))
        extra = sorted(set(other) - set(ref))
        if missing:
            parts.append(f"rank {r} lacks keys {', '.join(missing)} that rank 0 has")
        if extra:
            parts.append(f"rank {r} has extra keys {', '.join(extra)}")
        for k in sorted(set(ref) & set(other)):
            if ref[k][0] != other[k][0]:
                parts.append(f"key {k} has shape {ref[k][0]} on rank 0 but {other[k][0]} on rank {r}")
            if ref[k][1] != other[k][1]:
                parts.append(f"key {k} has dtype {ref[k][1]} on rank 0 but {other[k][1]} on rank {r}")
    return "; ".join(parts) or "the ranks' dicts differ"
