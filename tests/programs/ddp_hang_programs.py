"""One rank of a DDP/FSDP hang (tests/flight/test_torch_hooks.py starts one process per rank).

Usage: ``python ddp_hang_programs.py SCENARIO STORE_FILE`` with ``RANK``/``WORLD_SIZE`` set. hwdist is
imported before ``init_process_group``; with ``HANG_TORCH_CALLS=1`` its hook path is switched on after
it, as a user would (``hwdist.flight.enable(torch_calls=True)``); without it nothing is set. The last rank
misbehaves:

* ``skip_backward``: it skips ``loss.backward()`` on step 1 (the loop uses torch only);
* ``uneven``: its data ends one step early (the classic uneven-input hang; torch only);
* ``fsdp_skip_forward``: an FSDP2 model; it skips the forward (and backward) of step 1 (torch only);
* ``skip_step_metrics``: a DDP loop that averages its metrics with ``hwdist.all_reduce_dict`` on a
  group of its own; the last rank skips the forward and backward of step 2 (an empty batch) and goes
  on to the metrics, so it waits in hwdist's call while the others wait in DDP's backward.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import hwdist


def idle() -> None:
    """Where a rank that finished waits: the watchdog of the others reports meanwhile."""
    end = time.monotonic() + float(os.environ.get("HANG_IDLE", "60"))
    while time.monotonic() < end:
        time.sleep(0.05)  # SITE-idle


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def skip_backward(rank: int, last: int, steps: int = 3) -> None:
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        loss = model(torch.ones(4, 8) * (rank + step)).sum()
        if rank == last and step == 1:
            continue  # this rank forgot its backward
        loss.backward()  # SITE-backward
        opt.step()
        opt.zero_grad()


def uneven(rank: int, last: int) -> None:
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = 2 if rank == last else 3
    for step in range(batches):
        loss = model(torch.ones(4, 8) * (rank + step)).sum()
        loss.backward()  # SITE-uneven-backward
        opt.step()
        opt.zero_grad()


def fsdp_skip_forward(rank: int, last: int) -> None:
    from torch.distributed.fsdp import fully_shard

    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        if rank == last and step == 1:
            continue  # this rank skips a whole step
        loss = model(torch.ones(4, 8) * (rank + step)).sum()  # SITE-fsdp-forward
        loss.backward()
        opt.step()
        opt.zero_grad()


def skip_step_metrics(rank: int, last: int) -> None:
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics_group = hwdist.new_group(list(range(last + 1)))
    for step in range(4):
        loss = torch.zeros(())
        if not (rank == last and step == 2):  # this rank's batch is empty at step 2
            loss = model(torch.ones(4, 8) * (rank + step)).sum()
            loss.backward()  # SITE-metrics-backward
            opt.step()
            opt.zero_grad()
        hwdist.all_reduce_dict({"loss": loss.detach()}, group=metrics_group)  # SITE-metrics


SCENARIOS = {
    "skip_backward": skip_backward,
    "uneven": uneven,
    "fsdp_skip_forward": fsdp_skip_forward,
    "skip_step_metrics": skip_step_metrics,
}


def main() -> None:
    name, store = sys.argv[1:3]
    logs = os.environ.get("HANG_LOGS")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if logs:
        fd = os.open(os.path.join(logs, f"rank{rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    if os.environ.get("HANG_TORCH_CALLS") == "1":
        hwdist.flight.enable(torch_calls=True)  # record torch's own collectives from here on
    if os.environ.get("HANG_DEBUG"):
        import threading

        def show() -> None:
            time.sleep(float(os.environ["HANG_DEBUG"]))
            from hwdist.flight import torch_hooks

            print("attached:", torch_hooks.attached_groups(), file=sys.stderr)
            for e in hwdist.flight.snapshot():
                print(e["seq"], e["op"], e["state"], e["site"], file=sys.stderr, flush=True)

        threading.Thread(target=show, daemon=True).start()
    print(f"rank {rank}: started at {time.time()}", file=sys.stderr, flush=True)
    try:
        SCENARIOS[name](rank, world - 1)
        idle()
    except BaseException as exc:
        print(f"rank {rank}: RAISED {type(exc).__name__} at {time.time()}", file=sys.stderr, flush=True)
        raise
    sys.exit(0)


if __name__ == "__main__":
    main()
