"""``loongsage train`` on a real two-node Ray cluster, started with ``ray start`` on this machine.

A head and a second raylet run as separate Ray nodes (own raylet, object store and worker
pool each), told apart by custom resources ``node_a`` / ``node_b``. The tiny recipe runs
disaggregated with ``train.dp_size=2`` and ``rollout.num_engines=2``; the placement bundles
ask for ``node_a`` (train) and ``node_b`` (rollout), so the process group of the two train
ranks, the engines and the weight sync between them span the two nodes. ``layout.json``
must show it, checked against the nodes' own resources.

The cluster uses explicit free ports, all from one reserved block, and a private temporary folder (other Ray instances on
the machine are left alone) and is torn down whatever happens: each ``ray start --block``
runs in a session of its own, which is terminated and then checked to hold no process.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))


def free_block(width: int) -> int:
    """The first port of ``width`` consecutive free ports.

    Every port of both nodes comes from this one block, each at its own offset, so no two
    components can be handed the same port (ephemeral ports drawn one by one could land
    inside a node's worker range, which Ray refuses at start). The block lies below the
    kernel's ephemeral range, so no outgoing connection takes one of its ports meanwhile.
    """
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        base = random.randrange(20000, ephemeral_low - width)
        try:
            for port in range(base, base + width):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {width} consecutive free ports for the Ray cluster")


NODE_PORTS = 6  # node manager, object manager, agent http, agent grpc, runtime env, metrics
WORKER_PORTS = 10
NODE_BLOCK = NODE_PORTS + WORKER_PORTS


def session_processes(sessions: list[int]) -> list[str]:
    left = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) in sessions:
                command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                left.append(command.decode(errors="replace")[:120])
        except (OSError, ProcessLookupError):
            continue
    return left


class TwoNodeCluster:
    """A Ray head (``node_a``) and a second raylet (``node_b``), one CPU each."""

    def __init__(self) -> None:
        self.temp = tempfile.mkdtemp(prefix="lsray", dir="/tmp")  # short: Ray's socket paths
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, RAY_AUTH_MODE="disabled", OMP_WAIT_POLICY="PASSIVE",
                        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")  # no drain wait on SIGTERM
        self.env.pop("RAY_ADDRESS", None)
        self.base = free_block(1 + 2 * NODE_BLOCK)
        self.gcs_port = self.base
        self.address = f"127.0.0.1:{self.gcs_port}"

    def _node(self, name: str, head: bool, index: int) -> None:
        first = self.base + 1 + index * NODE_BLOCK
        node_manager, objects, agent, agent_grpc, runtime_env, metrics = range(first, first + NODE_PORTS)
        workers = first + NODE_PORTS
        args = [RAY, "start", "--block", "--num-cpus=1", f"--resources={json.dumps({name: 4})}",
                f"--node-manager-port={node_manager}", f"--object-manager-port={objects}",
                f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
                f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
                f"--min-worker-port={workers}", f"--max-worker-port={workers + WORKER_PORTS - 1}",
                "--object-store-memory=300000000", "--disable-usage-stats",
                "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp}"]
        args += (["--head", f"--port={self.gcs_port}", "--include-dashboard=false"] if head
                 else [f"--address={self.address}"])
        log = open(Path(self.temp) / f"{name}.log", "w")
        self.procs.append(subprocess.Popen(args, env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def start(self) -> "TwoNodeCluster":
        self._node("node_a", head=True, index=0)
        self._node("node_b", head=False, index=1)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            nodes = self.nodes()
            if len(nodes) == 2:
                return self
            for proc in self.procs:
                assert proc.poll() is None, self.logs()
            time.sleep(1)
        raise AssertionError(f"the two Ray nodes did not come up:\n{self.logs()}")

    def nodes(self) -> dict[str, dict]:
        """Live node id -> resources, asked of the cluster by a separate driver."""
        code = (f"import json, ray; ray.init(address={self.address!r}, logging_level='ERROR'); "
                "print(json.dumps({n['NodeID']: n['Resources'] for n in ray.nodes() if n['Alive']}))")
        out = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True,
                             text=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {}

    def logs(self) -> str:
        return "\n".join(p.read_text()[-1500:] for p in Path(self.temp).glob("*.log"))

    def stop(self) -> list[str]:
        """Terminate the worker node, then the head; return any process that survived."""
        sessions = [proc.pid for proc in self.procs]
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=45)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        deadline = time.monotonic() + 30
        while session_processes(sessions) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = session_processes(sessions)
        for proc in self.procs:  # never leave a process behind, even after a failed test
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp, ignore_errors=True)
        return left


@pytest.fixture
def cluster():
    ray_cluster = TwoNodeCluster()
    try:
        yield ray_cluster.start()
    finally:
        left = ray_cluster.stop()
        assert not left, f"processes left after the cluster stopped: {left}"


def test_train_ranks_and_engines_run_on_different_nodes(cluster, tmp_path, runs):
    run_dir = tmp_path / "cluster"
    runs.train(run_dir, "trainer.steps=2", "trainer.sft.steps=0", "checkpoint.interval=0",
               "rollout.prompts_per_step=4", "rollout.n_samples_per_prompt=2",
               "rollout.max_new_tokens=8", "placement.mode=disaggregated", "async.enable=true",
               "train.dp_size=2", "rollout.num_engines=2", "placement.train_cpus=0.5",
               "placement.rollout_cpus=0.5", "+placement.train_resources.node_a=1",
               "+placement.rollout_resources.node_b=1", "placement.nodes=2",
               f"placement.ray_address={cluster.address}", timeout=600)
    nodes = cluster.nodes()
    node_a = next(node for node, res in nodes.items() if "node_a" in res)
    node_b = next(node for node, res in nodes.items() if "node_b" in res)
    layout = json.loads((run_dir / "layout.json").read_text())
    where = {(a["role"], a["rank"]): a["node_id"] for a in layout["actors"]}
    assert where == {("train", 0): node_a, ("train", 1): node_a,
                     ("rollout", 0): node_b, ("rollout", 1): node_b}
    assert not any(a["pinned"] for a in layout["actors"])  # an attached cluster is not pinned
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        assert row["perf/weight_sync_senders"] == 2
        assert row["train/is_approx_k3_kl"] < 1e-6
    for engine in (0, 1):  # the asynchronous pipeline used both engines over the run
        assert sum(row[f"rollout/engine_requests/{engine}"] for row in rows) > 0
