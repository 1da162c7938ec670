"""``EmbeddedRolloutEngine``: a Hugging Face causal LM behind SGLang's HTTP API on loopback.

The engine loads the model, runs its :class:`~.scheduler.Scheduler` (the batched decode
loop) in one background thread and a uvicorn server in another, so it works the same in a
plain process, a test and a Ray actor (nothing needs the main thread or a running event
loop). Callers use :class:`loongsage.engines.client.EngineClient` on :meth:`start`'s URL;
the only in-process call is :meth:`apply_weights`, which TransferMesh's shared-memory path
uses to skip HTTP. The model lives on the ``device`` the engine is given (the GPU Ray
assigned its actor, else the CPU); ``offload``/``onload`` move it to host memory and back
between colocated phases.

Deviation from SGLang: weight versions are integers (sent as decimal strings on the wire,
where SGLang carries any string); after a weight swap, running requests are re-prefilled
under the new weights rather than continuing on KV computed by the old ones.

Like SGLang's radix cache, a prefix cache (``prefix_cache``; ``prefix_cache_gb`` of KV, 0 turns
it off) keeps the KV of earlier requests' tokens, so a request prefills only the tokens past its
longest cached prefix; each ``/generate`` reply's ``meta_info.cached_tokens`` says how many of
its prompt tokens were not computed. ``keep_prefix_cache_on_update`` keeps it across weight
updates (``scheduler``).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import torch

from loongsage.engines.embedded_rollout.prefix_cache import GiB
from loongsage.engines.embedded_rollout.scheduler import Scheduler
from loongsage.engines.lora import merge_adapters
from loongsage.engines.memory import offload_module, onload_module
from loongsage.engines.weight_sync import TrainRanks, WeightSync
from loongsage.schema import RolloutConfig
from loongsage.transfer import TransferConfig

DEFAULT_PREFIX_CACHE_GB = RolloutConfig.prefix_cache_gb
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _section(cfg: Any, name: str) -> Any:
    return cfg[name] if name in cfg else {}


def _get(section: Any, key: str, default: Any) -> Any:
    value = section.get(key, default) if hasattr(section, "get") else getattr(section, key, default)
    return default if value is None else value


class EmbeddedRolloutEngine:
    """An in-process rollout engine speaking the SGLang HTTP API (docs/architecture.md)."""

    # It may live in a colocated train rank's process (``placement.share_process``): its
    # decode loop and server run on threads of their own, and its weights arrive through the
    # same receiver either way.
    shares_process = True

    @classmethod
    def weight_sync(cls, cfg: Any, trainers: TrainRanks, rollout_actors: list,
                    transfer: TransferConfig) -> WeightSync:
        """TransferMesh from every train rank into each engine's process (``engines.mesh_sync``).
        Colocated engines are paused through every sync, so they may keep the ring's views as
        their weights (``bind_views``)."""
        from loongsage.engines.mesh_sync import MeshWeightSync  # the controller's side: Ray

        colocated = cfg["placement"]["mode"] == "colocated"
        return MeshWeightSync(trainers, rollout_actors, transfer, bind_views=colocated)

    def __init__(self, model_path: str, *, tokenizer_path: str | None = None,
                 dtype: str = "float32", fp32_lm_head: bool = True,
                 max_running_requests: int = 64, num_threads: int = 0, seed: int = 0,
                 weight_version: int = 0, trust_remote_code: bool = False,
                 device: str = "cpu", prefix_cache_gb: float = DEFAULT_PREFIX_CACHE_GB,
                 keep_prefix_cache_on_update: bool = False):
        from transformers import AutoModelForCausalLM

        if dtype not in _DTYPES:
            raise ValueError(f"model.dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
        if max_running_requests < 1:
            raise ValueError("rollout.max_running_requests: must be >= 1")
        if prefix_cache_gb < 0:
            raise ValueError(f"rollout.prefix_cache_gb: expected >= 0 (0 = off), got {prefix_cache_gb}")
        self.model_path = str(model_path)
        self.tokenizer_path = str(tokenizer_path or model_path)
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code
        ).eval().to(self.device)
        self.model.requires_grad_(False)
        self.tokenizer = self._load_tokenizer(trust_remote_code)
        cfg = self.model.config.get_text_config()
        self.vocab_size = int(cfg.vocab_size)
        self.max_len = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        self.scheduler = Scheduler(
            self.model, fp32_lm_head=fp32_lm_head, eos_ids=self._eos_ids(),
            max_len=self.max_len, max_running=max_running_requests, seed=seed,
            weight_version=weight_version, num_threads=num_threads,
            prefix_cache_bytes=int(prefix_cache_gb * GiB),
            keep_prefix_cache_on_update=keep_prefix_cache_on_update,
        )
        self._params = dict(self.model.state_dict(keep_vars=True))
        self._lora_bases: dict[str, torch.Tensor] = {}  # weights LoRA adapters merge into
        self._server = None  # a ThreadedServer once started
        self.url: str | None = None

    @classmethod
    def from_config(cls, cfg: Any, device: str | None = None) -> "EmbeddedRolloutEngine":
        """Build from a resolved LoongSage config (its ``model`` and ``rollout`` sections)."""
        model, rollout = _section(cfg, "model"), _section(cfg, "rollout")
        trainer = _section(cfg, "trainer")
        from loongsage.models.resolve import resolve_model_path

        path = _get(model, "path", None)
        if not path or str(path) == "???":
            raise ValueError("model.path: required (a Hugging Face model folder)")
        return cls(
            str(resolve_model_path(str(path))),
            tokenizer_path=_get(model, "tokenizer_path", None),
            dtype=_get(model, "dtype", "float32"),
            fp32_lm_head=bool(_get(model, "fp32_lm_head", True)),
            max_running_requests=int(_get(rollout, "max_running_requests", 64)),
            num_threads=int(_get(rollout, "num_threads", 0)),
            seed=int(_get(trainer, "seed", 0)),
            trust_remote_code=bool(_get(model, "trust_remote_code", False)),
            device=device or "cpu",
            prefix_cache_gb=float(_get(rollout, "prefix_cache_gb", DEFAULT_PREFIX_CACHE_GB)),
            keep_prefix_cache_on_update=bool(_get(_section(rollout, "prefix_cache"), "keep_on_update", False)),
        )

    def _load_tokenizer(self, trust_remote_code: bool):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.tokenizer_path,
                                                 trust_remote_code=trust_remote_code)
        except (OSError, ValueError):  # a bare weights folder: token ids only, no text
            return None

    def _eos_ids(self) -> set[int]:
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = self.model.config.get_text_config().eos_token_id
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return set()
        return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}

    @property
    def weight_version(self) -> int:
        return self.scheduler.version

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start the decode loop and the HTTP server; returns the base URL."""
        from loongsage.engines.embedded_rollout.server import build_app
        from loongsage.http_thread import ThreadedServer

        if self._server is not None:
            return self.url
        self._server = ThreadedServer(build_app(self), host, port, name="embedded-rollout-http",
                                      timeout_graceful_shutdown=2)
        self.scheduler.start()
        try:
            self.url = self._server.start()
        except BaseException:
            self._server = None
            self.scheduler.stop()
            raise
        return self.url

    def stop(self) -> None:
        """Abort everything in flight, stop the server and the decode loop."""
        self.scheduler.stop()
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.url = None

    # ---- weights -------------------------------------------------------------------------
    def apply_weights(self, named_tensors: Iterable[tuple[str, Any]] | Mapping[str, Any],
                      version: int | None = None) -> int:
        """Copy ``named_tensors`` (HF parameter names) into the model between decode steps.

        Accepts ``(name, tensor)`` pairs or a ``{name: tensor}`` mapping; numpy arrays are
        taken without a copy (what a Ray actor receives fastest).

        All names and shapes are checked before anything is written, and the copy happens on
        the decode thread, so no request sees half-updated weights. Running requests then
        recompute their KV under the new weights. ``version`` defaults to the current one
        plus one. A multi-bucket update is atomic per call; pause generation around a
        sequence of calls to make the whole sequence atomic. Returns the new version.
        LoRA adapters (``<module>.lora_A`` / ``.lora_B`` / ``.lora_scaling``, ``engines.lora``) are
        merged into the module's weight as loaded, before the first adapter arrived.
        """
        pairs = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        items = [(n, torch.from_numpy(t) if isinstance(t, np.ndarray) else t) for n, t in pairs]
        plain, merged = merge_adapters(self._params, self._lora_bases, items)
        items = plain + merged
        for name, tensor in items:
            target = self._params.get(name)
            if target is None:
                raise KeyError(f"apply_weights: unknown parameter '{name}' for {self.model_path}")
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(f"apply_weights: '{name}' has shape {tuple(tensor.shape)}, "
                                 f"the model expects {tuple(target.shape)}")
        new_version = self.scheduler.version + 1 if version is None else int(version)

        def write() -> None:
            with torch.no_grad():
                for name, tensor in items:
                    self._params[name].copy_(tensor)

        return self.scheduler.swap_weights(write, new_version).result()

    def bind_weights(self, named_views: Iterable[tuple[str, torch.Tensor]],
                     version: int | None = None) -> int:
        """Make the named parameters *be* ``named_views`` (no copy), between decode steps.

        For colocated CPU runs, where the views are the weight-sync ring's and the sender
        overwrites them with the next version only while generation is paused: the engine then
        holds no private copy of the weights. Tied parameters stay tied (the shared
        ``Parameter`` is rebound). A version this cannot take as it is (a dtype other than the
        model's, another device, LoRA adapters to merge) is copied by :meth:`apply_weights`.
        """
        items = list(named_views)
        for name, view in items:
            target = self._params.get(name)
            if (target is None or target.dtype != view.dtype or target.device != view.device
                    or ".lora_" in name):
                return self.apply_weights(items, version)
            if tuple(target.shape) != tuple(view.shape):
                raise ValueError(f"bind_weights: '{name}' has shape {tuple(view.shape)}, "
                                 f"the model expects {tuple(target.shape)}")
        new_version = self.scheduler.version + 1 if version is None else int(version)

        def rebind() -> None:
            for name, view in items:
                self._params[name].data = view

        return self.scheduler.swap_weights(rebind, new_version).result()

    def weights_lost(self, reason: str) -> None:
        """The bound weights were partly overwritten (a failed version): fail every request,
        refuse new ones with ``reason`` until the next version is applied."""
        self.scheduler.weights_lost(reason).result()

    def offload(self) -> bool:
        """Release the device while the trainer uses it: weights to host memory, KV cache freed
        (call with generation paused and nothing running). Moving is a no-op on CPU; True if
        moved. The prefix cache goes too, on any device, unless it is kept across weight
        updates: the update after the train phase would clear it, and until then it would sit
        in the memory the trainer needs (in a colocated train rank's own process, on CPU)."""
        def _offload() -> bool:
            if not self.scheduler.keep_prefix_cache_on_update:
                self.scheduler.drop_prefix_cache()
            return self._move(offload_module)
        return self.scheduler.call(_offload).result()

    def onload(self) -> bool:
        """Weights back on the device, before the weight update and the next generation."""
        return self.scheduler.call(lambda: self._move(onload_module)).result()

    def _move(self, move: Any) -> bool:
        moved = move(self.model, self.device)
        self.scheduler.head.refresh()
        if moved:  # the prefix cache's KV lives on the device being released or regained
            self.scheduler.drop_prefix_cache()
        return moved

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path if self.tokenizer is not None else None,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": str(self.weight_version),
            "vocab_size": self.vocab_size,
            "max_context_length": self.max_len,
        }
