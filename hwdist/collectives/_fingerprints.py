"""What verification mode compares for each tensor collective (``hwdist.verify``).

Each function takes the collective's own arguments and returns ``(group,
sample, fields)``: the group, a tensor of the call (it picks the driver the
digest travels with) and the fields every rank must agree on. They run only
while verification mode is on (the engine's hook), before the argument checks,
so a rank with bad arguments still takes part and every rank raises.
Point-to-point calls are not fingerprinted: they have one partner, not the
whole group (docs/reliability.md).
"""

from __future__ import annotations

from typing import Any, Optional

from .verify import describe_dtype, describe_tensor, rank_field
from ._args import op_field

Fields = tuple[Any, Any, dict[str, Any]]


def _many(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [describe_tensor(t) for t in value]
    return describe_tensor(value)


def all_reduce(data: Any, op: Any = "sum", group: Optional[Any] = None, *, async_op: bool = False) -> Fields:
    return group, data, {"data": describe_tensor(data), "reduce_op": op_field(op)}


def reduce(
    data: Any, dst: Any = 0, op: Any = "sum", group: Optional[Any] = None, *, async_op: bool = False
) -> Fields:
    return group, data, {"data": describe_tensor(data), "reduce_op": op_field(op), "dst": rank_field(dst)}


def broadcast(data: Any, src: Any = 0, group: Optional[Any] = None, *, async_op: bool = False) -> Fields:
    return group, data, {"data": describe_tensor(data), "src": rank_field(src)}


def all_gather(
    data: Any, group: Optional[Any] = None, *, same_shape: bool = False, async_op: bool = False
) -> Fields:
    desc = describe_tensor(data) if same_shape else describe_dtype(data)
    return group, data, {"data": desc, "same_shape": bool(same_shape)}


def gather(
    data: Any, dst: Any = 0, group: Optional[Any] = None, *, same_shape: bool = False, async_op: bool = False
) -> Fields:
    desc = describe_tensor(data) if same_shape else describe_dtype(data)
    return group, data, {"data": desc, "same_shape": bool(same_shape), "dst": rank_field(dst)}


def pad_to_largest_tensor(tensor: Any, group: Optional[Any] = None) -> Fields:
    return group, tensor, {"tensor": describe_dtype(tensor)}


def scatter(
    data: Any, scatter_list: Any = None, src: Any = 0, group: Optional[Any] = None, *, async_op: bool = False
) -> Fields:
    return group, data, {"data": describe_tensor(data), "src": rank_field(src)}


def reduce_scatter(
    output: Any, input_list: Any, op: Any = "sum", group: Optional[Any] = None, *, async_op: bool = False
) -> Fields:
    fields = {"output": describe_tensor(output), "input": _many(input_list), "reduce_op": op_field(op)}
    return group, output, fields


def all_to_all(
    output_list: Any, input_list: Any, group: Optional[Any] = None, *, async_op: bool = False
) -> Fields:
    # piece sizes may differ by design: dtype and count here, sizes in the transport (_alltoall)
    first = input_list[0] if isinstance(input_list, (list, tuple)) and input_list else input_list
    pieces = [len(x) if isinstance(x, (list, tuple)) else type(x).__name__ for x in (input_list, output_list)]
    return group, first, {"input": describe_dtype(first), "pieces": pieces}


def barrier(group: Optional[Any] = None) -> Fields:
    return group, None, {}
