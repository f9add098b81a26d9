"""Every ``HWDIST_*`` environment variable, read in one place by typed readers.

Each variable is declared once in [`SETTINGS`][hwdist.settings.SETTINGS] with its
kind, default and meaning; ``hwdist env`` lists them with their current values.
A module that needs one asks this module (``settings.flag("HWDIST_DEBUG")``),
never ``os.environ`` directly, so every variable is parsed the same way and a
bad value gets the same clear message.

Run-time switches with a get / set / context-manager triplet (verification mode,
the object path) are [`Switch`][hwdist.settings.Switch] objects: the variable gives
the initial value, ``set`` returns the previous one, ``override`` is the
context manager.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, Optional, TypeVar

__all__ = ["Setting", "SETTINGS", "flag", "text", "integer", "number", "choice", "current", "Switch"]

T = TypeVar("T")


@dataclass(frozen=True)
class Setting:
    """One ``HWDIST_*`` variable: its name, kind, default (as the text a user would set) and meaning."""

    name: str
    kind: str  # "flag", "text", "integer", "number", "choice"
    default: str
    doc: str
    choices: tuple[str, ...] = ()


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("HWDIST_BACKEND", "text", "", "force this backend instead of auto-detection"),
        Setting("HWDIST_DEVICE", "text", "", "force this device type instead of auto-detection"),
        Setting(
            "HWDIST_VERIFY", "flag", "1",
            "verification: ranks compare each collective (op, dtype, shape, reduce op, root) before any data"
            " moves; 0 turns it off",
        ),
        Setting(
            "HWDIST_DEBUG", "flag", "0",
            "debug mode: verification also compares the line of user code each rank calls from",
        ),
        Setting(
            "HWDIST_TEST_BACKENDS", "text", "",
            "pytest plugin: the backends the dist fixtures run on"
            " (default: the CPU one and the emulated accelerator)",
        ),
        Setting(
            "HWDIST_TEST_WORLD_SIZES", "text", "1,2,3", "pytest plugin: the world sizes the dist fixtures run"
        ),
        Setting("HWDIST_TEST_MAX_POOLS", "integer", "6", "pytest plugin: rank pools kept alive at once"),
        Setting(
            "HWDIST_TEST_TIMEOUT", "number", "120", "testing harness: seconds one multi-rank call may take"
        ),
        Setting(
            "HWDIST_TEST_PG_TIMEOUT", "number", "30", "testing harness: the process-group timeout, seconds"
        ),
        Setting(
            "HWDIST_CHECK_INJECT", "text", "",
            "hwdist check: inject a wrong result (op:dtype:mode) to see it caught",
        ),
        Setting("HWDIST_BENCH_INJECT", "text", "", "hwdist bench: inject a wrong result into this op"),
        Setting("HWDIST_FLIGHT_RECORDER", "flag", "1", "flight recorder: record every collective (0: off)"),
        Setting("HWDIST_FLIGHT_SIZE", "integer", "2048", "flight recorder: entries kept per process"),
        Setting("HWDIST_FLIGHT_TORCH", "flag", "0", "flight recorder: torch.distributed calls too (2.14+)"),
        Setting("HWDIST_FLIGHT_DIR", "text", "", "flight recorder: dump directory (<tmp>/hwdist-flight-UID)"),
        Setting(
            "HWDIST_FLIGHT_SIGNAL", "choice", "auto", "flight recorder: dump on SIGUSR1 (auto: if watchdog)",
            ("auto", "on", "off"),
        ),
        Setting(
            "HWDIST_DESTROY_AT_EXIT", "flag", "1",
            "destroy the default process group at interpreter exit if it is still alive (0: off)",
        ),
        Setting("HWDIST_HANG_TIMEOUT", "number", "300", "hang watchdog: seconds before a report (0: off)"),
        Setting(
            "HWDIST_HANG_ACTION", "choice", "raise",
            "hang watchdog, after the report: raise (HangDetected, or exit when blocked), abort, report",
            ("report", "raise", "abort"),
        ),
    )
}
"""Every ``HWDIST_*`` variable hwdist reads, by name."""

#: Variables hwdist's own tools and test suite set for their child processes (not user settings).
TOOL_VARIABLES = frozenset({
    "HWDIST_MPI_SUITE", "HWDIST_MPI_SUITE_BACKEND", "HWDIST_CLI_UNDER_MPIEXEC", "HWDIST_BENCH_MPI_CHILD",
    "HWDIST_TEST_RANK", "HWDIST_TEST_NOISE", "HWDIST_TEST_SLOW_RANKS", "HWDIST_RUN_HARDWARE",
    "HWDIST_GPU_DIST", "HWDIST_VENDOR_CACHE", "HWDIST_DIR",
})
#: Prefixes of the variables of hwdist's own tools (the version matrix, the fuzzer, the benchmarks).
TOOL_PREFIXES = ("HWDIST_VERSIONS", "HWDIST_MATRIX", "HWDIST_FUZZ_", "HWDIST_BENCH_")
_checked: list[bool] = [False]


def unknown_variables(environ: Optional[Any] = None) -> list[tuple[str, Optional[str]]]:
    """The ``HWDIST_*`` variables set that hwdist does not read, each with the closest known name or None."""
    import difflib

    env = os.environ if environ is None else environ
    out = []
    for name in sorted(env):
        if not name.startswith("HWDIST_") or name in SETTINGS or name in TOOL_VARIABLES:
            continue
        if name.startswith(TOOL_PREFIXES):
            continue
        close = difflib.get_close_matches(name, list(SETTINGS), n=1, cutoff=0.6)
        out.append((name, close[0] if close else None))
    return out


def check_unknown() -> None:
    """Warn once per process about each ``HWDIST_*`` variable hwdist does not know (a typo is silent).

    Called when the flight recorder starts (the first collective, or a process group being made), not at
    import: a warning of ``import hwdist`` would land in whatever the importer was doing.
    """
    if _checked[0]:
        return
    _checked[0] = True
    for name, close in unknown_variables():
        hint = f"did you mean {close!r}? " if close else ""
        warnings.warn(
            f"environment variable {name} is not one hwdist reads; {hint}`hwdist env` lists them all",
            RuntimeWarning,
            stacklevel=3,
        )


_TRUE = ("true", "yes", "on")
_FALSE = ("", "false", "no", "off")


def _raw(name: str) -> str:
    return os.environ.get(name, "").strip()


def _default(name: str) -> str:
    setting = SETTINGS.get(name)
    return setting.default if setting is not None else ""


def text(name: str) -> Optional[str]:
    """The variable's value stripped, or its declared default, or None when both are empty."""
    return _raw(name) or _default(name) or None


def flag(name: str) -> bool:
    """Off for unset, empty, 0, false, no, off; on for 1, 2, ... (any integer >= 1), true, yes, on.

    A value that is none of those words turns the flag on with a warning: asking
    for a debugging aid and silently not getting it is the worse mistake.
    """
    raw = _raw(name)
    value = raw.lower() or _default(name).lower()
    if value.isascii() and value.isdigit():
        return int(value) > 0
    if value in _FALSE:
        return False
    if value not in _TRUE:
        warnings.warn(
            f"{name}={raw!r} is not one of 0/false/no/off (off) or 1/2/.../true/yes/on (on); taken as ON",
            stacklevel=2,
        )
    return True


def _parsed(name: str, convert: Callable[[str], T], what: str) -> Optional[T]:
    value = _raw(name) or _default(name)
    if not value:
        return None
    try:
        return convert(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be {what}, got {value!r}") from None


def integer(name: str) -> Optional[int]:
    """The variable as an int (or its declared default); ValueError naming it when it is not one."""
    return _parsed(name, int, "an integer")


def number(name: str) -> Optional[float]:
    """The variable as a float (or its declared default); ValueError naming it when it is not one."""
    return _parsed(name, float, "a number")


def bounded(
    name: str,
    low: float,
    high: float,
    *,
    integer: bool = False,
    default: Optional[float] = None,
    what: str = "",
) -> Any:
    """The variable as a number in ``[low, high]`` (an int with ``integer``); never raises.

    Unset or empty: ``default``, or the declared default. A value that is not a number, or is out of
    range (400 digits, ``nan``, ``-1``), gives one ``RuntimeWarning`` naming the variable, the range and
    the value, and the default is used.

    Args:
        name: the variable.
        low: the smallest value accepted.
        high: the largest value accepted.
        integer: an integer is wanted.
        default: the value when unset or bad (default: the declared default).
        what: what the value is for, for the warning (``"the flight recorder's size"``).
    """
    fallback_text = _default(name) if default is None else str(default)
    fallback: Any = int(float(fallback_text)) if integer else float(fallback_text)
    raw = _raw(name)
    if not raw:
        return fallback
    try:
        value: Any = int(raw) if integer else float(raw)
    except ValueError:
        value = None
    if value is None or value != value or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        shown = raw if len(raw) <= 40 else f"{raw[:20]}...({len(raw)} characters)"
        for_what = f" ({what})" if what else ""
        warnings.warn(
            f"environment variable {name} must be {kind} in [{low:g}, {high:g}]{for_what}, got {shown!r};"
            f" using {fallback}",
            RuntimeWarning,
            stacklevel=2,
        )
        return fallback
    return value


def integer_list(name: str, low: int, high: int, default: str = "") -> list[int]:
    """The variable as comma-separated integers in ``[low, high]``; a bad value: a warning and the default."""
    fallback = [int(x) for x in (default or _default(name)).split(",") if x.strip()]
    raw = _raw(name)
    if not raw:
        return fallback
    try:
        values = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(low <= v <= high for v in values):
        shown = raw if len(raw) <= 40 else f"{raw[:20]}...({len(raw)} characters)"
        warnings.warn(
            f"environment variable {name} must be comma-separated integers in [{low}, {high}] (e.g. 1,2,3),"
            f" got {shown!r}; using {','.join(map(str, fallback))}",
            RuntimeWarning,
            stacklevel=2,
        )
        return fallback
    return values


def choice(name: str) -> str:
    """The variable lower-cased, one of its declared choices; ValueError listing them otherwise."""
    setting = SETTINGS[name]
    value = (_raw(name) or setting.default).lower()
    if value not in setting.choices:
        raise ValueError(
            f"environment variable {name} must be one of {', '.join(setting.choices)}, got {value!r}"
        )
    return value


def current() -> list[tuple[Setting, Optional[str]]]:
    """Every declared setting with the value set in the environment (None when unset), for ``hwdist env``."""
    return [(s, os.environ.get(s.name)) for s in SETTINGS.values()]


class Switch(Generic[T]):
    """A process-wide run-time switch: initial value from the environment, ``get``/``set``/``override``.

    Args:
        initial: called once, on first use, for the initial value (reads the variable).
        check: validates and normalises a value given to ``set`` (raises on a bad one).
        on_change: called after every change (e.g. to reset state that depends on it).
    """

    def __init__(
        self,
        initial: Callable[[], T],
        check: Callable[[Any], T],
        on_change: Optional[Callable[[], None]] = None,
    ) -> None:
        self._initial = initial
        self._check = check
        self._on_change = on_change
        self._value: Optional[T] = None
        self._loaded = False

    def get(self) -> T:
        """The current value."""
        if not self._loaded:
            self._value, self._loaded = self._initial(), True
        return self._value  # type: ignore[return-value]

    def set(self, value: Any) -> T:
        """Set the value (validated); return the previous one."""
        new = self._check(value)
        old = self.get()
        self._value = new
        if self._on_change is not None:
            self._on_change()
        return old

    @contextlib.contextmanager
    def override(self, value: Any) -> Iterator[T]:
        """Context manager: the value inside the block, the previous one restored after it."""
        old = self.set(value)
        try:
            yield self.get()
        finally:
            self.set(old)
