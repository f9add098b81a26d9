"""Two "nodes" on one machine: network namespaces joined by a veth pair.

Each namespace runs ``torchrun --nnodes 2 --nproc-per-node 2`` on
``launch_script.py`` (init_dist, every collective, local groups). The
addresses exist only inside the namespaces this test creates, and both are
deleted afterwards. Needs root and ``ip netns``; skipped cleanly otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hwdist.testing.mpi_suite import ENV_SUITE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "programs" / "launch_script.py"
sys.path.insert(0, str(SCRIPT.parent))
from launch_script import expected  # noqa: E402

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(os.environ.get(ENV_SUITE) == "1", reason="starts its own ranks"),
]

# Private addresses, configured only inside the namespaces created below.
SUBNET = "192.168.213"
TIMEOUT = 150


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def two_nodes():
    """Namespaces (name, interface, address) x 2, torn down after the test."""
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"hwd{os.getpid() % 100000}"
    nodes = [(f"{tag}n{i}", f"{tag}v{i}", f"{SUBNET}.{i + 1}") for i in range(2)]
    probe = _ip("netns", "add", nodes[0][0], check=False)
    if probe.returncode != 0:
        pytest.skip(f"`ip netns add` is not permitted here: {probe.stderr.strip()}")
    try:
        _ip("netns", "add", nodes[1][0])
        _ip(
            "link",
            "add",
            nodes[0][1],
            "netns",
            nodes[0][0],
            "type",
            "veth",
            "peer",
            "name",
            nodes[1][1],
            "netns",
            nodes[1][0],
        )
        for ns, dev, addr in nodes:
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        yield nodes
    finally:
        for ns, _, _ in nodes:
            _ip("netns", "del", ns, check=False)  # also removes its end of the veth pair


def _free_port_in(ns: str) -> int:
    code = "import socket; s=socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(out.stdout.strip())


def test_two_nodes_in_network_namespaces(two_nodes, tmp_path):
    (ns0, _, master), _ = two_nodes
    port = _free_port_in(ns0)
    base_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "MASTER_"))
    }
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        base_env.pop(var, None)
    procs = []
    for node, (ns, dev, _) in enumerate(two_nodes):
        env = {**base_env, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": dev}
        cmd = [
            "ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node),
            "--master-addr", master, "--master-port", str(port),
            str(SCRIPT), str(tmp_path),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    logs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=TIMEOUT)
            logs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    tails = "\n".join(
        f"--- node {i} (rc {p.returncode}) ---\n{log[-3000:]}" for i, (p, log) in enumerate(zip(procs, logs))
    )
    assert all(p.returncode == 0 for p in procs), tails
    import json

    for r in range(4):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        info = res.pop("info")
        assert (info["launcher"], info["rank"], info["world_size"]) == ("pytorch", r, 4)
        assert (info["local_rank"], info["node_rank"]) == (r % 2, r // 2)
        assert res == expected(r, 4, 2), (r, res)
