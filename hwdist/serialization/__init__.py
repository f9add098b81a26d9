"""Serialization for the object collectives: pluggable serializers, frames, and the restricted loader.

One place for everything that turns objects into bytes and back; the collectives import it, it
imports nothing of ``hwdist.collectives``. Its modules: [`serializers`][hwdist.serialization.serializers],
[`frames`][hwdist.serialization.frames], [`tensors`][hwdist.serialization.tensors],
[`weights_only`][hwdist.serialization.weights_only] and the
[`restricted`][hwdist.serialization.restricted.loader] loader (``docs/objects.md``).
"""

from __future__ import annotations

from ..errors import UnpicklingRefused
from .frames import Frame, decode, encode, obj2tensor, object_to_tensor, tensor2obj, tensor_to_object
from .restricted import RestrictedUnpickler, register_safe_class, restricted_loads, safe_globals
from .serializers import PickleSerializer, RestrictedPickleSerializer, Serializer, get_serializer
from .serializers import set_serializer, use_serializer
from .weights_only import WeightsOnlySerializer

# For the object collectives, not in __all__ (the redundant aliases say "re-exported" to the linters).
from .frames import frame_length as frame_length
from .tensors import MapLocation as MapLocation

__all__ = [
    "Serializer",
    "PickleSerializer",
    "RestrictedPickleSerializer",
    "WeightsOnlySerializer",
    "RestrictedUnpickler",
    "UnpicklingRefused",
    "Frame",
    "get_serializer",
    "set_serializer",
    "use_serializer",
    "register_safe_class",
    "safe_globals",
    "restricted_loads",
    "encode",
    "decode",
    "object_to_tensor",
    "tensor_to_object",
    "obj2tensor",
    "tensor2obj",
]
