"""Every torch-version difference hwdist cares about, feature-checked once.

Each entry names the torch version from which it can be dropped. Nothing else
in hwdist looks at ``torch.__version__`` or probes torch for features. Where a
probe would need a device or a process group (what a backend library can do),
the flag goes by version, with the reason and the measurement behind it
(2-rank pure-torch probes of the PyPI wheels; docs/hardware.md, "Versions").
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from typing import Any, Callable, Optional

import torch
import torch.distributed as _dist

#: The oldest torch hwdist supports (pyproject.toml says the same).
TORCH_FLOOR = (2, 1)

DIST_AVAILABLE: bool = _dist.is_available()


def _has_param(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):  # an unparsable (source) build: assume it is recent
        return (99, 0)


TORCH_VERSION: tuple[int, int] = _torch_version()


def _version_at_least(major: int, minor: int) -> bool:
    return TORCH_VERSION >= (major, minor)


def unsupported_reason() -> Optional[str]:
    """Why hwdist cannot run collectives with this torch (older than the floor, no distributed), or None."""
    floor = ".".join(map(str, TORCH_FLOOR))
    if not _version_at_least(*TORCH_FLOOR):
        return (
            f"torch {torch.__version__} is older than hwdist's floor (torch >= {floor});"
            f" install torch>={floor} (e.g. pip install 'torch>={floor}')"
        )
    if not DIST_AVAILABLE:
        return (
            f"torch {torch.__version__} was built without torch.distributed (hwdist needs torch >= {floor}"
            " with distributed support; the PyPI wheels for Linux, Windows and macOS have it)"
        )
    return None


# torch.uint16/uint32/uint64 (torch>=2.3): no built-in backend moves or reduces them natively (gloo and
# NCCL: "Invalid scalar type"); hwdist carries them as bytes. Drop when torch>=2.3 is the floor.
WIDE_UNSIGNED_DTYPES: tuple[torch.dtype, ...] = tuple(
    d for d in (getattr(torch, n, None) for n in ("uint16", "uint32", "uint64")) if isinstance(d, torch.dtype)
)

# --- Gloo (ProcessGroupGloo): what it does depends on the torch it ships with. Finding out needs a
# process group, so these go by version; each was measured with 2-rank pure-torch probes on the PyPI
# wheels of 2.1.2, 2.2.2, 2.3.1, 2.4.1, 2.8.0, 2.9.1, 2.11.0, 2.13.0 and 2.15.0.

# bfloat16: 2.1 raises "Invalid scalar type" on every op. Drop when torch>=2.2 is the floor.
GLOO_HAS_BFLOAT16: bool = _version_at_least(2, 2)

# Flat all_gather into one tensor (all_gather_into_tensor / _all_gather_base): 2.1 raises "no support
# for _allgather_base in Gloo process group". Drop when torch>=2.2 is the floor.
GLOO_HAS_ALL_GATHER_INTO_TENSOR: bool = _version_at_least(2, 2)

# reduce_scatter, list form: "ProcessGroupGloo does not support reduce_scatter" before 2.8, and on 2.8
# it ignores the reduce op and always sums (wrong results; fixed in 2.9). The tensor form
# (reduce_scatter_tensor) is missing on 2.1 and has the same always-sum bug on 2.2-2.8. Neither is
# claimed before 2.9: hwdist emulates reduce_scatter with all_reduce there. Drop when torch>=2.9 is the floor.
GLOO_HAS_REDUCE_SCATTER: bool = _version_at_least(2, 9)

# all_to_all, list form: "Backend gloo does not support alltoall" before 2.12 (measured: fails on 2.1.2,
# 2.4.1 and 2.11.0, works on 2.13.0 and 2.15.0 for pieces of one size only). all_to_all_single works on
# every supported version, even and uneven splits, for every dtype gloo moves (measured on 2.1.2, 2.4.1,
# 2.13.0 and 2.15.0, 2 and 3 ranks), so gloo claims it everywhere (its flat_ops) and this gates only
# the list form. Drop when torch>=2.12 is the floor.
GLOO_HAS_ALL_TO_ALL_LIST: bool = _version_at_least(2, 12)

# init_process_group(device_id=...) binds eagerly; torch>=2.3. Drop when torch>=2.3 is the floor.
INIT_HAS_DEVICE_ID: bool = DIST_AVAILABLE and _has_param(_dist.init_process_group, "device_id")


@functools.lru_cache(maxsize=None)
def init_accepts_device_id(device_type: str) -> bool:
    """Whether ``init_process_group(device_id=<device_type>:0)`` passes torch's own check.

    torch 2.3-2.4 take only CUDA devices there (measured: 2.4.1 refuses, 2.8.0 takes any
    accelerator). torch's check is read from its source and evaluated once per device type.
    Drop when torch>=2.8 is the floor.
    """
    if not INIT_HAS_DEVICE_ID:
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(_dist.distributed_c10d._new_process_group_helper)))
    except (AttributeError, OSError, TypeError, SyntaxError):
        return True
    probe = types.SimpleNamespace(type=device_type, index=0)
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
        if names == {"device_id"} and any(isinstance(s, ast.Raise) for s in node.body):
            try:
                return not eval(
                    compile(ast.Expression(node.test), "<torch>", "eval"), {}, {"device_id": probe}
                )
            except Exception:  # an unexpected check: let torch itself decide
                return True
    return True


# Backend.register_backend(devices=...) maps a custom backend to device types; torch>=2.2.
# Drop when torch>=2.2 is the floor.
REGISTER_BACKEND_HAS_DEVICES: bool = DIST_AVAILABLE and _has_param(_dist.Backend.register_backend, "devices")


# destroy_process_group() hangs intermittently on torch < 2.8: ProcessGroupGloo's destructor joins its
# worker threads while holding the GIL, and a worker still freeing the last tensor of a finished collective
# waits for the GIL (gdb on 2.1.2: main thread in ~ProcessGroupGloo -> std::thread::join, worker in
# ~TensorImpl -> gil_scoped_acquire). Releasing the GIL for a moment first lets the worker finish: 40 of 40
# re-initialisations passed with a 0.05 s pause where a few hung without it.
# Drop when torch>=2.8 is the floor.
DESTROY_GIL_PAUSE_S: float = 0.0 if _version_at_least(2, 8) else 0.1


def _pick(*names: str) -> Optional[Callable[..., Any]]:
    if not DIST_AVAILABLE:
        return None
    for name in names:
        fn = getattr(_dist, name, None)
        if fn is not None:
            return fn
    return None


# Flat all_gather into one tensor: all_gather_single (2.13+, which deprecates
# all_gather_into_tensor), else all_gather_into_tensor. Drop the fallback when torch>=2.13 is the floor.
all_gather_into_tensor = _pick("all_gather_single", "all_gather_into_tensor")

# Flat reduce_scatter: reduce_scatter_single (2.13+, which deprecates reduce_scatter_tensor),
# else reduce_scatter_tensor. Drop the fallback when torch>=2.13 is the floor.
reduce_scatter_tensor = _pick("reduce_scatter_single", "reduce_scatter_tensor")


# torch.distributed.is_xccl_available (Intel XPU's oneCCL backend) exists from torch 2.7; XPU
# wheels ship XCCL from 2.8. None before 2.7. Drop when torch>=2.7 is the floor.
is_xccl_available = _pick("is_xccl_available")


def all_gather_into_tensor_by_list(
    output: torch.Tensor, input: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """``all_gather_into_tensor`` through the list form, for backends without the flat one.

    Gloo lacks the flat form on torch 2.1.

    Drop when every backend hwdist drives has the flat form (gloo: torch>=2.2 as the floor).
    """
    rows = output.view(_dist.get_world_size(group), input.numel())  # the group's size: input may be empty
    return _dist.all_gather(list(rows.unbind(0)), input.reshape(-1), group, async_op)


def register_torch_backend(
    name: str, factory: Callable[..., Any], devices: list[str], extended_api: bool = False
) -> None:
    """Register a process-group creator with torch (``devices=`` where supported).

    ``extended_api``: ``factory`` takes torch's ``(_DistributedBackendOptions, group options)``
    (only where ``EXTENDED_BACKEND_API``), else ``(store, rank, size, timeout)``.
    """
    register: Any = _dist.Backend.register_backend
    extra = {"extended_api": True} if extended_api else {}
    if REGISTER_BACKEND_HAS_DEVICES:
        register(name, factory, devices=devices, **extra)
    else:  # torch<2.2: the backend serves every device. Drop when torch>=2.2 is the floor.
        register(name, factory, **extra)


def torch_knows_backend(name: str) -> bool:
    """Whether torch already has a backend registered under ``name``."""
    return DIST_AVAILABLE and name.lower() in _dist.Backend.backend_list


def default_group() -> Any:
    """The default process group object, or None before init (cheap)."""
    return _dist.GroupMember.WORLD


#: What a ``group`` argument may be besides None: a process group (none exist without distributed support).
GROUP_TYPES: tuple[type, ...] = (_dist.ProcessGroup,) if DIST_AVAILABLE else ()
#: torch's sentinel for a group this rank is not a member of (``new_group`` returns it there).
NON_GROUP_MEMBER: Any = _dist.GroupMember.NON_GROUP_MEMBER if DIST_AVAILABLE else None


def group_store(group: Any) -> Optional[Any]:
    """The store ``group`` (None: the default group) was created with, or None where torch hides it.

    torch keeps it in its private group table: ``_get_process_group_store``
    where torch has it, ``_world.pg_map`` otherwise. hwdist uses it only as a
    side channel for failure notices, so None just means no notices.
    """
    if not DIST_AVAILABLE:
        return None
    from torch.distributed import distributed_c10d as c10d

    pg = group if group is not None else default_group()
    try:
        getter = getattr(c10d, "_get_process_group_store", None)
        if getter is not None:
            return getter(pg)
        return c10d._world.pg_map[pg][1]  # older torch. Drop when every supported torch has the getter.
    except (AttributeError, KeyError, TypeError):
        return None


# Store.check (is every key set, without waiting) is missing on the PrefixStore a process group keeps on
# torch 2.1 (2.1.2: AttributeError; 2.4.1 and later have it; 2.2/2.3 not measured). Without it, a wait of
# 1 ms per call answers the same (checked on 2.1.2's TCPStore: a timed-out wait leaves the connection
# usable). Drop when torch>=2.4 is the floor.
# Whether torch.compile / torch.export is tracing now (dynamo reads it as True then): public from torch 2.3.
# Verification's header round is skipped while tracing (its bytes would be traced, not exchanged). Before
# 2.3 nothing is traced through hwdist's collectives here. Drop the fallback when torch>=2.3 is the floor.
_IS_COMPILING: Optional[Callable[[], bool]] = getattr(getattr(torch, "compiler", None), "is_compiling", None)
#: Whether this torch tells hwdist that torch.compile is tracing (torch >= 2.3); before it, verify=False
#: (or verification off) around compiled code is the user's to set (docs/collectives.md).
HAS_IS_COMPILING: bool = _IS_COMPILING is not None
is_compiling: Callable[[], bool] = _IS_COMPILING or (lambda: False)

STORE_HAS_CHECK: bool = DIST_AVAILABLE and hasattr(_dist.PrefixStore, "check")


def store_check(store: Any, keys: list[str]) -> bool:
    """Whether every key in ``keys`` is set in ``store``, without blocking for more than a millisecond."""
    if STORE_HAS_CHECK or hasattr(store, "check"):
        return bool(store.check(keys))
    import datetime

    try:
        store.wait(keys, datetime.timedelta(milliseconds=1))
    except RuntimeError:  # a timeout: some key is not set yet
        return False
    return True


# ---------------------------------------------------------------------------
# A pass-through issued on the process group object itself
# torch.accelerator (torch>=2.6) names the accelerator this torch was built for, or a registered
# PrivateUse1 extension (a vendor's device). current_accelerator() without check_available reads that at
# compile time and initialises no device (check_available=True, from 2.7, calls the device module's
# is_available, which initialises CUDA unless PYTORCH_NVML_BASED_CUDA_CHECK=1). Its device_count() is not
# used: on 2.6 it is a C++ call that initialises CUDA; the device module's own count (NVML-based on CUDA)
# is. None before 2.6. Drop the fallback when torch>=2.6 is the floor.
_current_accelerator: Optional[Callable[[], Any]] = getattr(
    getattr(torch, "accelerator", None), "current_accelerator", None
)


def accelerator_type() -> Optional[str]:
    """The device type of torch's current accelerator (``torch.accelerator``), or None: torch < 2.6, or no
    accelerator built in or registered. Never initialises a device."""
    if _current_accelerator is None:
        return None
    try:
        device = _current_accelerator()
    except RuntimeError:  # a broken device extension must not crash detection
        return None
    return None if device is None else str(device.type)


def default_backend_for_device(device_type: str) -> Optional[str]:
    """The backend torch uses on ``device_type`` when ``init_process_group()`` names none, or None.

    torch's ``Backend.default_device_backend_map`` (what ``get_default_backend_for_device``, torch>=2.6,
    reads; ``Backend.register_backend(devices=...)`` adds a vendor's device to it).
    """
    if not DIST_AVAILABLE:
        return None
    found = getattr(_dist.Backend, "default_device_backend_map", {}).get(device_type)
    return None if found is None else str(found)


# --- torch's safe globals and per-group collective hooks (used by weights_only= and hwdist.flight)

# torch.serialization.add_safe_globals / safe_globals / get_safe_globals: torch>=2.4. Drop when torch>=2.4
# is the floor.
HAS_SAFE_GLOBALS: bool = hasattr(torch.serialization, "get_safe_globals")


def torch_safe_globals() -> list[Any]:
    """The types the user registered with ``torch.serialization.add_safe_globals`` (``[]`` before 2.4)."""
    return list(torch.serialization.get_safe_globals()) if HAS_SAFE_GLOBALS else []


# ProcessGroup.register_pre_hook / register_post_hook (PreHookArgs: name, async_op, input_tensors,
# output_tensors, root, op_id; PostHookArgs: name, async_op, work, op_id): torch>=2.14. Drop when
# torch>=2.14 is the floor.
PG_HAS_HOOKS: bool = DIST_AVAILABLE and hasattr(_dist.ProcessGroup, "register_pre_hook")


# --- what torch knows of a process group and of its backends (registry.resolve, the generic driver) ---

# get_backend_config(group): the group's device-to-backend map as torch's string ('cpu:gloo,cuda:nccl'),
# torch>=2.1 (every supported torch has it; kept as a probe for builds without it).
_get_backend_config: Optional[Callable[..., str]] = _pick("get_backend_config")


def group_backend_config(group: Any) -> Optional[str]:
    """torch's device-to-backend string of ``group`` (``get_backend_config``), or None where torch has
    none for it (no such function, or a group torch does not list)."""
    if _get_backend_config is None:
        return None
    try:
        return str(_get_backend_config(group))
    except (ValueError, RuntimeError, KeyError, AttributeError, TypeError):
        return None


def group_device_types(group: Any) -> list[str]:
    """The device types ``group`` has a backend for (``ProcessGroup._device_types``), in torch's order;
    [] where torch does not say (a Python process group replaces torch's own and lists none)."""
    try:
        return [str(getattr(d, "type", d)) for d in group._device_types]
    except (AttributeError, RuntimeError, TypeError):
        return []


def torch_backend_devices(name: str) -> list[str]:
    """The device types torch says backend ``name`` serves (``Backend.backend_capability``), or []."""
    if not DIST_AVAILABLE:
        return []
    return list(getattr(_dist.Backend, "backend_capability", {}).get(name.lower(), []))


def torch_backend_creator(name: str) -> Optional[Callable[..., Any]]:
    """The creator a third party registered with torch for backend ``name``
    (``Backend.register_backend``), or None (a backend built into torch, or none)."""
    if not DIST_AVAILABLE:
        return None
    plugin = getattr(_dist.Backend, "_plugins", {}).get(name.upper())
    return getattr(plugin, "creator_fn", None)


def replace_torch_backend_creator(name: str, creator: Callable[..., Any]) -> None:
    """Swap the creator torch keeps for third-party backend ``name`` (its private ``Backend._plugins``
    table; the ``extended_api`` flag is kept). hwdist wraps a creator only to name the backend when the
    creator raises."""
    plugins: Any = getattr(_dist.Backend, "_plugins", None)
    plugin = None if plugins is None else plugins.get(name.upper())
    if plugin is not None and hasattr(plugin, "_replace"):
        plugins[name.upper()] = plugin._replace(creator_fn=creator)


# Backend._ensure_backend_registered(name): torch>=2.14 loads a backend from the entry-point group
# 'torch.distributed.backends' the first time its name is used. Before 2.14 a backend is known once its
# package registered it (usually on import). Drop the check when torch>=2.14 is the floor.
_ensure_registered: Optional[Callable[[str], None]] = (
    getattr(_dist.Backend, "_ensure_backend_registered", None) if DIST_AVAILABLE else None
)


def load_torch_backend(name: str) -> bool:
    """Whether torch knows backend ``name``, after letting torch (>= 2.14) load it from its entry points.

    Raises:
        RuntimeError: the entry point torch found for ``name`` failed to load (torch's own error).
    """
    if not DIST_AVAILABLE:
        return False
    if not torch_knows_backend(name) and _ensure_registered is not None:
        _ensure_registered(name)
    return torch_knows_backend(name)


# Backend.register_backend(extended_api=True): the creator gets torch's _DistributedBackendOptions (store,
# group_rank, group_size, timeout, group_id, global_ranks_in_group) and the group's options, as torch's own
# backends do. Every supported torch has it (2.1 included); a probe all the same.
EXTENDED_BACKEND_API: bool = (
    DIST_AVAILABLE
    and _has_param(_dist.Backend.register_backend, "extended_api")
    and hasattr(_dist.distributed_c10d, "_DistributedBackendOptions")
)

# torch's rule for the device of a call without a tensor (object collectives, barrier):
# distributed_c10d._get_object_coll_device, torch>=2.2 (2.1 has the same rule in _get_pg_default_device).
# hwdist applies the rule itself, to torch's own map of the group (registry._no_tensor_device); this is
# only read by the tests that compare the two. Drop when torch>=2.2 is the floor.
object_coll_device: Optional[Callable[[Any], str]] = (
    getattr(_dist.distributed_c10d, "_get_object_coll_device", None) if DIST_AVAILABLE else None
)

# init_process_group() without a backend: from torch 2.6 torch picks the backend of the accelerator it was
# built for (torch.accelerator) and 'cpu:gloo' without one. Before, it created every backend its build has
# ('cpu:gloo,cuda:nccl' on a CUDA wheel), which fails on a machine without a GPU (measured: torch 2.1.2's
# CUDA wheel raises "ProcessGroupNCCL is only supported with GPUs, no GPUs found!"). Needs a process group
# to probe, so by version. Drop when torch>=2.6 is the floor.
INIT_WITHOUT_BACKEND_PER_DEVICE: bool = _version_at_least(2, 6)


def torch_groups() -> list[Any]:
    """Every process group torch has made in this process (its private map; [] where it has none)."""
    world = getattr(getattr(_dist, "distributed_c10d", None), "_world", None)
    pg_map = getattr(world, "pg_map", None)
    return [g for g in (pg_map or {}) if isinstance(g, GROUP_TYPES)]


def torch_group_count() -> int:
    """How many process groups torch has made (cheap: no list is built)."""
    world = getattr(getattr(_dist, "distributed_c10d", None), "_world", None)
    return len(getattr(world, "pg_map", None) or ())



# torch 2.15: torch's NCCL backend name builds ProcessGroupNCCL2 (on torchcomms) unless
# TORCH_DIST_USE_NCCL2=0 picks the older ProcessGroupNCCL; other names of the engines are registered beside
# it (torch/distributed/distributed_c10d.py, _register_builtin_nccl_backend; hwdist/drivers/nccl.py lists
# them). Can go: never while torch keeps two engines behind one name.
HAS_NCCL_ENGINES: bool = hasattr(getattr(_dist, "distributed_c10d", None), "_register_builtin_nccl2_backend")


def nccl_engine() -> Optional[str]:
    """The process group class torch's NCCL backend name builds on torch >= 2.15: 'ProcessGroupNCCL2'
    (torchcomms) or 'ProcessGroupNCCL', chosen by TORCH_DIST_USE_NCCL2 as torch reads it; None where
    torch has one engine."""
    import os

    if not HAS_NCCL_ENGINES:
        return None
    return "ProcessGroupNCCL" if os.environ.get("TORCH_DIST_USE_NCCL2") == "0" else "ProcessGroupNCCL2"


def group_destroyed(group: Any) -> bool:
    """Whether torch no longer knows process group ``group``: destroyed (``destroy_process_group(group)``,
    or every group at once), so no collective can run on it. Read from torch's private table of groups
    (cheap: one dict lookup); False where torch keeps none (nothing to tell)."""
    world = getattr(getattr(_dist, "distributed_c10d", None), "_world", None)
    pg_map = getattr(world, "pg_map", None)
    return pg_map is not None and group not in pg_map


# --- when torch makes a process group (the flight recorder starts with the group) ---
# torch has no callback for a new process group. Every group torch makes goes through the private
# _new_process_group_helper (init_process_group, new_group, new_subgroups, DeviceMesh), and the default
# group is then installed by _update_default_pg (torch 2.1 to 2.15 have both; split_group on 2.15 does
# not use the helper). watch_group_creation wraps the two module-level names, calling torch's function
# first and the callback after it: torch's behaviour and return values are unchanged, and a callback that
# fails is swallowed. A torch without them: nothing is wrapped (the recorder then starts at the first
# hwdist call, as before). Not a version fallback: it stays until torch offers a creation callback.
_GROUP_WATCH: list[Callable[[Any, bool], None]] = []


def _watching(name: str, default: bool) -> None:
    from torch.distributed import distributed_c10d as c10d

    original = getattr(c10d, name, None)
    if original is None or getattr(original, "__hwdist_watch__", False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        pg = args[0] if default and args else (out[0] if isinstance(out, tuple) and out else out)
        if default and pg is None:
            return out  # destroy_process_group clears the default group through the same function
        for callback in list(_GROUP_WATCH):
            try:
                callback(pg, default)
            except Exception:
                pass
        return out

    wrapper.__hwdist_watch__ = True  # type: ignore[attr-defined]
    setattr(c10d, name, wrapper)


def watch_group_creation(callback: Callable[[Any, bool], None]) -> bool:
    """Call ``callback(group, is_default)`` after torch makes a process group; whether it could be watched.

    ``is_default``: the group was just installed as the default group (``is_initialized()`` is now True).
    """
    if not DIST_AVAILABLE:
        return False
    from torch.distributed import distributed_c10d as c10d

    if not (hasattr(c10d, "_new_process_group_helper") and hasattr(c10d, "_update_default_pg")):
        return False
    if callback not in _GROUP_WATCH:
        _GROUP_WATCH.append(callback)
    _watching("_new_process_group_helper", False)
    _watching("_update_default_pg", True)
    return True


# --- torch's own flight recorder (torch>=2.15 records every collective of a group whose backend records
# itself (gloo, xccl, ...) and, through FlightRecorderHook, of the other groups). _dump_fr_trace_json(
# includeCollectives, onlyActive, backend) returns one backend's ring as JSON: "entries" with
# collective_seq_id, profiling_name ("<backend>:all_reduce"), process_group [name, desc], input_sizes,
# input_dtypes, time_created_ns (wall clock), retired (the work completed), thread_id; measured on 2.15 CPU
# gloo: 0.6 ms for a short ring. torch's own trace tools read the same. Probed by name; None before 2.15.
# Drop the probe when torch>=2.15 is the floor.
_FR_DUMP_JSON: Optional[Callable[..., Any]] = None
if DIST_AVAILABLE:
    try:
        from torch._C import _distributed_c10d as _c10d_c

        _FR_DUMP_JSON = getattr(_c10d_c, "_dump_fr_trace_json", None)
    except ImportError:
        pass
#: Whether torch's own flight recorder can be read (measured: 2.13 and 2.15 CPU gloo record; 2.1 has none).
TORCH_FR: bool = _FR_DUMP_JSON is not None
#: 2.15 takes the backend whose ring to dump; 2.13 takes (includeCollectives, onlyActive) and dumps gloo's.
TORCH_FR_PER_BACKEND: bool = "backend" in str(getattr(_FR_DUMP_JSON, "__doc__", "") or "")


def torch_fr_dump(backend: str) -> Optional[dict[str, Any]]:
    """torch's flight-recorder ring of ``backend`` as a dict, or None where torch has none or it fails.

    Where torch dumps one ring whatever the backend (2.13), every name returns that ring.
    """
    if _FR_DUMP_JSON is None:
        return None
    import json

    try:
        raw = _FR_DUMP_JSON(True, False, backend) if TORCH_FR_PER_BACKEND else _FR_DUMP_JSON(True, False)
        return dict(json.loads(raw.decode() if isinstance(raw, bytes) else raw))
    except Exception:
        return None


def group_name(group: Any) -> Optional[str]:
    """torch's name of ``group`` (the key its flight recorder files entries under), or None."""
    world = getattr(getattr(_dist, "distributed_c10d", None), "_world", None)
    names = getattr(world, "pg_names", None) or {}
    try:
        return names.get(group)
    except TypeError:
        return None


# Backends written in Python (hwdist.backend): torch 2.15 made torch._C._distributed_c10d.Backend a
# pybind trampoline (PyBackend), so a Python subclass registered with register_backend(extended_api=True)
# has its overrides (allreduce, all_gather_single, ...) called by ProcessGroup; dist._Work is the Work a
# Python backend may return. Before 2.15 the class exists but ProcessGroup never calls a Python override,
# and whether it does cannot be probed without a process group, so the version decides, with the two
# types checked. These are the only private torch names hwdist.backend uses.
# Drop the check when torch>=2.15 is the floor.
PYTHON_BACKENDS_TORCH = (2, 15)


def _python_backend_bases() -> tuple[Any, Any]:
    if not DIST_AVAILABLE:
        return None, None
    from torch._C import _distributed_c10d as _c10d_c

    return getattr(_c10d_c, "Backend", None), getattr(_dist, "_Work", None)


_PY_BACKEND, _PY_WORK = _python_backend_bases()
PYTHON_BACKENDS: bool = (
    _version_at_least(*PYTHON_BACKENDS_TORCH) and _PY_BACKEND is not None and _PY_WORK is not None
)


def python_backend_types() -> tuple[Any, Any]:
    """``(Backend, Work)``: torch's base classes of a Python backend and of the Work it returns.

    Raises:
        RuntimeError: this torch has no Python backends (``PYTHON_BACKENDS`` is False).
    """
    if not PYTHON_BACKENDS:
        need = ".".join(map(str, PYTHON_BACKENDS_TORCH))
        raise RuntimeError(f"torch {torch.__version__} has no Python backends (torch >= {need})")
    return _PY_BACKEND, _PY_WORK


def torch_backend_plugin(name: str) -> Optional[tuple[Callable[..., Any], bool]]:
    """``(creator, extended_api)`` torch keeps for backend ``name`` (its ``Backend._plugins`` table, which
    holds torch's own backends too from 2.14, loaded from its entry points on first use), or None."""
    if not DIST_AVAILABLE:
        return None
    plugins = getattr(_dist.Backend, "_plugins", {})
    if name.upper() not in plugins and _ensure_registered is not None:
        _ensure_registered(name)  # torch >= 2.14 registers even its own backends on first use
    plugin = plugins.get(name.upper())
    creator = getattr(plugin, "creator_fn", None)
    if creator is None:
        return None
    return creator, bool(getattr(plugin, "extended_api", False))
