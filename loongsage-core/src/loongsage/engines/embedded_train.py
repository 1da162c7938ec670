"""The embedded train engine: one HF causal LM on CPU or one GPU, trained by loss closures.
Several engines become data-parallel ranks (DDP or FSDP2) through ``engines.distributed``.

The engine knows nothing about RL. Algorithms hand ``train_step`` a closure that maps a
``LossContext`` (one micro-batch's logprobs + the global token/sequence counts of its
mini-batch) to a loss; the engine does micro-batching with gradient accumulation, AdamW,
gradient clipping and bookkeeping. Because closures normalise by the *global* counts,
per-micro-batch losses are summed, never averaged, and the gradient does not depend on
``train.micro_batch_size`` (verl's ``global_batch_info`` / slime's ``calculate_per_token_loss``
idea). Dropout is switched off at load: RL ratios need ``compute_logprobs`` and the train
forward to be the same function. The class is plain Python so the controller can host it
in a Ray actor; ``state_numpy`` is the transfer format Ray serialises fastest
(benchmarks/embedded_engine.py, docs/benchmarks.md). Deviation from GPU trainers: ``model.dtype:
bfloat16`` updates bf16 weights directly (no fp32 master copy, no mixed-precision autocast); use
float32 for real training on CPU. On an MoE model ``trainer.router_replay`` replays expert routes in
every forward of the policy (``engines.routing``: ``rollout`` = R3, ``old_policy`` = R2) and
``train_step`` reports, over the tokens with rollout routes, ``train/routing_mismatch_own``: the
fraction whose own training-time top-k differs from the rollout's in some layer (the mismatch
without replay), and ``train/routing_mismatch``: the same for the routes the forward used
(0 under R3). ``train.lora.rank > 0`` trains LoRA adapters instead of the weights
(``engines.lora``): the reference is the model with its adapters off, weight sync sends the
adapters or the merged weights, checkpoints hold the adapter.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Container, Iterator, Mapping

import numpy as np
import torch
from torch import nn

from loongsage.schema import ModelConfig, TrainConfig
from loongsage.engines.batch import LogitTerm, LossContext, TrainBatch
from loongsage.engines.distributed import SingleProcess
from loongsage.engines.logprobs import TokenScores
from loongsage.engines.train_state import restore_train_state, save_train_state, storage_ptr
from loongsage.engines.lora import LoraAdapters
from loongsage.engines.memory import offload_train_state, onload_train_state
from loongsage.engines.micro_batches import (
    micro_batches, plan_micro_batches, prompt_keys, row_lengths, scatter_rows, shared_prefix_length, split_to,
)
from loongsage.engines.routing import REPLAY_SOURCES, MoeRouters, RoutingPass, check_router_replay
from loongsage.engines.sections import config_section, train_section
from loongsage.errors import ConfigError, NonFiniteLossError

LossFn = Callable[[LossContext], Any]
Named = tuple[str, torch.Tensor]  # an HF state-dict name and its tensor

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_causal_lm(path: str | Path, dtype: str, trust_remote_code: bool = False) -> nn.Module:
    """A HF causal LM from a folder, in ``dtype``, with every dropout disabled."""
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ConfigError("model.dtype", f"expected one of {sorted(_DTYPES)}, got {dtype!r}")
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code
    )
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    if hasattr(model.config, "attention_dropout"):
        model.config.attention_dropout = 0.0
    return model


class EmbeddedTrainEngine:
    """Train a HF causal LM with loss closures; see the module docstring."""

    supports_lora = True  # train.lora (config validation refuses it on backends without this)
    # every backend key (config.backend_support): validation refuses none of them here
    implemented_keys = frozenset({
        "train.lr", "train.weight_decay", "train.betas", "train.eps", "train.grad_clip", "train.micro_batch_size",
        "train.share_prompt", "train.max_tokens_per_micro_batch", "train.mini_batches_per_step",
        "train.num_threads", "train.gradient_checkpointing", "train.logprob_chunk_tokens", "train.dp_size",
        "train.strategy", "train.lora", "trainer.router_replay"})

    def __init__(
        self,
        model: ModelConfig,
        train: TrainConfig,
        *,
        device: str | None = None,
        seed: int = 0,
        router_replay: str = "off",
    ) -> None:
        if train.micro_batch_size < 1:
            raise ConfigError(
                "train.micro_batch_size", f"must be >= 1, got {train.micro_batch_size}"
            )
        if train.max_tokens_per_micro_batch < 0:
            raise ConfigError("train.max_tokens_per_micro_batch",
                              f"must be >= 0 (0: micro_batch_size rows), got {train.max_tokens_per_micro_batch}")
        if train.logprob_chunk_tokens < 1:
            raise ConfigError(
                "train.logprob_chunk_tokens", f"must be >= 1, got {train.logprob_chunk_tokens}"
            )
        from transformers import AutoTokenizer

        self.model_cfg, self.train_cfg = model, train
        self.parallel = SingleProcess()  # data-parallel ranks: engines.distributed.join_group
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if train.num_threads > 0:
            torch.set_num_threads(train.num_threads)
        torch.manual_seed(seed)
        self.model = load_causal_lm(model.path, model.dtype, model.trust_remote_code)
        self.model.to(self.device)
        self.model.eval()
        self.routers = MoeRouters(self.model)
        check_router_replay(router_replay, self.routers, model.path)
        self.router_replay = router_replay
        self.lora = self._lora(train.lora, model.path) if train.lora.rank > 0 else None
        if train.gradient_checkpointing:
            enable = getattr(self.model, "activation_checkpointing_enable", None)
            (enable or self.model.gradient_checkpointing_enable)()
            self.model.train()  # HF only checkpoints in training mode; dropout is already off
        self.tokenizer = AutoTokenizer.from_pretrained(
            model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code
        )
        self.optimizer = self._new_optimizer(train.lr)
        self.weight_version = 0
        self._ref: nn.Module | None = None
        self.ref_offload = self.device.type != "cpu"

    @classmethod
    def from_config(
        cls, cfg: Mapping[str, Any], device: str | None = None
    ) -> "EmbeddedTrainEngine":
        """Build from the full resolved config (sections ``model``, ``train``, ``trainer``)."""
        from loongsage.models.resolve import resolve_model_path

        model = config_section(cfg, "model", ModelConfig)
        model.path = str(resolve_model_path(str(model.path)))
        train = train_section(cfg)
        trainer = cfg.get("trainer") or {}
        return cls(model, train, device=device, seed=int(trainer.get("seed", 0)),
                   router_replay=str(trainer.get("router_replay", "off")))

    def _lora(self, settings: Any, path: str) -> LoraAdapters:
        if self.train_cfg.dp_size > 1:
            raise ConfigError("train.lora.rank", "LoRA runs on one train rank for now (train.dp_size=1); "
                              f"got dp_size={self.train_cfg.dp_size}")
        return LoraAdapters(self.model, settings, path)

    # optimizer ---------------------------------------------------------------------

    def _new_optimizer(self, lr: float) -> torch.optim.Optimizer:
        t = self.train_cfg
        if len(t.betas) != 2:
            raise ConfigError("train.betas", f"expected two numbers, got {list(t.betas)}")
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            params, lr=lr, betas=(float(t.betas[0]), float(t.betas[1])), eps=t.eps,
            weight_decay=t.weight_decay,
        )

    def reset_optimizer(self, lr: float | None = None) -> None:
        """Fresh AdamW moments at ``lr`` (default ``train.lr``), e.g. between SFT and RL."""
        self.optimizer = self._new_optimizer(self.train_cfg.lr if lr is None else lr)

    # forward passes ------------------------------------------------------------------

    @property
    def _share_prompt(self) -> bool:
        """``train.share_prompt``, except under gradient checkpointing (HF runs no cache there),
        on MoE models (routes are recorded and replayed per row position) and where each
        decoder layer's call is a collective (FSDP2): a shared prompt is one more call of every
        layer, made only by the ranks whose micro-batch shares one, so the ranks would part."""
        t = self.train_cfg
        return (t.share_prompt and not t.gradient_checkpointing and not self.routers.is_moe
                and not self.parallel.layer_calls_are_collective)

    @property
    def needs_pi_old_forward(self) -> bool:
        """True when pi_old must come from its own no-grad forward even for one optimizer step:
        R2 records its routes there, and LoRA dropout acts in the loss forward only."""
        lora_dropout = self.lora is not None and self.train_cfg.lora.dropout > 0
        return self.router_replay == "old_policy" or lora_dropout

    def _micro_batches(self, batch: TrainBatch) -> list[tuple[torch.Tensor, TrainBatch]]:
        """Cropped micro-batches (``engines.micro_batches``); as many on every rank."""
        t = self.train_cfg
        keys = prompt_keys(batch) if self._share_prompt else None
        plans = plan_micro_batches(row_lengths(batch), t.micro_batch_size, t.max_tokens_per_micro_batch, keys)
        return micro_batches(batch, split_to(plans, self.parallel.max_count(len(plans))))

    def _scores(
        self, model: nn.Module, batch: TrainBatch, with_entropy: bool, logit_term: LogitTerm | None,
        entropy_grad: bool = True,
    ) -> TokenScores:
        extras = {k: batch.extras[k].to(self.device) for k in logit_term.inputs} if logit_term else None
        return self.parallel.token_scores(
            model,
            batch.input_ids.to(self.device),
            batch.attention_mask.to(self.device),
            fp32_lm_head=self.model_cfg.fp32_lm_head,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            chunk_tokens=self.train_cfg.logprob_chunk_tokens,
            term=logit_term,
            extras=extras,
            score_mask=batch.loss_mask.to(self.device),
            prefix_len=shared_prefix_length(batch) if self._share_prompt else 0,
        )

    def _routing(self, batch: TrainBatch, *, training: bool, capture: bool = False):
        """The routing of one policy forward: replay per ``trainer.router_replay``, compare with
        the rollout's routes, capture the routes used (R2's pi_old forward always does). A batch
        that holds no rollout (SFT) trains with the model's own routing."""
        key = REPLAY_SOURCES[self.router_replay]
        from_rollout = "rollout_logprobs" in batch.extras
        capture = capture or (self.router_replay == "old_policy" and not training and from_rollout)
        replay = None
        if key is not None and from_rollout and (training or self.router_replay == "rollout"):
            replay = batch.extras.get(key)
            if replay is None:
                raise ConfigError("trainer.router_replay", f"{self.router_replay!r} replays the "
                                  f"batch's {key!r} routes, which it does not hold (a rollout engine "
                                  "that returned no routed experts?)")
        return self.routers.routing(replay=replay, compare=batch.extras.get("routed_experts"), capture=capture)

    @torch.no_grad()
    def _forward_all(
        self, model: nn.Module, batch: TrainBatch, with_entropy: bool, logit_term: LogitTerm | None = None,
        with_routes: bool = False, reference: bool = False,
    ) -> dict:
        parts: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"logprobs": [], "entropy": [], "logit_values": [],
                                                                     "routed_experts": []}
        policy = model is self.model and not reference
        for rows, micro in self._micro_batches(batch):
            routing = self._routing(micro, training=False, capture=with_routes) if policy else None
            if routing is None:
                scores, routed = self._scores(model, micro, with_entropy, logit_term), RoutingPass()
            else:
                with routing as routed:
                    scores = self._scores(model, micro, with_entropy, logit_term)
            if routed.captured:
                routes = routed.routes().view(*micro.input_ids.shape, *self.routers.shape)
                parts["routed_experts"].append((rows, routes))
            for key, value in (("logprobs", scores.logprobs), ("entropy", scores.entropy),
                               ("logit_values", scores.values)):
                if value is not None:
                    parts[key].append((rows, value.cpu()))
        n, length = batch.input_ids.shape
        return {key: scatter_rows(values, n, length) for key, values in parts.items() if values}

    def compute_logprobs(
        self, batch: TrainBatch, with_entropy: bool = False, logit_term: LogitTerm | None = None,
        with_routes: bool = False,
    ) -> dict[str, torch.Tensor]:
        """``{"logprobs": [N, L]}`` (+ ``"entropy"``, + ``"logit_values"`` [N, L, width] of
        ``logit_term``) in fp32 on CPU, without grad, at the loss-mask positions (0 elsewhere:
        the LM head runs only where a loss or a metric reads it). On an MoE model
        ``"routed_experts"`` ``[N, L, layers, top_k]`` are the routes the forward used, with
        ``with_routes`` and always under ``trainer.router_replay=old_policy`` (R2 replays them
        in ``train_step``)."""
        return self._forward_all(self.model, batch, with_entropy, logit_term, with_routes)

    def compute_ref_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Logprobs [N, L] under the frozen reference (the checkpoint at ``model.path``).

        The reference is loaded from disk on first use, so it is the initial policy even
        when asked for late or after ``load``. On a GPU it lives on the CPU between calls
        (``ref_offload``). With LoRA it is the policy with its adapters off (no copy).
        """
        if self.lora is not None:
            with self.lora.disabled():
                return self._forward_all(self.model, batch, with_entropy=False, reference=True)["logprobs"]
        if self._ref is None:
            m = self.model_cfg
            ref = load_causal_lm(m.path, m.dtype, m.trust_remote_code)
            ref.requires_grad_(False).eval()
            self._ref = ref if self.ref_offload else ref.to(self.device)
        self._ref.to(self.device)
        try:
            return self._forward_all(self._ref, batch, with_entropy=False)["logprobs"]
        finally:
            if self.ref_offload:
                self._ref.to("cpu")

    # training ------------------------------------------------------------------------

    def train_step(
        self,
        batch: TrainBatch,
        loss_fn: LossFn,
        mini_batches: int = 1,
        *,
        with_entropy: bool = False,
        logit_term: LogitTerm | None = None,
        old_from_forward: bool = False,
    ) -> dict[str, float]:
        """Split ``batch`` into ``mini_batches`` optimizer steps; return averaged metrics.

        ``loss_fn(ctx)`` returns a scalar loss or ``(loss, metrics)``; it must normalise by
        ``ctx.global_num_tokens`` / ``ctx.global_num_seqs``. Loss and metrics are additive
        shares of the mini-batch value (``loongsage.algorithms.metrics``), so both are summed
        over micro-batches, then averaged over mini-batches; metric names without a ``/``
        get a ``train/`` prefix. A batch with fewer rows than ``mini_batches`` takes one
        step per row (``train/optimizer_steps`` reports the count). ``logit_term``'s values
        reach the closure as ``ctx.logit_values``, with grad.

        ``old_from_forward`` (one mini-batch only): each micro-batch's detached logprobs
        become its ``extras["old_logprobs"]`` before the closure runs, and the whole batch's
        are left in ``batch.extras["old_logprobs"]``, so π_old costs no forward of its own
        (``Objective.old_from_loss_forward`` says when that is exact).
        """
        n = len(batch)
        if old_from_forward and mini_batches != 1:
            raise ValueError(
                f"train_step: old_from_forward needs one optimizer step, got {mini_batches} mini-batches "
                "(later mini-batches train on moved weights, so their pi_old needs its own forward)"
            )
        if mini_batches < 1 or n == 0:
            raise ConfigError(
                "train.mini_batches_per_step",
                f"need >= 1 mini-batch and a non-empty batch, got {mini_batches} for {n} rows",
            )
        mini_batches = min(mini_batches, n)  # a filtered batch may have fewer rows than steps
        totals: dict[str, float] = {"train/optimizer_steps": float(mini_batches)}
        for rows in torch.tensor_split(torch.arange(n), mini_batches):
            metrics, old = self._mini_batch_step(batch.rows(rows), loss_fn, with_entropy, logit_term,
                                                 old_from_forward)
            if old is not None:
                batch.extras["old_logprobs"] = old
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value / mini_batches
        return totals

    def _mini_batch_step(
        self, batch: TrainBatch, loss_fn: LossFn, with_entropy: bool, logit_term: LogitTerm | None,
        old_from_forward: bool = False,
    ) -> tuple[dict[str, float], torch.Tensor | None]:
        mask = batch.loss_mask.float()
        local_tokens, local_seqs = float(mask.sum()), float((mask.sum(-1) > 0).sum())
        tokens, seqs = self.parallel.global_counts(local_tokens, local_seqs)
        num_tokens, num_seqs = max(tokens, 1.0), max(seqs, 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, metrics, old_parts = 0.0, {}, []
        routes_seen = [0, 0, 0]  # tokens whose used / own routes differ from the rollout's, tokens with them
        for rows, micro in self._micro_batches(batch):
            dropout = self.lora.dropout_active() if self.lora is not None else nullcontext()
            with self._routing(micro, training=True) as routed, dropout:
                loss_value, logprobs = self._micro_step(micro, loss_fn, with_entropy, logit_term, num_tokens,
                                                        num_seqs, metrics, old_from_forward)
            if old_from_forward:
                old_parts.append((rows, logprobs.cpu()))
            loss_total += loss_value
            routes_seen[0] += routed.mismatched
            routes_seen[1] += routed.own_mismatched
            routes_seen[2] += routed.compared
        if routes_seen[2]:
            metrics["train/routing_mismatch"] = routes_seen[0] / routes_seen[2]
            metrics["train/routing_mismatch_own"] = routes_seen[1] / routes_seen[2]
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        total_norm = self.parallel.total_norm([p.grad for p in params if p.grad is not None])
        grad_norm = float(total_norm)
        if not math.isfinite(grad_norm):
            self._refuse_non_finite("gradient", {"train/grad_norm": grad_norm, **metrics})
        if self.train_cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.train_cfg.grad_clip, total_norm)
        self.optimizer.step()
        self.weight_version += 1
        self.optimizer.zero_grad(set_to_none=True)
        metrics.update({
            "train/loss": loss_total,
            "train/grad_norm": grad_norm,
            "train/lr": float(self.optimizer.param_groups[0]["lr"]),
            "train/num_tokens": num_tokens,
        })
        return metrics, scatter_rows(old_parts, *batch.input_ids.shape) if old_parts else None

    def _micro_step(self, micro: TrainBatch, loss_fn: LossFn, with_entropy: bool,
                    logit_term: LogitTerm | None, num_tokens: float, num_seqs: float,
                    metrics: dict[str, float], old_from_forward: bool = False) -> tuple[float, torch.Tensor]:
        """Forward, loss and backward of one micro-batch; adds its metrics, returns its loss and
        its detached logprobs (its pi_old too, with ``old_from_forward``). The entropy is always
        computed in the same chunked fp32 head: ``train/entropy`` is its mean over the loss mask
        (a share of the mini-batch's, like every metric); it carries a gradient only when the
        loss asks for it (``with_entropy``)."""
        scores = self._scores(self.model, micro, True, logit_term, entropy_grad=with_entropy)
        device_micro = TrainBatch(
            micro.input_ids.to(self.device),
            micro.attention_mask.to(self.device),
            micro.loss_mask.to(self.device),
            {k: v.to(self.device) for k, v in micro.extras.items()},
        )
        if old_from_forward:
            device_micro.extras["old_logprobs"] = scores.logprobs.detach()
        entropy = scores.entropy if with_entropy else None  # the loss sees it only when it asked
        ctx = LossContext(device_micro, scores.logprobs, entropy, num_tokens, num_seqs, scores.values)
        out = loss_fn(ctx)
        loss, extra = out if isinstance(out, tuple) else (out, {})
        part = {key if "/" in key else f"train/{key}": float(value) for key, value in extra.items()}
        entropy_share = (scores.entropy.detach() * device_micro.loss_mask).sum() / num_tokens
        part["train/entropy"] = float(entropy_share)
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            self._refuse_non_finite("loss", {"train/loss": loss_value, **part})
        self.parallel.backward(loss)
        for name, value in part.items():
            metrics[name] = metrics.get(name, 0.0) + value
        return loss_value, scores.logprobs.detach()

    def _refuse_non_finite(self, what: str, values: dict[str, float]) -> None:
        """Raise ``NonFiniteLossError`` naming the non-finite terms and parameter gradients."""
        bad = {name: value for name, value in values.items() if not math.isfinite(value)}
        bad.update({
            f"grad[{name}]": float(p.grad.norm()) for name, p in self.model.named_parameters()
            if p.grad is not None and not torch.isfinite(p.grad).all()
        })
        self.optimizer.zero_grad(set_to_none=True)
        raise NonFiniteLossError(what, bad, self.weight_version + 1)

    # weights out -----------------------------------------------------------------------

    def named_tensors(self, include_tied: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` for every entry of the HF state dict.

        With ``include_tied=False`` a tensor sharing storage with an earlier one (the
        ``lm_head.weight`` of a tied-embedding model) is skipped: a receiver's tied
        parameter shares storage too, so sending it twice only costs bytes.
        With LoRA these are what ``train.lora.sync`` sends: the adapters, or the merged weights.
        """
        named = self._state_tensors(include_tied)
        yield from (self.lora.sync_tensors(named) if self.lora is not None else named)

    def _state_tensors(self, include_tied: bool) -> Iterator[tuple[str, torch.Tensor]]:
        seen: set[int] = set()
        for name, tensor in self.model.state_dict().items():
            if not include_tied and storage_ptr(tensor) in seen:
                continue
            seen.add(storage_ptr(tensor))
            yield name, tensor.detach()

    def keep_weights_in(self, place: Callable[[list[Named]], list[Named]],
                        names: Container[str]) -> list[str]:
        """Hand the sync tensors of ``names`` (in sync order) to ``place``, which copies them
        where they go and returns those places as views, and make each parameter *be* its
        view, dropping its own storage; returns the parameters moved. For a weight-sync ring
        that engines read their weights from (``TransferMesh.place_in_ring``): the optimizer
        then steps the weights in the ring itself and the host holds one copy of them. Nothing
        moves where the sync tensors are not the parameters themselves (LoRA's adapters or
        merged weights, FSDP2's gathered shards)."""
        tensors = [(name, t) for name, t in self.named_tensors(include_tied=False) if name in names]
        if self.lora is not None or any(hasattr(t, "full_tensor") for _, t in tensors):
            return []
        params = dict(self.model.named_parameters())
        moved = []
        for name, view in place(tensors):
            if name in params:  # a buffer stays where it is and is copied by each sync
                params[name].data = view
                moved.append(name)
        return moved

    def state_numpy(self, include_tied: bool = False) -> dict[str, np.ndarray]:
        """The state dict as numpy arrays, the payload Ray moves fastest
        (benchmarks/embedded_engine.py, docs/benchmarks.md).

        Tied copies (``lm_head.weight`` of a tied-embedding model) are left out unless
        ``include_tied``: the receiver's tied parameter shares storage; for SmolLM2 this
        cuts a sync from 651 to 538 MB. fp32 tensors on CPU are zero-copy views of the live
        weights (copy them if kept across a train step); bf16 is widened to fp32.
        """
        out = {}
        for name, tensor in self.named_tensors(include_tied):
            if tensor.dtype == torch.bfloat16:
                tensor = tensor.float()
            out[name] = tensor.cpu().numpy()
        return out

    # checkpoints -----------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """HF folder (safetensors + tokenizer) plus ``train_state.pt`` for an exact resume;
        with LoRA the adapter (peft's format) in place of the weights."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        if self.lora is not None:
            self.lora.save(folder)
            self.tokenizer.save_pretrained(folder)
            save_train_state(folder, self.optimizer, self.weight_version)
            return folder
        self.parallel.save(self, folder)  # data-parallel ranks: all call it, rank 0 writes HF
        return folder

    def load(self, path: str | Path) -> None:
        """Restore weights (or the LoRA adapter), optimizer, weight version and RNG state
        written by ``save``."""
        if self.lora is not None:
            self.lora.load(Path(path))
            self.weight_version = restore_train_state(Path(path), self.optimizer)
            return
        self.weight_version = self.parallel.load(self, Path(path))

    # colocated phases ------------------------------------------------------------------

    def offload(self) -> bool:
        """Move parameters, gradients and optimizer state to host memory while engines
        generate (a no-op on CPU); True when something moved."""
        return offload_train_state(self.model, self.optimizer, self.device)

    def onload(self) -> bool:
        """Bring them back to the engine's device before training."""
        return onload_train_state(self.model, self.optimizer, self.device)
