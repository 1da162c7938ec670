"""``rollout.backend=sglang``: a rollout engine that launches an SGLang server and drives it.

The engine host actor of each replica runs ``rollout.sglang.launch_command`` (default
``python -m sglang.launch_server``) as a child process in its own process group, with the
flags below, waits for ``/health`` and returns the server's URL, so the pool, the router and
the engine monitor talk to it exactly as to the embedded engine (``EngineClient``). Nothing
here imports ``sglang``: the server is another process (``loongsage-core[sglang]`` installs it).

Flags, as SGLang's ``python/sglang/srt/server_args.py`` (``ServerArgs.add_cli_args``) spells
them: ``--model-path``, ``--host``, ``--port``, ``--tp-size``, ``--mem-fraction-static``,
``--max-running-requests``, ``--context-length`` (when ``rollout.sglang.context_length`` is
set), ``--enable-return-routed-experts`` (router replay, ``rollout.sglang.routed_experts``),
``--enable-memory-saver`` (colocated: needed by ``/release_memory_occupation`` and
``/resume_memory_occupation``), ``--weight-version`` (the version the server reports before
its first update), ``--skip-server-warmup``; ``rollout.sglang.extra_args`` are appended.

Weights (``SGLangServerEngine.weight_sync`` opens the run's ``WeightSync``): a colocated engine
gets them from the train rank in its bundle through ``/update_weights_from_tensor``
(``sync_tensor.TensorWeightSync`` over ``tensor_sender.SGLangTensorSender``; CUDA IPC handles
on a GPU, shared-memory handles on CPU: the server maps the trainer's memory), a disaggregated
one over ``/init_weights_update_group`` + ``/update_weights_from_distributed``
(``sync_distributed.DistributedWeightSync``, trainer rank 0 broadcasting through
``distributed_sender.SGLangDistributedSender``; NCCL on GPUs, gloo on CPU). Colocated engines
release and resume their memory around training (``offload``/``onload``).

CPU machines cannot install SGLang: the tests point ``launch_command`` at
``python -m loongsage.engines.embedded_rollout.sglang_compat``, the embedded server taking
SGLang's argv, through this very code path (argv, health wait, registration, both weight
syncs). Not run: a real SGLang server, CUDA IPC handles (``benchmarks/gpu_check.py`` has both
for a GPU machine), and ``tp_size`` > 1 (the stand-in refuses it; colocated, every TP rank
would get the same handles, mapped over peer access, where slime gathers one per TP rank).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

import httpx

from loongsage.engines.client import EngineClient
from loongsage.engines.replies import EngineError
from loongsage.engines.weight_sync import TrainRanks, WeightSync
from loongsage.transfer import TransferConfig

STARTUP_POLL_S = 0.5


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGKILL when the engine's actor dies (Linux), so a
    killed actor leaves no server behind."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _get(section: Any, key: str, default: Any = None) -> Any:
    value = section.get(key, default) if hasattr(section, "get") else getattr(section, key, default)
    return default if value is None else value


class SGLangServerEngine:
    """One SGLang server process per replica (see the module docstring)."""

    @classmethod
    def weight_sync(cls, cfg: Any, trainers: TrainRanks, rollout_actors: list,
                    transfer: TransferConfig) -> WeightSync:
        """Colocated: ``/update_weights_from_tensor`` from the bundle-mate; else distributed."""
        from loongsage.engines.sglang.sync_distributed import DistributedWeightSync  # the controller's
        from loongsage.engines.sglang.sync_tensor import TensorWeightSync  # side: Ray

        colocated = cfg["placement"]["mode"] == "colocated"
        return (TensorWeightSync if colocated else DistributedWeightSync)(trainers, rollout_actors, transfer)

    def __init__(self, model_path: str, *, launch_command: list[str], tp_size: int = 1,
                 mem_fraction_static: float = 0.8, max_running_requests: int = 64,
                 context_length: int | None = None, routed_experts: bool = False,
                 memory_saver: bool = False, radix_cache: bool = True,
                 extra_args: list[str] | None = None,
                 startup_timeout_s: float = 600.0, device: str = "cpu") -> None:
        self.model_path, self.launch_command = model_path, list(launch_command)
        self.tp_size, self.mem_fraction_static = tp_size, mem_fraction_static
        self.max_running_requests, self.context_length = max_running_requests, context_length
        self.routed_experts, self.memory_saver = routed_experts, memory_saver
        self.radix_cache = radix_cache
        self.extra_args, self.startup_timeout_s = list(extra_args or []), startup_timeout_s
        self.device = device
        self.url: str | None = None
        self.process: subprocess.Popen | None = None
        self.log_path: str | None = None

    @classmethod
    def from_config(cls, cfg: Any, device: str | None = None) -> "SGLangServerEngine":
        from loongsage.models.resolve import resolve_model_path

        rollout = cfg["rollout"]
        sg = rollout["sglang"]
        return cls(str(resolve_model_path(str(cfg["model"]["path"]))),
                   launch_command=list(sg["launch_command"]), tp_size=int(sg["tp_size"]),
                   mem_fraction_static=float(sg["mem_fraction_static"]),
                   max_running_requests=int(rollout["max_running_requests"]),
                   context_length=_get(sg, "context_length"), routed_experts=bool(sg["routed_experts"]),
                   memory_saver=cfg["placement"]["mode"] == "colocated" and str(device or "").startswith("cuda"),
                   radix_cache=float(rollout["prefix_cache_gb"]) > 0,
                   extra_args=[str(a) for a in sg["extra_args"]],
                   startup_timeout_s=float(sg["startup_timeout_s"]), device=device or "cpu")

    def launch_argv(self, host: str, port: int) -> list[str]:
        argv = [*self.launch_command, "--model-path", self.model_path, "--host", host, "--port", str(port),
                "--tp-size", str(self.tp_size), "--mem-fraction-static", str(self.mem_fraction_static),
                "--max-running-requests", str(self.max_running_requests), "--weight-version", "0",
                "--skip-server-warmup"]
        if self.context_length:
            argv += ["--context-length", str(self.context_length)]
        if self.routed_experts:
            argv.append("--enable-return-routed-experts")
        if self.memory_saver:
            argv.append("--enable-memory-saver")
        if not self.radix_cache:
            argv.append("--disable-radix-cache")
        return argv + self.extra_args

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Launch the server and wait for ``/health``; returns its URL. A server that exits or
        stays unhealthy past ``startup_timeout_s`` raises, with the tail of its log."""
        if self.url is not None:
            return self.url
        port = port or _free_port(host)
        handle, self.log_path = tempfile.mkstemp(prefix="loongsage-sglang-", suffix=".log")
        with os.fdopen(handle, "w") as log:
            self.process = subprocess.Popen(self.launch_argv(host, port), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=_die_with_parent)
        url = f"http://{host}:{port}"
        client = EngineClient(url)
        deadline = time.monotonic() + self.startup_timeout_s
        while not client.health():
            if self.process.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with {self.process.returncode}" if self.process.poll() is not None
                       else f"not healthy after {self.startup_timeout_s:.0f} s")
                self.stop()
                raise EngineError("/health", f"rollout.sglang.launch_command {self.launch_command}: the server "
                                  f"{why}; its log ends:\n{self._log_tail()}")
            time.sleep(STARTUP_POLL_S)
        self.url = url
        return url

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return handle.read()[-chars:]
        except (OSError, TypeError):
            return ""

    def stop(self) -> None:
        """Stop the server's whole process group (SGLang starts scheduler and detokenizer children)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.process, self.url = None, None

    def __del__(self) -> None:
        self.stop()

    # ---- what the controller calls --------------------------------------------------------
    def _post(self, path: str) -> None:
        response = httpx.post(f"{self.url}{path}", json={}, timeout=600)
        if response.status_code != 200:
            raise EngineError(path, response.text, response.status_code)

    def offload(self) -> bool:
        """Colocated on a GPU: free weights and KV cache for training (``--enable-memory-saver``)."""
        if self.memory_saver:
            self._post("/release_memory_occupation")
        return self.memory_saver

    def onload(self) -> bool:
        if self.memory_saver:
            self._post("/resume_memory_occupation")
        return self.memory_saver

    @property
    def weight_version(self) -> int | str | None:
        return EngineClient(self.url).get_weight_version()
