"""A hostile peer on real gloo ranks: the restricted serializer's receiver raises instead of dying.

Rank 1 plays the attacker: its serializer emits the raw bytes of a hostile
payload (tests/programs/restricted_probe.py) whatever the object, so they travel
as a well-formed hwdist frame. Rank 0 receives with
``RestrictedPickleSerializer`` in ``gather_object`` and ``collect_results``
and must raise ``UnpicklingRefused``, with its process intact (no signal,
no changed global) and the group still usable. Before the restricted
unpickler was rewritten, the numpy payloads killed rank 0 with SIGSEGV here.
A crash of a rank fails the test through the harness (RankFailure), not the
suite. The attacker learns of the refusal too: every rank raises, the sender with an
``ObjectCollectiveError`` naming the receiver's
decode failure.
"""

from __future__ import annotations

import collections
import fractions
from typing import Any

import numpy as np
import pytest

import hwdist
from tests.programs.restricted_probe import attacks

pytestmark = pytest.mark.dist

HOSTILE = [
    "dtype_object_field",
    "ndarray_huge_strides",
    "counter_missing",
    "fraction_eq",
    "bytearray_1gib",
    "deep_tuple_hash",
    "sparse_out_of_shape",
    "quantized_nan_scale",
    "ordered_dict_int_state",
]


class _RawBytes(hwdist.Serializer):
    """A hostile peer's serializer: sends ``payload`` as the pickle stream, whatever the object."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def dumps(self, obj: Any) -> tuple[bytes, list]:
        return self.payload, []

    def loads(self, stream: Any, buffers: Any) -> Any:
        raise AssertionError("the attacker never receives")


def _hostile_peer(payloads_hex: list[str], how: str) -> list[Any]:
    rank = hwdist.get_rank()
    out: list[Any] = []
    for h in payloads_hex:
        ser = _RawBytes(bytes.fromhex(h)) if rank == 1 else hwdist.RestrictedPickleSerializer()
        try:
            if how == "gather_object":
                got = hwdist.gather_object({"rank": rank}, dst=0, serializer=ser)
            else:
                got = hwdist.collect_results([rank], 2, serializer=ser)
            out.append(f"returned {type(got).__name__}")
        except hwdist.UnpicklingRefused as exc:
            out.append(str(exc))
        except hwdist.ObjectCollectiveError as exc:  # the sender: told that rank 0 refused its payload
            out.append(f"{type(exc).__name__}: {exc}")
    out.append([collections.Counter()["never-seen"], fractions.Fraction(1, 2) == fractions.Fraction(1, 3)])
    # the group still works, and legitimate content still passes the restricted serializer
    got = hwdist.gather_object(
        {"rank": rank, "a": np.arange(3)}, dst=0, serializer=hwdist.RestrictedPickleSerializer()
    )
    out.append(None if got is None else [(g["rank"], g["a"].tolist()) for g in got])
    return out


@pytest.mark.parametrize("how", ["gather_object", "collect_results"])
def test_a_hostile_peer_makes_the_receiver_raise_not_die(dist, how, tmp_path):
    payloads = attacks(str(tmp_path / "pwned"))
    receiver, attacker = dist(_hostile_peer, 2, "gloo", [payloads[n].hex() for n in HOSTILE], how, timeout=90)
    for name, msg in zip(HOSTILE, receiver):
        assert msg.startswith("restricted unpickler refused"), (name, msg)
    assert receiver[len(HOSTILE)] == [0, False]  # Counter and Fraction untouched
    assert receiver[-1] == [(0, [0, 1, 2]), (1, [0, 1, 2])]
    for name, msg in zip(HOSTILE, attacker):
        assert (
            msg.startswith("ObjectCollectiveError:") and "could not decode the object from rank 1" in msg
        ), (name, msg)
    assert not (tmp_path / "pwned").exists()
