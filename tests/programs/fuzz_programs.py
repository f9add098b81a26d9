"""A seeded generator of random collective programs, and the runner every rank executes.

A program is a list of steps built from ``(seed, world size, backend)`` alone, so every rank builds
the same one. Steps come in runs of one op whose sizes follow a stream (repeat, grow, shrink,
alternate, random) so the size predictions are exercised; inputs are dense, one-element strided
(``x[:, 0]`` of a batch of one), empty with stride 0, 0-d, non-contiguous or transposed; some steps
run on a subgroup. Every value is a small integer (exact in every dtype), made from
``(seed, step, rank)``, so each rank recomputes what every rank sent and the expected result.
Where torch supports the call (gloo, dtypes and shapes torch takes), the same call through raw
``torch.distributed`` must give the same result.

With ``edges=True`` about a third of the steps are edge shapes drawn from a second stream of the
same seed (the other steps are those of ``edges=False``): object payloads around the 1 KiB record
and large enough to grow a group's records (``gather_object`` and ``all_gather_object`` of bytes), and
``all_reduce_dict`` with a NaN key under ``max``/``min`` in dicts of one key to a large tensor, each
key compared with ``hwdist.all_reduce`` of it alone and, on gloo, with raw torch's.

``run_program`` returns the mismatches (empty when the program ran right); the tests are
``test_fuzz``, ``test_fuzz_long`` and ``test_fuzz_edges`` in tests/collectives/test_tensor.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as torch_dist

import hwdist

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
    torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
]
TENSOR_OPS = ["all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter",
              "all_to_all"]
OBJECT_OPS = ["all_gather_object", "broadcast_object_list", "all_reduce_dict"]
STREAMS = ["repeat", "grow", "shrink", "alternate", "random"]
KINDS = ["dense", "dense", "dense", "one", "empty", "scalar", "strided", "transposed"]
#: ops whose every rank passes one shape
SAME_SHAPE = {"all_reduce", "reduce", "broadcast", "scatter", "reduce_scatter", "all_reduce_dict"}
#: dtypes the emulated accelerator cannot reduce (no lossless widening)
EMU_NO_REDUCE = {torch.int64}
#: edge shapes (``edges=True``): object payloads in bytes around the 1 KiB record (960 bytes inline) and
#: past gather_object's 384 KiB record cap, and all_reduce_dict's NaN keys in dicts of each size
EDGE_OPS = ["gather_object", "all_gather_object_bytes", "all_reduce_dict_nan"]
EDGE_BYTES = [100, 900, 960, 1000, 1100, 3000, 5000, 40_000]
GROWING_BYTES = 500_000  # all_gather_object only: grows the group's records past gather_object's cap
DICT_SIZES = ["one key", "two keys", "64 keys", "large tensor"]


@dataclass
class Step:
    """One collective call of a program (the same on every rank)."""

    index: int
    op: str
    dtype: torch.dtype
    kind: str
    rop: str
    group: Optional[tuple[int, ...]]  # global ranks; None: the default group
    root: int  # a global rank of the group
    sizes: dict[int, int] = field(default_factory=dict)  # rank -> element count (its own piece)
    pair: dict[tuple[int, int], int] = field(default_factory=dict)  # all_to_all: (src, dst) -> count

    def describe(self) -> str:
        g = "world" if self.group is None else f"group {list(self.group)}"
        return (f"step {self.index}: {self.op}({self.dtype}, {self.kind}, op={self.rop}, root={self.root}, "
                f"{g}, sizes={self.sizes or self.pair})")


def _size(stream: str, base: int, i: int, rank: int, rng: random.Random) -> int:
    if stream == "repeat":
        return base
    if stream == "grow":
        return base + 3 * i + rank
    if stream == "shrink":
        return max(base + 30 - 4 * i - rank, 0)
    if stream == "alternate":
        return base if i % 2 else 5 * base + 40 + rank
    return rng.randint(0, 70)


def _rops(dtype: torch.dtype) -> list[str]:
    if dtype == torch.bool:
        return ["max", "min"]
    if dtype.is_complex:
        return ["sum", "mean"]
    return ["sum", "max", "min", "mean"]


def _edge_step(rng: random.Random, groups: list[Optional[tuple[int, ...]]], ws: int) -> Step:
    """One edge step (its index is set by the caller)."""
    op = rng.choice(EDGE_OPS)
    group = rng.choice(groups)
    members = list(group) if group is not None else list(range(ws))
    root = rng.choice(members)  # gather_object's dst; all_reduce_dict_nan: the rank holding the NaN
    if op == "all_reduce_dict_nan":
        dtype = rng.choice([torch.float32, torch.float64])
        return Step(0, op, dtype, rng.choice(DICT_SIZES), rng.choice(["max", "min"]), group, root)
    step = Step(0, op, torch.uint8, "dense", "sum", group, root)
    sizes = EDGE_BYTES + ([GROWING_BYTES] if op == "all_gather_object_bytes" else [])
    step.sizes = {r: rng.choice(sizes) for r in members}
    return step


def generate(seed: int, ws: int, backend: str, steps: int, edges: bool = False) -> list[Step]:
    """The program of ``seed`` for ``ws`` ranks on ``backend``: ``steps`` calls in runs of one op
    (``edges``: with edge steps from a second stream of the seed between them)."""
    program = _generate(seed, ws, backend, steps)
    if not edges:
        return program
    rng = random.Random(f"edges/{seed}/{ws}/{backend}")
    groups: list[Optional[tuple[int, ...]]] = [None, None, None] + ([(0, 1), (1, 2)] if ws >= 3 else [])
    out: list[Step] = []
    for step in program:
        if rng.random() < 0.35:
            out.append(_edge_step(rng, groups, ws))
        out.append(step)
    return [dataclasses.replace(step, index=i) for i, step in enumerate(out[:steps])]


def _generate(seed: int, ws: int, backend: str, steps: int) -> list[Step]:
    rng = random.Random(f"{seed}/{ws}/{backend}")
    groups: list[Optional[tuple[int, ...]]] = [None, None, None]
    if ws >= 3:
        groups += [(0, 1), (1, 2), (0, 2)]
    out: list[Step] = []
    while len(out) < steps:
        op = rng.choice(TENSOR_OPS * 3 + OBJECT_OPS)
        dtype = rng.choice(DTYPES)
        reduces = op in ("all_reduce", "reduce", "reduce_scatter", "all_reduce_dict")
        if reduces and backend == "emu" and dtype in EMU_NO_REDUCE:
            dtype = torch.int32
        rop = rng.choice(_rops(dtype)) if reduces else "sum"
        if op == "all_reduce_dict" and rop == "mean" and dtype == torch.int64:
            rop = "sum"  # all_reduce_dict sums an int64 mean in int64 (docs/collectives.md)
        group = rng.choice(groups)
        members = list(group) if group is not None else list(range(ws))
        stream, base = rng.choice(STREAMS), rng.choice([0, 1, 2, 5, 17, 64, 300])
        run = rng.randint(2, 6)
        for i in range(run):
            kind = rng.choice(KINDS)
            step = Step(len(out), op, dtype, kind, rop, group, rng.choice(members))
            for r in members:
                n = _size(stream, base, i, 0 if op in SAME_SHAPE else r, rng)
                step.sizes[r] = n
            if op in SAME_SHAPE:  # the random stream drew one size per rank: keep the first
                first = step.sizes[members[0]]
                step.sizes = {r: first for r in members}
            if op == "all_to_all":
                step.pair = {(a, b): _size(stream, base, i, a + 2 * b, rng) for a in members for b in members}
            out.append(step)
            if len(out) == steps:
                break
    return out


# ---------------------------------------------------------------------------
# values, every rank's alike
# ---------------------------------------------------------------------------
def values(dtype: torch.dtype, n: int, *key: Any) -> torch.Tensor:
    """``n`` small integer values of ``dtype``, the same for the same key on every rank."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()  # not hash(): salted per process
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    if dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, n).astype(bool))
    lo = 0 if dtype == torch.uint8 else -9
    re = torch.from_numpy(rng.integers(lo, 10, n).astype(np.float64))
    if dtype.is_complex:
        im = torch.from_numpy(rng.integers(-9, 10, n).astype(np.float64))
        return torch.complex(re, im).to(dtype)
    return re.to(dtype)


def shaped(flat: torch.Tensor, kind: str) -> torch.Tensor:
    """``flat``'s values in the layout ``kind`` (its element count is kept where the kind allows)."""
    n = flat.numel()
    if kind == "one" and n == 1:  # x[:, 0] of a batch of one: shape (1,), stride (4,)
        big = torch.zeros(1, 4, dtype=flat.dtype)
        big[:, 0] = flat
        return big[:, 0]
    if kind == "empty" and n == 0:  # an empty array from numpy: stride 0
        return torch.empty(0, dtype=flat.dtype).as_strided((0,), (0,))
    if kind == "scalar" and n == 1:
        return flat.reshape(())
    if kind == "strided" and n:
        buf = torch.zeros(2 * n, dtype=flat.dtype)
        buf[::2] = flat
        return buf[::2]
    if kind == "transposed" and n and n % 2 == 0:
        return flat.reshape(n // 2, 2).t().contiguous().t()  # the same values in C order, strides (1, n/2)
    return flat.clone()


def _kind_size(step: Step, n: int) -> int:
    # kinds that need a size: "one" and "scalar" one element, "empty" none
    return {"one": 1, "scalar": 1, "empty": 0}.get(step.kind, n)


def _input(step: Step, seed: int, rank: int, *extra: Any) -> torch.Tensor:
    n = _kind_size(step, step.sizes[rank])
    return shaped(values(step.dtype, n, seed, step.index, rank, *extra), step.kind)


def _reduced(ts: list[torch.Tensor], rop: str, dtype: torch.dtype) -> torch.Tensor:
    wide = torch.complex128 if dtype.is_complex else torch.float64
    stack = torch.stack([t.reshape(-1).to(wide) for t in ts])
    if rop == "sum":
        out = stack.sum(0)
    elif rop == "mean":
        out = stack.sum(0) / len(ts)
        if not (dtype.is_floating_point or dtype.is_complex):
            out = torch.floor(out)
    elif rop == "max":
        out = stack.max(0).values
    else:
        out = stack.min(0).values
    return out.to(dtype).reshape(ts[0].shape)


def _same(got: Any, want: torch.Tensor, approx: bool = False) -> bool:
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
        return False
    if approx and (want.is_floating_point() or want.is_complex()):  # a mean of small ints, in half types
        return torch.allclose(got.to(torch.complex128 if want.is_complex() else torch.float64),
                              want.to(torch.complex128 if want.is_complex() else torch.float64), atol=2e-2)
    return torch.equal(got.contiguous(), want.contiguous())


def _all_same(got: Any, want: list[torch.Tensor]) -> bool:
    return isinstance(got, list) and len(got) == len(want) and all(_same(a, w) for a, w in zip(got, want))


# ---------------------------------------------------------------------------
# the runner
# ---------------------------------------------------------------------------
_GROUPS: dict[tuple[Any, tuple[int, ...]], Any] = {}


def _group(ranks: Optional[tuple[int, ...]]) -> Any:
    if ranks is None:
        return None
    key = (id(torch_dist.distributed_c10d._get_default_group()), ranks)
    if key not in _GROUPS:
        _GROUPS[key] = hwdist.new_group(list(ranks))
    return _GROUPS[key]


#: dtypes raw torch's gloo reduces; raw torch is compared only there
_TORCH_GLOO = {torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.int8}
_TORCH_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def _payload(step: Step, seed: int, rank: int) -> bytes:
    return values(torch.uint8, step.sizes[rank], seed, step.index, rank).numpy().tobytes()


def _nan_dict(step: Step, rank: int) -> dict[str, torch.Tensor]:
    dt = step.dtype
    data = {"a": torch.tensor(math.nan if rank == step.root else 0.5, dtype=dt)}
    if step.kind == "two keys":
        data["b"] = torch.tensor(float(rank), dtype=dt)
    elif step.kind == "64 keys":
        data.update({f"k{i:02d}": torch.tensor(float(rank + i), dtype=dt) for i in range(63)})
    elif step.kind == "large tensor":
        data["big"] = torch.arange(4096, dtype=dt) + rank
    return data


def _same_nan(got: torch.Tensor, want: torch.Tensor) -> bool:
    both = torch.equal(got.isnan(), want.isnan())
    return got.dtype == want.dtype and both and torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


def _edge(step: Step, seed: int, rank: int, members: list[int], g: Any, backend: str) -> list[str]:
    """An edge step (``EDGE_OPS``); the mismatches."""
    bad: list[str] = []
    if step.op == "all_reduce_dict_nan":
        d = _nan_dict(step, rank)
        alone = d["a"].clone()
        hwdist.all_reduce_dict(d, step.rop, g)
        own = alone.clone()
        hwdist.all_reduce(own, step.rop, g)
        if not _same_nan(d["a"], own):
            bad.append(f"all_reduce_dict gave {d['a'].item()} for key 'a', hwdist.all_reduce {own.item()}")
        if backend == "gloo":
            raw = alone.clone()
            torch_dist.all_reduce(raw, getattr(torch_dist.ReduceOp, _TORCH_OPS[step.rop]), group=g)
            if not _same_nan(own, raw):
                bad.append(f"hwdist.all_reduce gave {own.item()}, raw torch {raw.item()}")
    else:
        want = [_payload(step, seed, q) for q in members]
        if step.op == "gather_object":
            got = hwdist.gather_object(_payload(step, seed, rank), step.root, g)
            ok = got == want if rank == step.root else got is None
        else:
            got = hwdist.all_gather_object(_payload(step, seed, rank), g)
            ok = got == want
        if not ok:
            lens = [len(x) if isinstance(x, bytes) else repr(x)[:20] for x in got] if got else got
            bad.append(f"got payloads of {lens} bytes")
    return [f"{step.describe()}: {what}"[:400] for what in bad]


def _step(step: Step, seed: int, rank: int, ws: int, backend: str) -> list[str]:
    members = list(step.group) if step.group is not None else list(range(ws))
    if rank not in members:
        return []
    g = _group(step.group)
    if step.op in EDGE_OPS:
        return _edge(step, seed, rank, members, g, backend)
    op, dt = step.op, step.dtype
    x = _input(step, seed, rank)
    inputs = {q: _input(step, seed, q) for q in members}
    bad: list[str] = []
    raw = backend == "gloo" and dt in _TORCH_GLOO and step.kind in ("dense",)

    def expect(ok: bool, what: str) -> None:
        if not ok:
            bad.append(f"{step.describe()}: {what}"[:400])

    if op in ("all_reduce", "reduce"):
        want = _reduced([inputs[q] for q in members], step.rop, dt)
        approx = step.rop == "mean"
        if op == "all_reduce":
            hwdist.all_reduce(x, step.rop, g)
            expect(_same(x, want, approx), f"got {x} want {want}")
        else:
            hwdist.reduce(x, step.root, step.rop, g)
            expect(_same(x, want, approx) or rank != step.root, f"got {x} want {want}")
        if raw and step.rop in _TORCH_OPS and op == "all_reduce":
            y = inputs[rank].clone()
            torch_dist.all_reduce(y, getattr(torch_dist.ReduceOp, _TORCH_OPS[step.rop]), group=g)
            expect(torch.equal(x.contiguous(), y), f"differs from torch: {x} vs {y}")
    elif op == "broadcast":
        hwdist.broadcast(x, step.root, g)
        expect(_same(x, inputs[step.root]), f"got {x}")
        if raw:
            y = inputs[rank].clone()
            torch_dist.broadcast(y, step.root, group=g)
            expect(torch.equal(x.contiguous(), y), "differs from torch")
    elif op == "all_gather":
        got = hwdist.all_gather(x, g)
        expect(_all_same(got, [inputs[q] for q in members]), "wrong")
        if raw and len({inputs[q].shape for q in members}) == 1:
            ys = [torch.empty_like(inputs[rank]) for _ in members]
            torch_dist.all_gather(ys, inputs[rank].clone(), group=g)
            expect(all(torch.equal(a.contiguous(), b) for a, b in zip(got, ys)), "differs from torch")
    elif op == "gather":
        got = hwdist.gather(x, step.root, g)
        if rank == step.root:
            expect(_all_same(got, [inputs[q] for q in members]), "wrong")
        else:
            expect(got == [], f"non-root got {got!r}")
    elif op == "scatter":
        pieces = [_input(step, seed, step.root, "piece", j) for j in members] if rank == step.root else None
        hwdist.scatter(x, pieces, step.root, g)
        expect(_same(x, _input(step, seed, step.root, "piece", rank)), f"got {x}")
    elif op == "reduce_scatter":
        ins = [_input(step, seed, rank, "piece", j) for j in members]
        hwdist.reduce_scatter(x, ins, step.rop, g)
        want = _reduced([_input(step, seed, q, "piece", rank) for q in members], step.rop, dt)
        expect(_same(x, want, step.rop == "mean"), f"got {x} want {want}")
    elif op == "all_to_all":
        def piece(a: int, b: int, zero: bool = False) -> torch.Tensor:
            n = step.pair[(a, b)]
            flat = torch.zeros(n, dtype=dt) if zero else values(dt, n, seed, step.index, a, b)
            return shaped(flat, step.kind if n in (0, 1) else "dense")

        outs = [piece(q, rank, zero=True) for q in members]
        hwdist.all_to_all(outs, [piece(rank, q) for q in members], g)
        expect(all(_same(o, piece(q, rank)) for o, q in zip(outs, members)), "wrong")
    elif op == "all_gather_object":
        obj = {"t": x, "s": f"r{rank}" * (step.sizes[rank] % 7), "n": step.sizes[rank]}
        if dt != torch.bfloat16:
            obj["a"] = x.numpy() if x.dtype != torch.bool else x.numpy().copy()
        got = hwdist.all_gather_object(obj, g)
        assert got is not None
        ok = len(got) == len(members)
        for o, q in zip(got, members):
            ok = ok and _same(o["t"], inputs[q]) and o["n"] == step.sizes[q]
            if "a" in o:
                a = inputs[q].numpy()
                ok = ok and np.array_equal(o["a"], a) and o["a"].dtype == a.dtype and o["a"].shape == a.shape
        expect(ok, "wrong")
    elif op == "broadcast_object_list":
        box = [{"t": x, "i": rank}, rank]
        hwdist.broadcast_object_list(box, step.root, g)
        root = step.root
        expect(_same(box[0]["t"], inputs[root]) and box[1] == root and box[0]["i"] == root, "wrong")
    elif op == "all_reduce_dict":
        d = {"a": x, "b": _input(step, seed, rank, "b")}
        hwdist.all_reduce_dict(d, step.rop, g)
        want_a = _reduced([inputs[q] for q in members], step.rop, dt)
        want_b = _reduced([_input(step, seed, q, "b") for q in members], step.rop, dt)
        approx = step.rop == "mean"
        expect(_same(d["a"], want_a, approx) and _same(d["b"], want_b, approx), f"got {d}")
    return bad


def run_program(seed: int, steps: int, edges: bool = False) -> list[str]:
    """Run program ``seed`` on this rank; the mismatches (stops at the first step that raises)."""
    rank, ws, backend = hwdist.get_rank(), hwdist.get_world_size(), hwdist.get_backend()
    program = generate(seed, ws, backend, steps, edges)
    for ranks in sorted({s.group for s in program if s.group is not None}):
        _group(ranks)  # every rank creates the groups, in one order
    bad: list[str] = []
    for step in program:
        try:
            bad += _step(step, seed, rank, ws, backend)
        except Exception as exc:  # reported with the step; the other ranks fail too
            bad.append(f"{step.describe()}: raised {type(exc).__name__}: {exc}")
            break
    return bad
