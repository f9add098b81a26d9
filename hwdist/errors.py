"""Every exception hwdist raises on purpose, under one root: [`HwdistError`][hwdist.errors.HwdistError].

Each class also keeps the built-in base it had before the root existed
(``TypeError``, ``ValueError``, ``RuntimeError``, ...), so code that catches
those keeps working; ``except hwdist.HwdistError`` catches all of them.
"""

from __future__ import annotations

import pickle
from typing import Optional

__all__ = [
    "HwdistError",
    "BackendError",
    "PlanError",
    "LauncherError",
    "CollectiveMismatch",
    "ConcurrentGroupUse",
    "ObjectCollectiveError",
    "SerializationError",
    "CollectiveArgumentError",
    "PeerFailure",
    "UnpicklingRefused",
    "WeightsOnlyRefused",
    "ArgumentAssertionError",
    "NotInitializedError",
    "LegacyBackendError",
    "MissingPackageError",
]


class HwdistError(Exception):
    """The root of every exception hwdist raises on purpose."""


class BackendError(HwdistError, ValueError):
    """An unknown, duplicate, malformed or unavailable backend."""


class PlanError(HwdistError, TypeError):
    """No correct plan exists for an op/dtype/reduce-op on a backend."""


class LauncherError(HwdistError, ValueError):
    """A launcher environment that is missing, malformed or contradictory."""


class CollectiveMismatch(HwdistError, RuntimeError, ValueError):
    """Ranks called a collective with different arguments (verification mode).

    Also a ``ValueError``, so code that catches the argument errors of a
    collective (e.g. ``all_reduce_dict``'s own layout check) catches it too.
    """


class ConcurrentGroupUse(HwdistError, RuntimeError):
    """Two threads issued collectives on one process group at the same time."""


class ObjectCollectiveError(HwdistError, RuntimeError):
    """An object collective failed on one or more ranks; raised on every rank.

    Attributes:
        failures: ``{group rank: what went wrong there}``.
    """

    def __init__(self, message: str, failures: Optional[dict[int, str]] = None) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})


class SerializationError(ObjectCollectiveError):
    """A rank could not serialize its object (e.g. it is not picklable)."""


class CollectiveArgumentError(ObjectCollectiveError, TypeError, ValueError):
    """A rank passed a bad argument, or ranks disagree on the call."""


class PeerFailure(ObjectCollectiveError):
    """Another rank left an object collective in the middle (died, or failed to communicate)."""


class UnpicklingRefused(HwdistError, pickle.UnpicklingError):
    """The restricted unpickler refused a payload (a global off the allow-list, a bad description, ...).

    Nothing the payload named was called, and no object outside the payload was changed.
    """


class WeightsOnlyRefused(SerializationError, UnpicklingRefused):
    """``weights_only=True``: a rank's object holds a type that is not allowed; raised on every rank.

    A ``pickle.UnpicklingError``, as torch's ``weights_only=True`` loader raises.
    """


class ArgumentAssertionError(CollectiveArgumentError, AssertionError):
    """A bad argument that the API hwdist stands in for rejected with ``assert``.

    mmengine checks ``all_reduce_dict``'s and ``broadcast_object_list``'s
    arguments with ``assert``; code that catches ``AssertionError`` around them
    keeps working, and code that catches hwdist's ``TypeError`` /
    [`CollectiveArgumentError`][hwdist.errors.CollectiveArgumentError] does too.
    """


class NotInitializedError(HwdistError, AssertionError, RuntimeError):
    """A call that needs a process group, made before one exists.

    An ``AssertionError`` because the torch 0.3/0.4 API asserted it
    ([`hwdist.compat.legacy`][hwdist.compat.legacy]); a ``RuntimeError`` as today's torch raises.
    """


class LegacyBackendError(BackendError, RuntimeError):
    """A backend name or id the legacy ``init_process_group`` cannot use (it raised ``RuntimeError``)."""


class MissingPackageError(HwdistError, ImportError):
    """An optional package a call needs is not installed (the message says which one to install)."""
