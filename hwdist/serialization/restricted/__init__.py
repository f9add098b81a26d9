"""The restricted loader: hwdist's own pickle interpreter for payloads from peers it does not trust.

``serializer="restricted"`` and ``weights_only=True`` decode through it. It is
kept beside torch's ``weights_only`` loader because that one crashes the
process on some hostile payloads (``docs/reliability.md`` lists them, with the
torch versions); the trust model is in ``docs/objects.md``.

* [`loader`][hwdist.serialization.restricted.loader]: the opcode interpreter and
  the allow-list (``register_safe_class``, ``safe_globals``, ``restricted_loads``);
* [`checks`][hwdist.serialization.restricted.checks]: the builders of
  allow-listed globals, each checking its arguments before it allocates;
* [`opcodes`][hwdist.serialization.restricted.opcodes]: one handler per pickle opcode.
"""

from .loader import (
    RestrictedUnpickler,
    UnpicklingRefused,
    pair,
    register_safe_class,
    restricted_loads,
    safe_globals,
    torch_safe_pairs,
)

__all__ = [
    "RestrictedUnpickler",
    "UnpicklingRefused",
    "pair",
    "register_safe_class",
    "restricted_loads",
    "safe_globals",
    "torch_safe_pairs",
]
