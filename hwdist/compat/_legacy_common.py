"""Shared pieces of [`hwdist.compat.legacy`][hwdist.compat.legacy]: legacy enums, ``group.WORLD``, checks."""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

import torch
import torch.distributed as torch_dist

import hwdist

from ..collectives.protocol import agree
from ..errors import CollectiveArgumentError, NotInitializedError

__all__ = [
    "dist_backend",
    "reduce_op",
    "group",
    "DistributedRequest",
    "group_of",
    "require_pg",
    "fingerprint",
    "shown",
    "layout_digest",
    "agree_or_raise",
    "agree_on_layout",
]


class dist_backend:  # noqa: N801 - the legacy API's name
    """The backend ids of torch 0.3/0.4 (``init_process_group`` also takes them)."""

    UNDEFINED = -1
    TCP = 0
    MPI = 1
    GLOO = 2
    NCCL = 3


class reduce_op:  # noqa: N801 - the legacy API's name
    """The reduce operations of torch 0.3/0.4 (today's ``torch.distributed.ReduceOp`` values)."""

    SUM = torch_dist.ReduceOp.SUM
    PRODUCT = torch_dist.ReduceOp.PRODUCT
    MAX = torch_dist.ReduceOp.MAX
    MIN = torch_dist.ReduceOp.MIN


class _World:
    def __repr__(self) -> str:
        return "group.WORLD"


class group:  # noqa: N801 - the legacy API's name
    """``group.WORLD``: every process (the default group)."""

    WORLD: Any = _World()


class DistributedRequest:
    """What ``isend``/``irecv`` return: ``is_completed()`` and ``wait()``, as in torch 0.3."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def is_completed(self) -> bool:
        """Whether the transfer has finished."""
        return bool(self._handle.is_completed())

    def wait(self) -> None:
        """Block until the transfer has finished (a receive's data is then in its tensor)."""
        self._handle.wait()


def group_of(value: Any) -> Any:
    return None if value is group.WORLD else value


def require_pg(fn: str) -> None:
    if not hwdist.is_distributed():
        raise NotInitializedError(
            f"{fn}: collective only supported in process-group mode: call"
            " hwdist.compat.legacy.init_process_group(...) first"
        )


def fingerprint(tensor: Any) -> int:
    """A 31-bit digest of a tensor's shape and dtype (every rank must give the same one)."""
    return layout_digest(shown(tensor))


def shown(tensor: Any) -> str:
    """A tensor's shape and dtype as messages show them (``(2, 3):torch.float32``); ``?``: not a tensor."""
    return f"{tuple(tensor.shape)}:{tensor.dtype}" if isinstance(tensor, torch.Tensor) else "?"


def layout_digest(text: str) -> int:
    """A 31-bit digest of a layout description (an agreement word every rank compares)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") & 0x7FFFFFFF


def agree_or_raise(
    fn: str,
    grp: Any,
    problem: Optional[BaseException],
    words: Sequence[int],
    what: str,
    mine: Optional[str] = None,
) -> None:
    """Every rank raises together when one rank's arguments are bad or the ranks' ``words`` differ.

    ``mine``: this rank's value as the message shows it, where ``words`` are digests (else the words).
    """
    if hwdist.get_world_size(grp) == 1:
        if problem is not None:
            raise problem
        return
    got = agree(fn, grp, problem=problem, words=words)
    if not got.same:
        given = (
            f"rank {hwdist.get_rank()} gave {mine}" if mine is not None
            else f"one rank gave {list(got.lowest)}, another {list(got.highest)}"
        )
        raise CollectiveArgumentError(
            f"{fn}: the ranks disagree on {what} ({given}); every rank must pass the same"
        )


def agree_on_layout(fn: str, grp: Any, problem: Optional[BaseException], layout: str, mismatch: str) -> None:
    """Every rank raises together when one rank's arguments are bad or the ranks' ``layout`` texts differ.

    The agreement of the mirrored ``all_reduce_dict`` (vis4d) and ``pack_allreduce_split`` (MegEngine):
    one small collective of the layout's digest; ``mismatch`` is the error's text after ``fn: ``.
    """
    got = agree(fn, grp, problem=problem, words=[layout_digest(layout)])
    if not got.same:
        raise CollectiveArgumentError(f"{fn}: {mismatch}")
