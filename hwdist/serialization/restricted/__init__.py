"""The restricted loader: hwdist's own pickle interpreter for payloads from peers it does not trust.

[`loader`][hwdist.serialization.restricted.loader]: the interpreter, the allow-list and the entry
points; ``checks``: the builders of allow-listed globals; ``opcodes``: one handler per opcode.
Why it is kept beside torch's ``weights_only`` loader: ``docs/reliability.md``.
"""

from .loader import RestrictedUnpickler, register_safe_class, restricted_loads, safe_globals

__all__ = ["RestrictedUnpickler", "register_safe_class", "restricted_loads", "safe_globals"]
