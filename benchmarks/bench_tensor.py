"""hwdist tensor collectives vs raw torch.distributed, measured in the same run.

Two gloo ranks (hwdist.testing.RankPool). Every case times hwdist and the
raw torch.distributed equivalent *interleaved* (sample A, sample B, B, A, ...)
after a barrier, and reports rank 0's median and min time per call, the median of
the per-sample ratios hwdist / raw (each pair ran back to back, so load drift
on a shared machine cancels) and the ratio of the minimums. Nothing here asserts a speed.

Usage::

    python -m benchmarks.bench_tensor [--quick] [--passthrough | --dict | --header] [--json PATH]

``--passthrough`` runs only the pass-through rows (the engine's fast path:
``all_reduce``, ``broadcast``, ``all_gather(same_shape=True)``, sync and async,
each with the raw call timed against itself as the noise floor of that case);
``--dict`` only the ``all_reduce_dict`` rows; ``--header`` what verification's header round
costs, at 2 and 3 ranks: ``all_reduce`` verified (the default) against raw torch and against raw
torch plus one raw header round (an all_gather of 1 KiB per rank), and with ``verify=False``
against raw torch, each with the raw call against itself as the noise floor.

Cases: all_reduce 4 KiB / 1 MiB / 64 MiB, mean, all_gather (with and without
the shape exchange), broadcast, all_reduce_dict of 20 metrics vs a
hand-flattened torch all_reduce (plus the hand-flattened code against itself,
the noise floor of a ratio here; with a busy-wait as long as hwdist's extra
CPU time, what that time alone does to the latency here; and both with the
collective stubbed out, the deterministic CPU cost), all_reduce_params on ResNet-50 shapes
(coalesced, bucketed, one by one) vs the flat-buffer limit, and the per-call
overhead on a 1-element tensor (2 ranks, and a 1-rank group where the raw
call is cheapest so the wrapper's own cost shows).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as tdist

import hwdist

from ._common import KiB, MiB, bench_main, fmt_us, measure


def resnet50_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of torchvision's ResNet-50 (161 tensors, 25.6 M floats)."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,)]
            shapes += [(planes, planes, 3, 3), (planes,), (planes,)]
            shapes += [(planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    shapes += [(1000, 2048), (1000,)]
    return shapes


def _row(label: str, times: dict[str, list[float]], ours: str, raw: str) -> dict[str, Any]:
    a, b = times[ours], times[raw]
    return {
        "case": label,
        "hwdist_median_us": statistics.median(a) * 1e6,
        "hwdist_min_us": min(a) * 1e6,
        "raw_median_us": statistics.median(b) * 1e6,
        "raw_min_us": min(b) * 1e6,
        # median of per-sample ratios: each pair ran back to back, so load drift cancels
        "ratio": statistics.median(x / y for x, y in zip(a, b)),
        "ratio_min": min(a) / min(b),
    }


def _iters_for(nbytes: int, quick: bool) -> tuple[int, int]:
    if nbytes >= 16 * MiB:
        return 1, (3 if quick else 9)
    if nbytes >= MiB:
        return (5 if quick else 8), (5 if quick else 15)
    return (50 if quick else 100), (5 if quick else 21)


def bench_rank(quick: bool) -> list[dict[str, Any]]:
    """Runs on every rank; returns the table rows (rank 0's timings)."""
    ws = tdist.get_world_size()
    rows: list[dict[str, Any]] = []

    # ---- all_reduce sum / mean ---------------------------------------------------
    sizes = [4 * KiB, MiB] + ([] if quick else [64 * MiB])
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        iters, samples = _iters_for(nbytes, quick)
        times = measure(
            {"hw": lambda: hwdist.all_reduce(t), "raw": lambda: tdist.all_reduce(t)}, iters, samples
        )
        rows.append(_row(f"all_reduce sum {_size(nbytes)}", times, "hw", "raw"))
    for nbytes in (4 * KiB, MiB):
        t = torch.ones(nbytes // 4)
        iters, samples = _iters_for(nbytes, quick)

        def raw_mean() -> None:
            tdist.all_reduce(t)
            t.div_(ws)

        times = measure({"hw": lambda: hwdist.all_reduce(t, "mean"), "raw": raw_mean}, iters, samples)
        rows.append(_row(f"all_reduce mean {_size(nbytes)} (raw: sum + div_)", times, "hw", "raw"))

    # ---- all_gather / broadcast ---------------------------------------------------
    for nbytes in (4 * KiB, MiB):
        t = torch.ones(nbytes // 4)
        iters, samples = _iters_for(nbytes * ws, quick)

        def raw_gather() -> None:
            out = [torch.empty_like(t) for _ in range(ws)]
            tdist.all_gather(out, t)

        times = measure(
            {
                "hw": lambda: hwdist.all_gather(t),
                "hw_same": lambda: hwdist.all_gather(t, same_shape=True),
                "raw": raw_gather,
            },
            iters,
            samples,
        )
        rows.append(_row(f"all_gather {_size(nbytes)} (shape exchange)", times, "hw", "raw"))
        rows.append(_row(f"all_gather {_size(nbytes)} same_shape=True", times, "hw_same", "raw"))
    for nbytes in (4 * KiB, MiB):
        t = torch.ones(nbytes // 4)
        iters, samples = _iters_for(nbytes, quick)
        cases = {"hw": lambda: hwdist.broadcast(t, 0), "raw": lambda: tdist.broadcast(t, 0)}
        if nbytes < MiB:
            cases["raw_busy"] = _busy_first(5e-6, lambda: tdist.broadcast(t, 0))
        times = measure(cases, iters, samples)
        rows.append(_row(f"broadcast {_size(nbytes)}", times, "hw", "raw"))
        if nbytes < MiB:
            rows.append(
                _row("control: raw broadcast 4 KiB with a 5 us busy-wait first", times, "raw_busy", "raw")
            )

    rows += bench_dict(quick)

    # ---- all_reduce_params on ResNet-50 shapes ----------------------------------------------
    params = [torch.ones(s) for s in resnet50_shapes()]
    total = sum(p.numel() for p in params)
    flat_limit = torch.ones(total)
    samples = 3 if quick else 7
    times = measure(
        {
            "coalesced": lambda: hwdist.all_reduce_params(params),
            "bucket25": lambda: hwdist.all_reduce_params(params, bucket_size_mb=25),
            "flat": lambda: tdist.all_reduce(flat_limit),
            **({} if quick else {"one_by_one": lambda: hwdist.all_reduce_params(params, coalesce=False)}),
        },
        1,
        samples,
    )
    label = f"ResNet-50 params ({len(params)} tensors, {total * 4 / MiB:.0f} MiB)"
    rows.append(_row(f"all_reduce_params {label} coalesced vs flat buffer", times, "coalesced", "flat"))
    rows.append(_row("all_reduce_params bucket_size_mb=25 vs flat buffer", times, "bucket25", "flat"))
    if not quick:
        rows.append(_row("all_reduce_params coalesce=False vs flat buffer", times, "one_by_one", "flat"))

    # ---- per-call overhead on a 1-element tensor --------------------------------------------
    one = torch.ones(1)
    iters, samples = (100 if quick else 200), (7 if quick else 31)
    times = measure(
        {"hw": lambda: hwdist.all_reduce(one), "raw": lambda: tdist.all_reduce(one)}, iters, samples
    )
    row = _row("all_reduce 1 element, 2 ranks", times, "hw", "raw")
    row["overhead_us"] = row["hwdist_median_us"] - row["raw_median_us"]
    rows.append(row)
    return rows


def bench_dict(quick: bool) -> list[dict[str, Any]]:
    """The all_reduce_dict rows (runs on every rank): hwdist vs the hand-flattened raw code, with controls."""
    ws = tdist.get_world_size()
    rank = tdist.get_rank()
    rows: list[dict[str, Any]] = []
    metrics = {f"metric_{i:02d}": torch.tensor(float(i + rank)) for i in range(20)}

    def raw_dict() -> None:
        keys = sorted(metrics)
        flat = torch.stack([metrics[k] for k in keys])
        tdist.all_reduce(flat)
        for k, v in zip(keys, flat.unbind(0)):
            metrics[k] = v

    def raw_dict_again() -> None:  # the same code under another name: the noise floor of the ratio
        raw_dict()

    # many short samples: one small collective costs 0.1-1 ms here and its latency is bimodal
    iters, samples = (10, 51) if quick else (10, 201)
    times = measure(
        {
            "hw": lambda: hwdist.all_reduce_dict(metrics),
            "hw_noverify": lambda: hwdist.all_reduce_dict(metrics, verify=False),
            "raw": raw_dict,
            "raw_again": raw_dict_again,
            "raw_busy": _busy_first(12e-6, raw_dict),
        },
        iters,
        samples,
    )
    rows.append(_row("all_reduce_dict 20 metrics (verify=True)", times, "hw", "raw"))
    rows.append(_row("all_reduce_dict 20 metrics (verify=False)", times, "hw_noverify", "raw"))
    rows.append(_row("control: hand-flattened vs itself (noise floor)", times, "raw_again", "raw"))
    rows.append(_row("control: hand-flattened with a 12 us busy-wait first", times, "raw_busy", "raw"))
    rows += _dict_python_cost(metrics, raw_dict, ws, quick)
    return rows


def _busy_first(seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` after spinning the CPU for ``seconds``: what a wrapper's own CPU time does to a latency."""

    def call() -> None:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            pass
        fn()

    return call


def _dict_python_cost(
    metrics: dict, raw_dict: Callable[[], None], ws: int, quick: bool
) -> list[dict[str, Any]]:
    """all_reduce_dict's own CPU time: the same calls with the collective replaced by a local stand-in.

    The all_reduce becomes ``mul_(ws)`` and the flat all_gather (gloo's small
    reductions) a copy of this rank's buffer into every row: what identical
    buffers on every rank give. So the layout flag reads "every rank matched"
    and the steady-state path runs as it does for real (the local reduction
    of the gathered rows included). Deterministic where the collective's
    latency is not.
    """
    from hwdist import _compat

    real = tdist.all_reduce, _compat.all_gather_into_tensor

    def gather_same(out: torch.Tensor, inp: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        out.view(ws, -1).copy_(inp.reshape(1, -1))  # every rank "sent" the same buffer

    tdist.all_reduce = lambda t, *args, **kwargs: t.mul_(ws)  # type: ignore[assignment]
    _compat.all_gather_into_tensor = gather_same
    try:
        times = measure_local(
            {
                "hw": lambda: hwdist.all_reduce_dict(metrics),
                "hw_noverify": lambda: hwdist.all_reduce_dict(metrics, verify=False),
                "raw": raw_dict,
            },
            2000 if quick else 5000,
            7,
        )
    finally:
        tdist.all_reduce, _compat.all_gather_into_tensor = real
    rows = []
    for name, label in (("hw", ""), ("hw_noverify", " (verify=False)")):
        row = _row(f"all_reduce_dict 20 metrics{label}, CPU time without the collective", times, name, "raw")
        row["overhead_us"] = row["hwdist_median_us"] - row["raw_median_us"]
        rows.append(row)
    return rows


def measure_local(cases: dict[str, Callable[[], Any]], iters: int, samples: int) -> dict[str, list[float]]:
    """Like :func:`measure` for calls that do not communicate (no barrier between samples)."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for s in range(samples + 1):
        for name in cases if s % 2 == 0 else reversed(list(cases)):
            t0 = time.perf_counter()
            for _ in range(iters):
                cases[name]()
            if s:  # the first round warms up
                times[name].append((time.perf_counter() - t0) / iters)
    return times


def bench_solo_rank(quick: bool) -> list[dict[str, Any]]:
    """Wrapper cost with a 1-rank gloo group: the raw call is cheapest, so the overhead shows."""
    one = torch.ones(1)
    iters, samples = (1000 if quick else 2000), (7 if quick else 31)
    times = measure(
        {"hw": lambda: hwdist.all_reduce(one), "raw": lambda: tdist.all_reduce(one)}, iters, samples
    )
    row = _row("all_reduce 1 element, 1-rank group", times, "hw", "raw")
    row["overhead_us"] = row["hwdist_median_us"] - row["raw_median_us"]
    return [row]


def _passthrough_cases(t: torch.Tensor, ws: int) -> dict[str, dict[str, Callable[[], Any]]]:
    """hwdist and raw torch for each pass-through case on ``t``."""

    def raw_gather() -> None:
        out = [torch.empty_like(t) for _ in range(ws)]
        tdist.all_gather(out, t)

    return {
        "all_reduce": {"hw": lambda: hwdist.all_reduce(t), "raw": lambda: tdist.all_reduce(t)},
        "all_reduce async_op=True + wait": {
            "hw": lambda: hwdist.all_reduce(t, async_op=True).wait(),
            "raw": lambda: tdist.all_reduce(t, async_op=True).wait(),
        },
        "broadcast": {"hw": lambda: hwdist.broadcast(t, 0), "raw": lambda: tdist.broadcast(t, 0)},
        "all_gather same_shape=True": {
            "hw": lambda: hwdist.all_gather(t, same_shape=True),
            "raw": raw_gather,
        },
    }


def bench_passthrough(quick: bool) -> list[dict[str, Any]]:
    """The pass-through rows: hwdist vs raw torch, each case with its own noise-floor row (raw vs raw)."""
    ws = tdist.get_world_size()
    rows: list[dict[str, Any]] = []
    for nbytes in (4 * KiB, MiB):
        iters = _iters_for(nbytes, quick)[0]
        samples = 7 if quick else 51
        for name, pair in _passthrough_cases(torch.ones(nbytes // 4), ws).items():
            raw = pair["raw"]
            cases: dict[str, Callable[[], Any]] = {"hw": pair["hw"], "raw": raw, "raw_again": raw}
            times = measure(cases, iters, samples)
            rows.append(_row(f"{name} {_size(nbytes)}", times, "hw", "raw"))
            rows.append(_row(f"control: raw {name} {_size(nbytes)} vs itself", times, "raw_again", "raw"))
    return rows


def _raw_header_round() -> Callable[[], Any]:
    """One raw header round: an all_gather of 1 KiB per rank into one flat buffer (what verification
    issues, without hwdist's encoding)."""
    ws = tdist.get_world_size()
    row = torch.zeros(1024, dtype=torch.uint8)
    out = torch.empty(ws * 1024, dtype=torch.uint8)
    return lambda: tdist.all_gather_into_tensor(out, row)


def bench_header(quick: bool) -> list[dict[str, Any]]:
    """What verification's header round costs a pass-through all_reduce, against raw torch."""
    ws = tdist.get_world_size()
    header = _raw_header_round()
    rows: list[dict[str, Any]] = []
    for nbytes in (4, 64 * KiB, MiB):
        t = torch.ones(max(nbytes // 4, 1))
        iters = _iters_for(max(nbytes, 4 * KiB), quick)[0]
        samples = 7 if quick else 31

        def raw_and_header(t: torch.Tensor = t) -> None:
            tdist.all_reduce(t)
            header()

        cases: dict[str, Callable[[], Any]] = {
            "verified": lambda t=t: hwdist.all_reduce(t),
            "unverified": lambda t=t: hwdist.all_reduce(t, verify=False),
            "raw": lambda t=t: tdist.all_reduce(t),
            "raw_again": lambda t=t: tdist.all_reduce(t),
            "raw_and_header": raw_and_header,
        }
        times = measure(cases, iters, samples)
        size = "1 element" if nbytes == 4 else _size(nbytes)
        rows.append(_row(f"{ws} ranks, all_reduce {size}, verified, vs raw", times, "verified", "raw"))
        rows.append(
            _row(f"{ws} ranks, all_reduce {size}, verified, vs raw + one header round", times, "verified",
                 "raw_and_header")
        )  # fmt: skip
        rows.append(_row(f"{ws} ranks, all_reduce {size}, verify=False, vs raw", times, "unverified", "raw"))
        rows.append(_row(f"{ws} ranks, control: raw all_reduce {size} vs itself", times, "raw_again", "raw"))
    return rows


def bench_passthrough_solo(quick: bool) -> list[dict[str, Any]]:
    """The wrapper's own cost on a 1-rank group, where the raw call is cheapest."""
    one = torch.ones(1)
    iters, samples = (1000 if quick else 2000), (7 if quick else 31)
    rows = []
    for name, hw, raw in (
        ("all_reduce", lambda: hwdist.all_reduce(one), lambda: tdist.all_reduce(one)),
        ("broadcast", lambda: hwdist.broadcast(one, 0), lambda: tdist.broadcast(one, 0)),
        (
            "all_gather same_shape=True",
            lambda: hwdist.all_gather(one, same_shape=True),
            lambda: tdist.all_gather([torch.empty_like(one)], one),
        ),
    ):
        times = measure({"hw": hw, "raw": raw}, iters, samples)
        row = _row(f"{name} 1 element, 1-rank group", times, "hw", "raw")
        row["overhead_us"] = row["hwdist_median_us"] - row["raw_median_us"]
        rows.append(row)
    return rows


def _size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| case | hwdist median | hwdist min | raw median | raw min | ratio (paired median) | ratio (mins) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        extra = f" (+{r['overhead_us']:.1f} us)" if "overhead_us" in r else ""
        lines.append(
            f"| {r['case']} | {fmt_us(r['hwdist_median_us'])} | {fmt_us(r['hwdist_min_us'])} |"
            f" {fmt_us(r['raw_median_us'])} | {fmt_us(r['raw_min_us'])} | {r['ratio']:.2f}x{extra} |"
            f" {r['ratio_min']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the benchmark and print the table (and write JSON if asked)."""
    if "--dict" in argv:
        argv = [a for a in argv if a != "--dict"]
        return bench_main(argv, __doc__.splitlines()[0], [(2, bench_dict)], format_table)
    if "--header" in argv:
        argv = [a for a in argv if a != "--header"]
        return bench_main(argv, __doc__.splitlines()[0], [(2, bench_header), (3, bench_header)], format_table)
    if "--passthrough" in argv:
        argv = [a for a in argv if a != "--passthrough"]
        stages = [(2, bench_passthrough), (1, bench_passthrough_solo)]
        return bench_main(argv, __doc__.splitlines()[0], stages, format_table)
    return bench_main(argv, __doc__.splitlines()[0], [(2, bench_rank), (1, bench_solo_rank)], format_table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
