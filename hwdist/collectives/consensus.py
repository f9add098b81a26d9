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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Optional, Sequence

import torch.distributed as torch_dist

from .. import registry
from ..errors import CollectiveArgumentError
from . import transport

__all__ = ["Agreement", "agree", "raise_together", "Raiser"]

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

