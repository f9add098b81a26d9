"""One rank of a DDP job on ``torch.distributed.init_process_group("cpu:hwdist")`` (test_work.py starts
one process per rank).

Usage: ``python _hang_program.py SCENARIO STORE_FILE`` with ``RANK``/``WORLD_SIZE`` set. The last rank
misbehaves:

* ``skip``: it skips ``loss.backward()`` on step 1, so the other ranks wait in DDP's all_reduce;
* ``die``: it exits abruptly before the backward of step 1; the others must raise, not wait.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import hwdist
import hwdist.backend


def main() -> None:
    scenario, store = sys.argv[1:3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    last = world - 1
    spec = hwdist.backend.register(wraps="gloo")
    dist.init_process_group(spec, init_method=f"file://{store}", rank=rank, world_size=world)
    print(f"rank {rank}: started at {time.time()}", file=sys.stderr, flush=True)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(3):
            loss = model(torch.ones(4, 8) * (rank + step)).sum()
            if rank == last and step == 1:
                if scenario == "die":
                    os._exit(3)
                continue  # this rank forgot its backward
            loss.backward()  # SITE-backward
            opt.step()
            opt.zero_grad()
        print(f"rank {rank}: done at {time.time()}", file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("HANG_IDLE", "30")))
    except BaseException as exc:
        print(
            f"rank {rank}: RAISED {type(exc).__name__} at {time.time()}: {exc}", file=sys.stderr, flush=True
        )
        from hwdist.backend import _inflight

        _inflight.sweep()  # what the recorder's thread does within 0.1 s
        last = hwdist.flight.snapshot()[-1]
        print(f"rank {rank}: RECORDED {last['op']} {last['state']}", file=sys.stderr, flush=True)
        raise
    sys.exit(0)


if __name__ == "__main__":
    main()
