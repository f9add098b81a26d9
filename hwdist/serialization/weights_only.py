"""``weights_only=``: torch's keyword on the object collectives, on every torch hwdist supports.

With ``weights_only=True`` payloads are read with hwdist's restricted loader, plus the types
registered with torch's ``add_safe_globals`` at the moment of the call; each sender reads its own
object back first, so a type that is not allowed fails on every rank with
[`WeightsOnlyRefused`][hwdist.errors.WeightsOnlyRefused]. What it accepts, and why torch's own
loader is not used: ``docs/objects.md`` and ``docs/reliability.md``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..errors import CollectiveArgumentError, UnpicklingRefused
from .frames import Frame
from .serializers import PickleSerializer, RestrictedPickleSerializer, Serializer, get_serializer
from .tensors import OOB_THRESHOLD

__all__ = ["WeightsOnlySerializer", "for_call", "check_own", "HINT"]

HINT = (
    "with weights_only=True, register a type on every rank with torch.serialization.add_safe_globals([T])"
    " (torch >= 2.4) or hwdist.serialization.register_safe_class(T),"
    " or pass weights_only=False if every sender is trusted"
)


class WeightsOnlySerializer(RestrictedPickleSerializer):
    """The serializer a ``weights_only=True`` call uses: restricted, plus torch's safe globals.

    Args:
        extra: ``(module, name)`` pairs allowed by the serializer it stands in for.
        oob_threshold: as [`PickleSerializer`][hwdist.serialization.serializers.PickleSerializer].
    """

    def __init__(self, extra: Sequence[tuple[str, str]] = (), oob_threshold: int = OOB_THRESHOLD) -> None:
        super().__init__((), oob_threshold)
        self.extra = tuple(extra)

    def loads(self, stream: memoryview, buffers: Sequence[memoryview]) -> Any:
        """Unpickle through the restricted loader with torch's safe globals of this moment.

        Raises:
            UnpicklingRefused: a type is not allowed (the message names it and how to allow it).
        """
        try:
            return super().loads(stream, buffers)
        except UnpicklingRefused as exc:
            raise UnpicklingRefused(f"{exc}. {HINT[0].upper()}{HINT[1:]}") from None


_DEFAULT_WO = WeightsOnlySerializer()


def for_call(serializer: Optional[Serializer], weights_only: Any, where: str) -> Optional[Serializer]:
    """The serializer a call uses: ``serializer`` unchanged unless ``weights_only`` is true.

    Raises:
        CollectiveArgumentError: ``weights_only`` is not a bool, or ``serializer`` is not a pickle serializer.
    """
    if weights_only is False or weights_only is None:
        return serializer
    if weights_only is not True:
        raise CollectiveArgumentError(
            f"{where}: weights_only must be True or False,"
            f" got {type(weights_only).__name__}: {weights_only!r}"
        )
    base = serializer if serializer is not None else get_serializer()
    if isinstance(base, WeightsOnlySerializer):
        return base
    if type(base) is PickleSerializer and base.oob_threshold == OOB_THRESHOLD and len(base.reducers) == 2:
        return _DEFAULT_WO  # a default pickle serializer (its two reducers, tensors and arrays)
    if isinstance(base, PickleSerializer):
        made = WeightsOnlySerializer(tuple(getattr(base, "extra", ())), base.oob_threshold)
        made.reducers.update(base.reducers)  # the sender pickles as the serializer it stands in for
        return made
    raise CollectiveArgumentError(
        f"{where}: weights_only=True reads pickle payloads, but serializer is a {type(base).__name__};"
        " pass weights_only=False with that serializer, or a hwdist PickleSerializer"
    )


def check_own(frame: Frame, serializer: Optional[Serializer]) -> Optional[str]:
    """Why a ``weights_only=True`` receiver would refuse this rank's own ``frame``, or None."""
    if not isinstance(serializer, WeightsOnlySerializer):
        return None
    try:
        serializer.loads(frame.stream, frame.buffers)
    except UnpicklingRefused as exc:
        return str(exc)
    return None
