"""The restricted loader: hwdist's own pickle interpreter for payloads from peers it does not trust.

``serializer="restricted"`` and ``weights_only=True`` decode through it. It is
kept beside torch's ``weights_only`` loader because that one crashes the
process on some hostile payloads (``docs/reliability.md`` lists them, with the
torch versions); the trust model is in ``docs/objects.md``.

* [`loader`][hwdist.serialization.restricted.loader]: the interpreter, the
  allow-list and the entry points (``register_safe_class``, ``restricted_loads``);
* ``checks``: the builders of allow-listed globals, each checking its arguments
  before it allocates; ``opcodes``: one handler per pickle opcode.
"""

from .loader import RestrictedUnpickler, UnpicklingRefused, pair, register_safe_class, restricted_loads
from .loader import safe_globals, torch_safe_pairs

__all__ = [
    "RestrictedUnpickler",
    "UnpicklingRefused",
    "pair",
    "register_safe_class",
    "restricted_loads",
    "safe_globals",
    "torch_safe_pairs",
]
