"""The agreement primitive: every rank raises the same error together, or none does.

A collective that checks its arguments on each rank alone would let one rank
raise while the others wait forever in the collective it skipped.
[`agree`][hwdist.collectives.consensus.agree] runs on every rank before the real
work: one small MAX/MIN exchange (through the transport) of

- whether this rank's arguments were invalid (and the lowest rank that was),
- a few integers every rank must hold the same (fingerprints of shapes, dtypes,
  keys, configuration),
- a flag whose maximum over the ranks the caller wants (e.g. "someone needs the
  slow path").

When some rank's arguments were invalid, every rank knows it from that one
exchange; a second, small exchange (only on that error path) carries the failing
rank's message, so every rank raises an error naming the rank and what was
wrong there. The rank whose input was bad raises its own exception.

[`check_same_dicts`][hwdist.collectives.consensus.check_same_dicts] is that
agreement for a dict of tensors (``all_reduce_dict``, ``average_metrics``): a
fingerprint of its keys, shapes and dtypes, and on a mismatch a message naming
where the ranks' dicts differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Optional, Sequence

import torch.distributed as torch_dist

from .. import registry
from ..errors import ArgumentAssertionError, CollectiveArgumentError, PlanError
from . import transport

__all__ = ["Agreement", "agree", "raise_together", "Raiser", "check_same_dicts", "dict_fingerprint"]

#: What ``agree(raise_as=...)`` calls on every rank on the error path: ``(this rank's own problem or
#: None, {rank: (exception type name, message)} of every rank that gave one)`` -> the exception to raise.
Raiser = Callable[[Optional[BaseException], "dict[int, tuple[str, str]]"], BaseException]

_BIG = (1 << 31) - 1
_WORD = (1 << 31) - 1  # words travel as 31-bit ints (negations fit int32)


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
        words: integers every rank should hold the same (reduced to 31 bits each).
        flag: a small non-negative int; the result carries its maximum over the ranks.
        driver: the group's driver when the caller already has it.
        raise_as: on the error path, every rank (the ones that gave a ``problem`` too) raises
            ``raise_as(problem, failures)`` instead of the default below; for ops whose errors
            keep an older form (``all_reduce_dict``: the same message on every rank).

    Returns:
        An [`Agreement`][hwdist.collectives.consensus.Agreement]; deciding what a difference in
        ``words`` means is the caller's job.

    Raises:
        BaseException: ``problem`` itself, on the rank that gave it.
        CollectiveArgumentError: on every other rank when some rank gave a ``problem``
            (a ``TypeError`` and a ``ValueError``), naming that rank and its message.
    """
    me = torch_dist.get_rank(group)
    bad = problem is not None
    mine = [
        int(bad),
        -(me if bad else _BIG),  # MAX of -rank: the lowest rank that had a problem
        int(flag),
        *[0 if bad else (int(w) & _WORD) for w in words],
    ]
    driver = driver if driver is not None else registry.resolve(group)
    highest, lowest = transport.max_and_min(mine, group, torch_dist.get_world_size(group), driver)
    if highest[0]:
        raise_together(fn, group, problem, driver=driver, raise_as=raise_as)
    hi, lo = tuple(highest[3:]), tuple(lowest[3:])
    return Agreement(flag=highest[2], same=hi == lo, highest=hi, lowest=lo)


def raise_together(
    fn: str,
    group: Any,
    problem: Optional[BaseException],
    *,
    driver: Any = None,
    raise_as: Optional[Raiser] = None,
) -> NoReturn:
    """The error path of [`agree`][hwdist.collectives.consensus.agree], for a caller that already knows
    (from an exchange of its own) that some rank of ``group`` had a problem: every rank sends its
    message (one small exchange of sizes, one of bytes) and raises. Arguments as ``agree``'s."""
    driver = driver if driver is not None else registry.resolve(group)
    texts = transport.gather_bytes(
        f"{type(problem).__name__}: {problem}".encode() if problem is not None else b"", group, driver
    )
    if raise_as is not None:
        failures = {r: t.decode(errors="replace").partition(": ") for r, t in enumerate(texts) if t}
        raise raise_as(problem, {r: (kind, msg) for r, (kind, _, msg) in failures.items()})
    if problem is not None:
        raise problem
    first = next(r for r, t in enumerate(texts) if t)
    raise CollectiveArgumentError(
        f"{fn}: rank {first} was given invalid arguments ({texts[first].decode(errors='replace')});"
        f" rank {torch_dist.get_rank(group)} raises too so that no rank waits forever",
        {r: t.decode(errors="replace") for r, t in enumerate(texts) if t},
    )


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
    known: Optional[tuple[bool, bool]] = None,
) -> None:
    """Every rank raises together unless every rank holds the same keys, shapes and dtypes (and ``op``).

    One small exchange (``collectives.consensus.agree``) of a fingerprint and of
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
        known: ``(some rank had a bad argument, every rank's fingerprint is the same)`` when an
            exchange of the caller's own told every rank already (no agreement exchange then).
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

    if known is None:
        same = agree(fn, group, problem=problem, words=words, driver=driver, raise_as=raise_as).same
    else:
        if known[0]:
            raise_together(fn, group, problem, driver=driver, raise_as=raise_as)
        same = known[1]
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
