"""hwdist's internal transport, the header round and the agreement primitive, on real ranks.

Every other module's own traffic (header rounds, records, payloads, the
launcher's node table) goes through these functions, so they are checked here
on their own with values that differ per rank.
"""

from __future__ import annotations

import pytest

import hwdist
from hwdist.collectives import protocol
from hwdist.testing.pytest_plugin import backends, world_sizes

pytestmark = pytest.mark.dist


def _transport_rank():
    rank = hwdist.get_rank()
    out = {}
    out["ints"] = protocol.gather_ints([rank, rank * 10, -rank], None)
    out["bytes"] = protocol.gather_bytes(b"x" * (rank * 7 + 1), None)
    out["empty"] = protocol.gather_bytes(b"", None)
    out["max"] = protocol.max_over_ranks([rank, 5 - rank], None)
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", world_sizes())
def test_transport_moves_what_each_rank_gave(dist, world_size, backend):
    for res in dist(_transport_rank, world_size, backend):
        assert res["ints"] == [[r, r * 10, -r] for r in range(world_size)]
        assert res["bytes"] == [b"x" * (r * 7 + 1) for r in range(world_size)]
        assert res["empty"] == [b""] * world_size
        assert res["max"] == [world_size - 1, 5]


def _agree_rank(bad_rank: int):
    rank = hwdist.get_rank()
    out = {}
    got = protocol.agree("op", None, words=[7, rank % 2], flag=rank)
    out["flag"], out["same"] = got.flag, got.same
    problem = ValueError("x must be positive, got -1") if rank == bad_rank else None
    try:
        protocol.agree("op", None, problem=problem, words=[1])
        out["raised"] = None
    except Exception as exc:  # noqa: BLE001 - the test compares the type and text
        out["raised"] = (
            type(exc).__name__,
            str(exc),
            isinstance(exc, ValueError),
            isinstance(exc, hwdist.HwdistError),
        )
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_agree_raises_on_every_rank_naming_the_bad_one(dist, world_size, backend):
    bad = world_size - 1
    for rank, res in enumerate(dist(_agree_rank, world_size, backend, bad)):
        assert res["flag"] == world_size - 1
        assert res["same"] is False  # rank % 2 differs
        name, text, is_value_error, is_hwdist = res["raised"]
        assert is_value_error
        if rank == bad:
            assert (name, text) == ("ValueError", "x must be positive, got -1")
        else:
            assert name == "CollectiveArgumentError" and is_hwdist
            assert (
                f"op: rank {bad} was given invalid arguments (ValueError: x must be positive, got -1)" in text
            )


def _header_rank() -> dict:
    import numpy as np
    import torch

    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    inline = bytes(range(256)) * 4  # longer than the room: cut, and flagged
    head = protocol.Header(
        status=rank % 2, op=protocol.op_code("all_gather"), seq=rank + 1, root=world - 1, nbytes=1000 * rank,
        nchunks=rank, token=-rank, dtype=protocol.dtype_code(torch.bfloat16), rop=3, numel=7 * rank,
        ndim=min(rank + 1, 9), dims=tuple(range(2, 2 + min(rank + 1, 8))), fingerprint=(1 << 62) + rank,
        site=rank, inline=inline[: 100 * rank] if rank < world - 1 else inline,
    )  # fmt: skip
    got = protocol.exchange(head, None, hwdist.resolve())
    out = []
    for h in got:
        data = None if h.inline is None else bytes(h.inline)
        out.append((h.rank, h.framed, h.status, h.seq, h.nbytes, h.token, h.ndim, h.dims, h.fingerprint,
                    h.flags, data, protocol.dtype_name(h.dtype)))  # fmt: skip
    buf = torch.full((5,), float(rank + 1))
    protocol.reduce_flat(buf, "sum", None)
    junk = protocol.parse_rows(np.zeros((1, protocol.HEADER_BYTES), dtype=np.uint8))[0]
    return {"headers": out, "sum": buf.tolist(), "junk framed": junk.framed}


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", world_sizes())
def test_header_round_carries_every_word_exactly(dist, world_size, backend):
    """Every rank's header arrives on every rank word for word; inline bytes past the room are cut and
    flagged; a row without the magic is not taken for a header."""
    inline = bytes(range(256)) * 4
    for res in dist(_header_rank, world_size, backend):
        assert res["sum"] == [float(world_size * (world_size + 1) // 2)] * 5
        assert res["junk framed"] is False
        for r, got in enumerate(res["headers"]):
            full = inline if r == world_size - 1 else inline[: 100 * r]
            want_inline = full[: protocol.INLINE_BYTES] or None
            cut = protocol.INLINE_CUT if len(full) > protocol.INLINE_BYTES else 0
            dims = tuple(range(2, 2 + min(r + 1, 8)))
            assert got == (
                r, True, r % 2, r + 1, 1000 * r, -r, min(r + 1, 9), dims, (1 << 62) + r, cut, want_inline,
                "bfloat16",
            ), (r, got)
