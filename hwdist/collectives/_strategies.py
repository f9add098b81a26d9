"""Each tensor collective's strategy: its plan, its wire buffers, its finish, its serial result.

A strategy never calls torch.distributed: ``to_wire`` names the torch op (``call.native``) and fills the
buffers, the engine issues it, ``finish`` copies back and builds the result; ``serial`` is the op without a
process group (mmengine's semantics). The gathers and ``all_to_all`` may move different sizes on each rank:
they agree on the sizes in the one header round first (docs/collectives.md, docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ..drivers.base import Driver, Plan, byte_carrier
from ..drivers.tuning import gather_by_broadcast_floor, tuning
from ..errors import CollectiveArgumentError, CollectiveMismatch
from . import protocol, verify
from . import wire as _wire
from .engine import Call, Strategy, issue, wire_call
from .protocol import Header
from .wire import as_comm_flat, byte_view, comm_numel, copy_bytes, copy_source, dense_flat, exact_mean
from .wire import finish_reduction, from_comm, itemsize, prepare, reduction_send, restore, split_mean
from .wire import torch_op

Tensor = torch.Tensor


class AllReduce(Strategy):
    """all_reduce: in place; the mean's division and the copy back after it."""

    op = "all_reduce"
    direct = True

    def to_wire(self, c: Call) -> None:
        # an int64 mean's send buffer as quotients and remainders (wire.split_mean)
        c.send, c.aliased = reduction_send(c.data, c.plan, c.cdev, c.view.size)
        c.torch_op = torch_op(c.plan)
        c.native = c.plan.native_op if self.op == "reduce" else "all_reduce"

    def finish(self, c: Call) -> None:
        if self.op == "all_reduce" or c.view.rank == c.root:
            finish_reduction(c.data, c.send, c.plan, c.view.size, c.aliased)


class Reduce(AllReduce):
    """reduce to ``root``; an all_reduce where the backend has no reduce (the plan says so)."""

    op = "reduce"
    direct = False


class Broadcast(Strategy):
    """broadcast from ``root``, in place."""

    op = "broadcast"
    direct = True

    def to_wire(self, c: Call) -> None:
        c.send, c.aliased = prepare(c.data, c.plan, c.cdev)
        c.native = "broadcast"

    def finish(self, c: Call) -> None:
        if not c.aliased and c.view.rank != c.root:
            restore(c.data, c.send, c.plan)


class Scatter(Strategy):
    """scatter from ``root`` (``extra``: the scatter_list); without a native scatter, one broadcast of
    every row. A wrong list on the root still joins the collective, with a failure flag in every row (a
    status slot as wide as one element of data, so byte views stay aligned): every rank raises."""

    op = "scatter"

    def to_wire(self, c: Call) -> None:
        g, plan, data, cdev = c.view, c.plan, c.data, c.cdev
        ws = g.size
        device = cdev if cdev is not None else data.device
        n = comm_numel(data.shape, plan)
        h = itemsize(plan.dtype) // itemsize(plan.comm_dtype) if plan.view else 1
        error: Optional[Exception] = None  # src's own, raised there with its type once the others know
        rows: Optional[Tensor] = None
        if g.rank == c.root:
            items: list[Tensor] = []
            try:
                items = _wire.check_tensor_list(c.extra, "scatter_list", "scatter", ws, data)
                _wire.check_shapes(items, data, "scatter_list", "scatter")
            except (TypeError, ValueError) as exc:
                error = exc
            rows = torch.zeros((ws, h + n), dtype=plan.comm_dtype, device=device)
            if error is None:
                for i, t in enumerate(items):
                    rows[i, h:].copy_(copy_source(t, plan, cdev))
            else:
                rows[:, 0] = 1
        c.native = plan.native_op
        if c.native == "scatter":
            c.recv = torch.empty(h + n, dtype=plan.comm_dtype, device=device)
            c.send = list(rows.unbind(0)) if rows is not None else None
        else:  # emulated: one broadcast of every row
            whole = rows
            if whole is None:
                whole = torch.empty((ws, h + n), dtype=plan.comm_dtype, device=device)
            c.send, c.recv = whole, whole[g.index(g.rank)]
        c.state = (error, h)

    def finish(self, c: Call) -> None:
        error, h = c.state
        if error is not None:
            raise error
        if bool(c.recv[0].item()):
            raise ValueError(
                f"scatter: the scatter_list given on src rank {c.root} was invalid"
                f" (see the error on rank {c.root})"
            )
        restore(c.data, c.recv[h:], c.plan)

    def serial(self, data: Optional[Tensor], extra: Any) -> None:
        assert data is not None
        items = _wire.check_tensor_list(extra, "scatter_list", "scatter", 1, data)
        with torch.no_grad():
            data.copy_(items[0])


class ReduceScatter(Strategy):
    """reduce_scatter (``extra``: the checked input list); an all_reduce of the whole input plus a slice
    where the backend has no reduce_scatter."""

    op = "reduce_scatter"

    def to_wire(self, c: Call) -> None:
        g, plan, output, cdev = c.view, c.plan, c.data, c.cdev
        ws = g.size
        device = cdev if cdev is not None else output.device
        flat = torch.empty((ws, comm_numel(output.shape, plan)), dtype=plan.comm_dtype, device=device)
        for i, t in enumerate(c.extra):
            flat[i].copy_(copy_source(t, plan, cdev))
        c.native = plan.native_op
        c.torch_op = torch_op(plan)
        if exact_mean(plan):  # quotients and remainders (see split_mean): rows twice as wide
            flat = split_mean(flat, ws)
            if c.native == "reduce_scatter":
                c.send, c.recv, c.aliased = list(flat.unbind(0)), flat.new_empty(flat.shape[1]), False
                return
        if c.native == "reduce_scatter":
            out_buf, c.aliased = prepare(output, plan, cdev)
            c.send, c.recv = list(flat.unbind(0)), out_buf.reshape(-1)
        else:
            c.send, c.recv, c.aliased = flat, flat[g.index(g.rank)], False

    def finish(self, c: Call) -> None:
        finish_reduction(c.data, c.recv, c.plan, c.view.size, c.aliased)

    def serial(self, data: Optional[Tensor], extra: Any) -> None:
        assert data is not None
        with torch.no_grad():
            data.copy_(extra[0])


class Barrier(Strategy):
    """barrier: no data."""

    op = "barrier"

    def plan(self, driver: Driver, data: Any, rop: Optional[str]) -> Plan:
        return _BARRIER_PLAN

    def to_wire(self, c: Call) -> None:
        c.native = "barrier"


_BARRIER_PLAN = Plan("barrier", "barrier", torch.uint8, torch.uint8)


class PointToPoint(Strategy):
    """send / recv with ``root`` the partner (None: any sender); ``extra`` is (function name, tag)."""

    def __init__(self, op: str) -> None:
        self.op = op

    def to_wire(self, c: Call) -> None:
        c.send, c.aliased = prepare(c.data, c.plan, c.cdev)
        c.native = self.op
        c.tag = c.extra[1]

    def finish(self, c: Call) -> Optional[int]:
        if self.op == "send":
            return None
        if not c.aliased:
            restore(c.data, c.send, c.plan)
        if c.work is None:  # synchronous: torch's recv gave the sender
            return int(c.state)
        return int(c.root) if c.root is not None else int(c.work._source_rank())

    def serial(self, data: Optional[Tensor], extra: Any) -> None:
        raise RuntimeError(f"{extra[0]} needs a process group: call hwdist.init_dist(...) first")



# ---------------------------------------------------------------------------
# the gathers: sizes agreed in the header round
# ---------------------------------------------------------------------------
_GRANULE = 64  # the broadcasts' slots are multiples of this (any dtype's view stays aligned)

_REAL_OF_COMPLEX = {torch.complex64: torch.float32, torch.complex128: torch.float64}
if hasattr(torch, "complex32"):
    _REAL_OF_COMPLEX[torch.complex32] = torch.float16


def _raise_if_dtypes_differ(fn: str, headers: Sequence[Header], kind: type[Exception] = TypeError) -> None:
    """The dtypes differ: the same ``kind`` of error, naming each rank's dtype, on every rank."""
    if len({h.dtype for h in headers}) > 1:
        raise kind(
            f"{fn}: every rank must pass the same dtype; got "
            + ", ".join(f"rank {h.rank}: {protocol.dtype_name(h.dtype)}" for h in headers)
        )


def gathered_numels(data: Tensor, group: Any, driver: Driver, fn: str) -> list[int]:
    """Every rank's ``data.numel()`` (one header round); the same TypeError on every rank when the dtypes
    differ."""
    headers = protocol.exchange(Header.of_tensor(data, 0), group, driver)
    _raise_if_dtypes_differ(fn, headers)
    return [h.numel for h in headers]


def _shapes(headers: Sequence[Header], data: Tensor, group: Any, driver: Driver) -> list[torch.Size]:
    """Every rank's shape; a shape of more than 8 dims costs one more small exchange (rare)."""
    if all(h.shape is not None for h in headers):
        return [h.shape for h in headers]  # type: ignore[misc]
    width = max(h.ndim for h in headers)
    rows = protocol.gather_ints((list(data.shape) + [0] * width)[:width], group, driver)
    return [torch.Size(rows[r][: h.ndim]) for r, h in enumerate(headers)]


def _sized(b: Tensor, width: int) -> Tensor:
    """``b`` (uint8) itself when it has ``width`` bytes, else a zero-padded (or cut) copy."""
    if b.numel() == width:
        return b
    out = b.new_empty(width)
    n = min(b.numel(), width)
    copy_bytes(out[:n], b[:n])
    out[n:].zero_()
    return out


def _round(n: int, k: int) -> int:
    return max(-(-n // k) * k, k)


class Gather(Strategy):
    """all_gather (``root`` None) or gather to ``root``; uneven shapes through the size agreement.

    ``extra`` is ``(same_shape, async_op)``. With ``same_shape`` nothing is agreed (the caller's promise), as
    in mmengine.
    """

    def __init__(self, op: str, direct: bool = False) -> None:
        self.op = op
        self.direct = direct  # only with same_shape=True: no exchange, so a pass-through needs nothing else

    def plan(self, driver: Driver, data: Any, rop: Optional[str]) -> Plan:
        plan = driver.plan(self.op, data.dtype)
        if plan.native_op == "gather" and data.is_complex() and not plan.view:
            # torch.distributed.gather, unlike all_gather, does not view complex tensors as real pairs
            # (gloo: "Invalid scalar type"): travel as the real pairs' (planned) dtype, a byte-exact view
            real = driver.plan(self.op, _REAL_OF_COMPLEX[data.dtype])
            plan = dataclasses.replace(plan, comm_dtype=real.comm_dtype, view=True)
        return plan

    # -- to wire ---------------------------------------------------------------------------------
    def to_wire(self, c: Call) -> None:
        g, plan, data = c.view, c.plan, c.data
        ws = g.size
        if ws == 1:
            c.state = None
            return  # nothing to communicate: finish returns [data]
        same_shape = c.extra[0] if isinstance(c.extra, tuple) else bool(c.extra)
        buf, _ = prepare(data, plan, c.cdev)
        nbytes = buf.numel() * buf.element_size()
        big = tuning(c.driver).gather_by_broadcast_min_bytes if c.root is None else 0
        if same_shape:
            if big and nbytes >= big:
                self._broadcasts(c, buf, [nbytes] * ws, [data.shape] * ws)
            else:
                self._same_shape(c, buf)
            return
        head = Header.of_tensor(data, nbytes)
        fields: dict[str, Any] = {"data": verify.describe_dtype(data), "same_shape": False}
        if c.root is not None:
            fields["dst"] = c.root
        st = verify.stamp(self.op, c.group, fields)
        if st is not None:
            head = verify.call_header(
                self.op, st, nbytes=nbytes, dtype=head.dtype, numel=head.numel, ndim=head.ndim, dims=head.dims
            )
        headers = protocol.exchange(head, c.group, c.driver)
        if st is not None:
            verify.raise_if_mismatch(self.op, headers, st, c.group, c.driver)
        _raise_if_dtypes_differ(self.op, headers)
        shapes = _shapes(headers, data, c.group, c.driver)
        sizes = [h.nbytes for h in headers]
        if big and max(sizes) >= big:
            self._broadcasts(c, buf, sizes, shapes)
        else:
            self._explicit(c, buf, sizes, shapes)

    def _explicit(self, c: Call, buf: Tensor, sizes: list[int], shapes: list[torch.Size]) -> None:
        """Every rank's bytes padded to the largest, by the plan's native op for the byte carrier; an
        all_gather receives into one flat tensor (the engine falls back to the list form)."""
        carrier = byte_carrier(c.driver, self.op)
        width, ws = _round(max(sizes), itemsize(carrier)), len(sizes)
        c.native = c.driver.plan(self.op, carrier).native_op
        c.send = _sized(byte_view(buf), width).view(carrier)
        flat = None
        if c.root is None or c.view.rank == c.root or c.native == "all_gather":
            flat = torch.empty(ws * width // itemsize(carrier), dtype=carrier, device=buf.device)
            if c.native == "all_gather":
                c.native, c.recv = "all_gather_flat", flat
            else:
                c.recv = list(flat.chunk(ws))
        c.state = ("explicit", sizes, shapes, flat)

    def _same_shape(self, c: Call, buf: Tensor) -> None:
        g = c.view
        keep = c.root is None or g.rank == c.root
        c.native = c.plan.native_op
        c.send = buf
        c.recv = [torch.empty_like(buf) for _ in range(g.size)] if keep or c.native == "all_gather" else None
        c.state = ("same", keep)

    def _broadcasts(self, c: Call, buf: Tensor, sizes: list[int], shapes: Sequence[torch.Size]) -> None:
        """One broadcast per rank of exactly its bytes into one flat buffer (gloo's fast large all_gather)."""
        g = c.view
        carrier = byte_carrier(c.driver, "broadcast")
        widths = [_round(n, _GRANULE) for n in sizes]  # every slot aligned for any dtype's view
        flat = torch.empty(sum(widths), dtype=torch.uint8, device=buf.device)
        slots = list(flat.split(widths))
        me = g.index(g.rank)
        mine = byte_view(buf)
        copy_bytes(slots[me][: mine.numel()], mine)
        ranks = g.ranks()
        for r, slot in enumerate(slots):
            root = r if ranks is None else ranks[r]
            issue(wire_call(c.group, "broadcast", send=slot.view(carrier), root=root))
        c.native = None  # already moved
        c.state = ("broadcasts", sizes, list(shapes), slots)

    # -- finish ----------------------------------------------------------------------------------
    def finish(self, c: Call) -> list[Tensor]:
        if c.state is None:
            return [c.data]
        route = c.state[0]
        if route == "same":
            if not c.state[1]:
                return []
            plan, data = c.plan, c.data
            if not plan.cast and c.cdev is None:
                return c.recv  # type: ignore[no-any-return]
            return [from_comm(o, plan, data.shape, data.device) for o in c.recv]
        if route == "broadcasts":
            _, sizes, shapes, slots = c.state
            return self._results(c, [s[:n] for s, n in zip(slots, sizes)], shapes)
        _, sizes, shapes, flat = c.state  # explicit
        if flat is None or not (c.root is None or c.view.rank == c.root):
            return []
        rows = flat.view(torch.uint8).view(len(sizes), -1)
        return self._results(c, [row[:n] for row, n in zip(rows, sizes)], shapes)

    def _results(self, c: Call, payloads: Sequence[Tensor], shapes: Sequence[torch.Size]) -> list[Tensor]:
        plan, data = c.plan, c.data
        if plan.passthrough and c.cdev is None:  # the common case: views of the received bytes
            dtype = plan.dtype
            return [p.view(dtype).view(s) if p.numel() else torch.empty(s, dtype=dtype, device=p.device)
                    for p, s in zip(payloads, shapes)]
        out = []
        for p, s in zip(payloads, shapes):
            n = comm_numel(s, plan)
            wire = p.view(plan.comm_dtype) if n else torch.empty(0, dtype=plan.comm_dtype, device=p.device)
            out.append(from_comm(wire[:n], plan, s, data.device))
        return out

    def serial(self, data: Optional[Tensor], extra: Any) -> list[Tensor]:
        assert data is not None
        return [data]


# ---------------------------------------------------------------------------
# all_to_all
# ---------------------------------------------------------------------------

_OP = "all_to_all"


def _piece_size_errors(table: list[list[int]], ws: int) -> list[str]:
    """Disagreements in a size table (row j: rank j's send sizes, then its receive sizes)."""
    return [
        f"rank {j} sends {table[j][r]} elements to rank {r}, which expects {table[r][ws + j]}"
        for j in range(ws)
        for r in range(ws)
        if table[j][r] != table[r][ws + j]
    ]


def _table(c: Call, in_sizes: list[int], out_sizes: list[int], st: Optional[verify.Stamp]) -> list[list[int]]:
    """Every rank's split table from one header round (verified when ``st``), checked: the same error on
    every rank (a table too long for the inline bytes, over 52 ranks, costs one more small exchange)."""
    ws = c.view.size
    sizes = np.array(in_sizes + out_sizes, dtype="<i8").view(np.uint8)
    fits = sizes.size <= protocol.INLINE_BYTES
    head = protocol.Header(op=protocol.op_code(_OP), dtype=protocol.dtype_code(c.data.dtype))
    if st is not None:
        head.seq, head.fingerprint, head.site = st.seq, st.fingerprint, st.site
    head.inline = sizes if fits else None
    headers = protocol.exchange(head, c.group, c.driver)
    if st is not None:
        verify.raise_if_mismatch(_OP, headers, st, c.group, c.driver)
    _raise_if_dtypes_differ(_OP, headers, CollectiveArgumentError)
    if fits:
        table = [h.inline.copy().view("<i8").tolist() for h in headers]
    else:
        table = protocol.gather_ints(in_sizes + out_sizes, c.group, c.driver)
    bad = "; ".join(_piece_size_errors(table, ws)[:4])
    if bad and st is not None:
        raise CollectiveMismatch(
            f"collective mismatch in 'all_to_all' across ranks (verification): piece sizes do not match:"
            f" {bad}"
        )
    if bad:
        raise CollectiveArgumentError(f"all_to_all: piece sizes do not match across ranks: {bad}")
    return table


class AllToAll(Strategy):
    """all_to_all: picks one of the routes below for each call (the same on every rank)."""

    op = _OP

    def choose(self, c: Call) -> Strategy:
        ins, outs = c.extra
        in_sizes = [comm_numel(t.shape, c.plan) for t in ins]
        out_sizes = [comm_numel(t.shape, c.plan) for t in outs]
        listed = c.plan.native_op == "all_to_all"  # torch's list form
        flat = listed or "all_to_all" in c.driver.caps.flat_ops  # all_to_all_single
        st = verify.stamp(_OP, c.group, verify.TensorFields.all_to_all(outs, ins, check=True)[2] or {})
        if c.view.size == 1:  # nothing to agree on
            c.state = (in_sizes, out_sizes)
            return EQUAL if listed and in_sizes == out_sizes else SPLIT if flat else EMULATED_ONE
        if flat and st is None:
            # torch's contract: every rank's output tensors give the sizes it receives, so a backend with
            # an all_to_all needs no agreement (one collective, the data never staged on the host);
            # verification checks the split tables first, in its header round
            table = [in_sizes + out_sizes]
        else:
            table = _table(c, in_sizes, out_sizes, st)
            if not flat:
                c.state = table
                return EMULATED
        c.state = (in_sizes, out_sizes)
        first = table[0][0]
        return EQUAL if listed and all(n == first for row in table for n in row) else SPLIT

    def serial(self, data: Optional[Tensor], extra: Any) -> None:
        ins, outs = extra
        with torch.no_grad():
            outs[0].copy_(ins[0].reshape(outs[0].shape))


class _Equal(Strategy):
    """Every piece of every rank has one size: torch's list form."""

    op = _OP

    def to_wire(self, c: Call) -> None:
        ins, outs = c.extra
        # flat (views where the tensors are contiguous): torch's list form wants one shape, and pieces
        # of one size may differ in shape ((1,) and (1, 1), or 0-d)
        c.send = [dense_flat(prepare(t, c.plan, c.cdev)[0]) for t in ins]
        prepared = [prepare(t, c.plan, c.cdev) for t in outs]
        c.recv = [dense_flat(b) for b, _ in prepared]
        c.state = [aliased for _, aliased in prepared]
        c.native = "all_to_all"

    def finish(self, c: Call) -> None:
        for t, b, aliased in zip(c.extra[1], c.recv, c.state):
            if not aliased:
                restore(t, b, c.plan)


class _Split(Strategy):
    """Pieces of different sizes, known on every rank: one flat buffer each way with split sizes."""

    op = _OP

    def to_wire(self, c: Call) -> None:
        ins, _ = c.extra
        in_sizes, out_sizes = c.state
        device = c.cdev if c.cdev is not None else ins[0].device
        c.send = torch.cat([as_comm_flat(t, c.plan, c.cdev) for t in ins])
        c.recv = torch.empty(sum(out_sizes), dtype=c.plan.comm_dtype, device=device)
        c.splits = (out_sizes, in_sizes)
        c.native = "all_to_all_single"

    def finish(self, c: Call) -> None:
        for t, piece in zip(c.extra[1], c.recv.split(c.splits[0])):
            restore(t, piece, c.plan)


class _Emulated(Strategy):
    """No all_to_all, the table known on every rank: all_gather every rank's pieces."""

    op = _OP

    def to_wire(self, c: Call) -> None:
        ins, _ = c.extra
        g, plan = c.view, c.plan
        ws = g.size
        table = c.state if c.state is not None else [[comm_numel(t.shape, plan) for t in ins] * 2]
        width = max(sum(row[:ws]) for row in table)
        device = c.cdev if c.cdev is not None else ins[0].device
        mine = torch.empty(width, dtype=plan.comm_dtype, device=device)
        pos = 0
        for t in ins:
            k = comm_numel(t.shape, plan)
            mine[pos : pos + k].copy_(copy_source(t, plan, c.cdev))
            pos += k
        c.send = mine
        c.recv = [torch.empty_like(mine) for _ in range(ws)]
        c.state = (table, g.index(g.rank))
        c.native = "all_gather"

    def finish(self, c: Call) -> None:
        table, me = c.state
        for j, out in enumerate(c.extra[1]):
            off = sum(table[j][:me])
            restore(out, c.recv[j][off : off + table[j][me]], c.plan)


class _EmulatedOne(Strategy):
    """A one-rank group without all_to_all: the piece is this rank's own."""

    op = _OP

    def to_wire(self, c: Call) -> None:
        c.native = None

    def finish(self, c: Call) -> None:
        ins, outs = c.extra
        restore(outs[0], as_comm_flat(ins[0], c.plan, c.cdev), c.plan)


ALL_TO_ALL = AllToAll()
EQUAL = _Equal()
SPLIT = _Split()
EMULATED = _Emulated()
EMULATED_ONE = _EmulatedOne()


ALL_REDUCE = AllReduce()
REDUCE = Reduce()
BROADCAST = Broadcast()
class AllGather(Gather):
    """``all_gather``: the size agreement, or with ``same_shape=True`` a pass-through where it can be one."""

    picks = True

    def pick(self, data: Any, extra: Any) -> Strategy:
        if not extra[0]:  # shapes may differ: agree on sizes
            return self
        if 0 < gather_by_broadcast_floor() <= data.numel() * data.element_size():
            return ALL_GATHER_SAME_SHAPE_LARGE  # no pass-through: the driver may take the broadcasts
        return ALL_GATHER_SAME_SHAPE


ALL_GATHER = AllGather("all_gather")  # extra: (same_shape, async_op)
ALL_GATHER_SAME_SHAPE = Gather("all_gather", direct=True)  # the engine may issue a pass-through directly
ALL_GATHER_SAME_SHAPE_LARGE = Gather("all_gather")  # same_shape=True at a size where broadcasts may win
GATHER = Gather("gather")
SCATTER = Scatter()
REDUCE_SCATTER = ReduceScatter()
BARRIER = Barrier()
SEND = PointToPoint("send")
RECV = PointToPoint("recv")
