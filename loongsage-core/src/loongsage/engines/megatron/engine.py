"""The ``megatron`` train engine: a HF checkpoint trained as a Megatron-Core ``GPTModel``.

It implements the train engine protocol (``engines.protocols.TrainEngine``): per-token log-probs
and entropy in fp32, reference log-probs, ``train_step`` with the objective's loss closure
and global token denominators, micro-batches, gradient clipping, HF-named weights for
TransferMesh and HF checkpoints, so a recipe switches with ``train.backend=megatron``.
Tensor parallelism (``train.megatron.tp``), pipeline parallelism (``pp``, Megatron's 1F1B
schedule) and data parallelism (``train.dp_size``) run over the train ranks' process group
(``engines.megatron.parallel``); ``train.dp_size * tp * pp`` ranks in all.

Every forward and backward goes through Megatron's own schedule
(``get_forward_backward_func``), with our ``forward_step``: decoder, then the vocab-parallel
fp32 LM head (``engines.megatron.logprobs``); on the last stage the closure's loss is
returned with ``calculate_per_token_loss`` so the schedule never rescales it.

Deviations from a GPU Megatron trainer, all because this is the path CPU CI can run
(docs/backends.md): the optimizer is ``torch.optim.AdamW`` over Megatron's parameters
(Megatron's ``get_megatron_optimizer`` allocates on CUDA), gradients are reduced by us
(data-parallel all-reduce, the tied embedding's all-reduce between first and last stage)
rather than by Megatron's DDP wrapper, micro-batches keep the batch's right padding (no
sequence packing, as in the embedded engine), no fp32 master copy is kept for bf16 weights
(as in the embedded engine), and a weight export gathers the whole model on every rank
(``named_tensors``) before each rank sends its part.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch

from loongsage.engines.batch import LogitTerm, LossContext, TrainBatch
from loongsage.engines.sections import config_section, train_section
from loongsage.engines.megatron import cpu_shims
from loongsage.engines.megatron.bridge import build_with_bridge, export_with_bridge, uses_bridge
from loongsage.engines.megatron.grads import clip_and_norm, reduce_gradients
from loongsage.engines.megatron.logprobs import decoder_hidden, token_scores
from loongsage.engines.megatron.model import build_stage, full_hf_state, read_hf
from loongsage.engines.megatron.parallel import Layout, MegatronRanks, init_groups
from loongsage.engines.memory import offload_train_state, onload_train_state
from loongsage.errors import ConfigError, NonFiniteLossError
from loongsage.schema import ModelConfig, TrainConfig

LossFn = Callable[[LossContext], Any]


def layout_of(train: TrainConfig) -> Layout:
    """The Megatron parallel sizes a train config asks for (``ConfigError`` if invalid)."""
    mc = train.megatron
    for key in ("tp", "pp", "cp"):
        if getattr(mc, key) < 1:
            raise ConfigError(f"train.megatron.{key}", f"must be >= 1, got {getattr(mc, key)}")
    if mc.cp != 1:
        raise ConfigError("train.megatron.cp", "context parallelism is not supported on this "
                          "backend yet (its attention needs Transformer Engine); use cp=1")
    return Layout(tp=mc.tp, pp=mc.pp, dp=train.dp_size)


class MegatronTrainEngine:
    """Train a HF Llama-family / Qwen3-MoE checkpoint with Megatron-Core; see the module doc."""

    # the backend keys it reads (config.backend_support): any other set is refused at validation,
    # e.g. train.gradient_checkpointing, train.max_tokens_per_micro_batch, train.strategy (its own
    # train.megatron layout shards), trainer.router_replay, train.share_prompt, train.lora
    implemented_keys = frozenset({
        "train.lr", "train.weight_decay", "train.betas", "train.eps", "train.grad_clip", "train.micro_batch_size",
        "train.mini_batches_per_step", "train.num_threads", "train.logprob_chunk_tokens", "train.dp_size",
        "train.megatron"})

    def __init__(self, model: ModelConfig, train: TrainConfig, *, device: str | None = None,
                 seed: int = 0) -> None:
        from transformers import AutoTokenizer

        if train.micro_batch_size < 1:
            raise ConfigError("train.micro_batch_size", f"must be >= 1, got {train.micro_batch_size}")
        self.model_cfg, self.train_cfg, self.seed = model, train, seed
        self.layout = layout_of(train)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if train.num_threads > 0:
            torch.set_num_threads(train.num_threads)
        torch.manual_seed(seed)
        from transformers import AutoConfig

        self.hf_config = AutoConfig.from_pretrained(model.path)
        self.bridged = uses_bridge(self.hf_config)  # megatron-bridge converts it (untested)
        self.tokenizer = AutoTokenizer.from_pretrained(
            model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code)
        self.weight_version = 0
        self._ref: torch.nn.Module | None = None
        self.model: torch.nn.Module | None = None
        if self.layout.world_size == 1:  # no other rank to wait for
            self.join_process_group("127.0.0.1", 0, 0, 1, "megatron")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], device: str | None = None) -> "MegatronTrainEngine":
        """Build from the full resolved config (sections ``model``, ``train``, ``trainer``)."""
        from loongsage.models.resolve import resolve_model_path

        model = config_section(cfg, "model", ModelConfig)
        model.path = str(resolve_model_path(str(model.path)))
        train = train_section(cfg)
        trainer = cfg.get("trainer") or {}
        return cls(model, train, device=device, seed=int(trainer.get("seed", 0)))

    # process group -------------------------------------------------------------------

    def join_process_group(self, host: str, port: int, rank: int, world_size: int,
                           strategy: str) -> str:
        """Become rank ``rank`` of the train ranks (all call it at once; see ``parallel``)."""
        import torch.distributed as dist
        from torch.distributed import HashStore, TCPStore

        if world_size != self.layout.world_size:
            raise ConfigError("train.megatron", f"{world_size} train ranks started, but "
                              f"tp={self.layout.tp} x pp={self.layout.pp} x dp_size="
                              f"{self.layout.dp} needs {self.layout.world_size}")
        if world_size == 1:
            store = HashStore()
        else:
            store = getattr(self, "rendezvous", None) if rank == 0 else None
            store = store or TCPStore(host, port, is_master=False)
        init_groups(self.layout, rank, store, self.device, self.seed)
        self.parallel = MegatronRanks(self.layout)
        self.model = self._build(self.model_cfg.path)
        self.optimizer = self._new_optimizer(self.train_cfg.lr)
        return str(dist.get_backend())

    def _build(self, folder: str | Path) -> torch.nn.Module:
        """This rank's stage holding the HF weights in ``folder``."""
        if self.bridged:
            return build_with_bridge(str(folder), self.layout.tp, self.layout.pp).to(self.device)
        weights = read_hf(folder)[1]
        return build_stage(self.hf_config, weights, self.model_cfg.dtype, self.parallel).to(self.device)

    def _new_optimizer(self, lr: float) -> torch.optim.Optimizer:
        t = self.train_cfg
        if len(t.betas) != 2:
            raise ConfigError("train.betas", f"expected two numbers, got {list(t.betas)}")
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, betas=(float(t.betas[0]), float(t.betas[1])),
                                 eps=t.eps, weight_decay=t.weight_decay)

    def reset_optimizer(self, lr: float | None = None) -> None:
        """Fresh AdamW moments at ``lr`` (default ``train.lr``)."""
        self.optimizer = self._new_optimizer(self.train_cfg.lr if lr is None else lr)

    # the schedule ----------------------------------------------------------------------

    def _micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        size = self.train_cfg.micro_batch_size
        return [batch.rows(slice(i, i + size)) for i in range(0, len(batch), size)]

    def _forward_step(self, on_scores: Callable, with_entropy: bool, logit_term: LogitTerm | None,
                      data: Iterator[TrainBatch], model: torch.nn.Module) -> tuple:
        micro = next(data)
        ids = micro.input_ids.to(self.device)
        mask = micro.attention_mask.to(self.device)
        hidden = decoder_hidden(model, ids, mask)

        def loss_func(output: torch.Tensor) -> tuple:
            extras = {k: micro.extras[k].to(self.device) for k in logit_term.inputs} if logit_term else None
            scores = token_scores(model, output, ids, mask, tp=self.layout.tp,
                                  tp_rank=self.parallel.tp_rank, with_entropy=with_entropy,
                                  chunk_tokens=self.train_cfg.logprob_chunk_tokens,
                                  term=logit_term, extras=extras, score_mask=micro.loss_mask.to(self.device))
            loss, report = on_scores(micro, scores)
            return loss, torch.ones((), dtype=torch.int), report

        return hidden, loss_func

    def _schedule(self, model: torch.nn.Module, batch: TrainBatch, on_scores: Callable,
                  forward_only: bool, with_entropy: bool = False,
                  logit_term: LogitTerm | None = None) -> list:
        """Megatron's forward(-backward) schedule over ``batch``'s micro-batches; returns the
        last stage's per-micro-batch reports (empty elsewhere)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micros = self._micro_batches(batch)
        step = partial(self._forward_step, on_scores, with_entropy, logit_term)
        with cpu_shims.cuda_factories_on_cpu(), torch.set_grad_enabled(not forward_only):
            return get_forward_backward_func()(
                forward_step_func=step, data_iterator=iter(micros), model=[model],
                num_microbatches=len(micros), seq_length=batch.input_ids.shape[1],
                micro_batch_size=self.train_cfg.micro_batch_size, forward_only=forward_only)

    # forward passes ----------------------------------------------------------------------

    def _forward_all(self, model: torch.nn.Module, batch: TrainBatch, with_entropy: bool,
                     logit_term: LogitTerm | None = None) -> dict[str, torch.Tensor]:
        def keep(micro: TrainBatch, scores: Any) -> tuple:
            parts = {"logprobs": scores.logprobs, "entropy": scores.entropy,
                     "logit_values": scores.values}
            report = {k: v.detach().cpu() for k, v in parts.items() if v is not None}
            return torch.zeros(()), report

        reports = self._schedule(model, batch, keep, True, with_entropy, logit_term)
        keys = ["logprobs"] + (["entropy"] if with_entropy else []) + (["logit_values"] if logit_term else [])
        out = {}
        for key in keys:
            local = torch.cat([r[key] for r in reports]) if reports else None
            shape = tuple(batch.input_ids.shape) + ((logit_term.width,) if key == "logit_values" else ())
            out[key] = self.parallel.from_last_stage(local, shape)
        return out

    def compute_logprobs(self, batch: TrainBatch, with_entropy: bool = False,
                         logit_term: LogitTerm | None = None) -> dict[str, torch.Tensor]:
        """``{"logprobs": [N, L]}`` (+ ``"entropy"``, ``"logit_values"``) fp32 on CPU, on
        every rank of the data-parallel replica."""
        return self._forward_all(self.model, batch, with_entropy, logit_term)

    def compute_ref_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Logprobs [N, L] under the frozen reference (the checkpoint at ``model.path``)."""
        if self._ref is None:
            self._ref = self._build(self.model_cfg.path).requires_grad_(False)
        return self._forward_all(self._ref, batch, with_entropy=False)["logprobs"]

    def final_hidden_states(self, batch: TrainBatch) -> torch.Tensor:
        """``[N, L, H]``: the decoder's output (after the final norm), the input of the
        output layer, for distillation; on every rank of the replica."""
        def keep(micro: TrainBatch, scores: Any) -> tuple:
            return torch.zeros(()), {}

        hidden: list[torch.Tensor] = []

        def capture(output: torch.Tensor) -> None:
            hidden.append(output.detach().transpose(0, 1).float().cpu())

        handle = self.model.decoder.register_forward_hook(lambda m, i, o: capture(o))
        try:
            self._schedule(self.model, batch, keep, True)
        finally:
            handle.remove()
        local = torch.cat(hidden) if self.parallel.last_stage else None
        shape = (*batch.input_ids.shape, self.hf_config.hidden_size)
        return self.parallel.from_last_stage(local, shape)

    def routed_experts(self, batch: TrainBatch) -> torch.Tensor:
        """``[N, L, layers, k]``: the experts each token's router chose (MoE models; -1 at
        padding), for router replay (``engines.megatron.routing``)."""
        from loongsage.engines.megatron.routing import routed_experts

        return routed_experts(self, batch)

    # training ------------------------------------------------------------------------

    # pi_old from the loss forward is not wired through Megatron's pipeline schedule (the
    # log-probs live on the last stage): the controller runs the no-grad pi_old forward
    needs_pi_old_forward = True

    def train_step(self, batch: TrainBatch, loss_fn: LossFn, mini_batches: int = 1, *,
                   with_entropy: bool = False, logit_term: LogitTerm | None = None,
                   old_from_forward: bool = False) -> dict[str, float]:
        """As ``EmbeddedTrainEngine.train_step``; additive metrics come from one rank per
        data-parallel replica (``MegatronRanks.share_metrics``). ``old_from_forward`` is refused
        (``needs_pi_old_forward``)."""
        if old_from_forward:
            raise ValueError("megatron train_step: pi_old comes from its own forward (needs_pi_old_forward)")
        n = len(batch)
        if mini_batches < 1 or n == 0:
            raise ConfigError("train.mini_batches_per_step",
                              f"need >= 1 mini-batch and a non-empty batch, got {mini_batches} for {n} rows")
        mini_batches = min(mini_batches, n)
        totals: dict[str, float] = {"train/optimizer_steps": float(mini_batches)}
        for rows in torch.tensor_split(torch.arange(n), mini_batches):
            metrics = self._mini_batch_step(batch.rows(rows), loss_fn, with_entropy, logit_term)
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value / mini_batches
        return self.parallel.share_metrics(totals)

    def _mini_batch_step(self, batch: TrainBatch, loss_fn: LossFn, with_entropy: bool,
                         logit_term: LogitTerm | None) -> dict[str, float]:
        mask = batch.loss_mask.float()
        tokens, seqs = self.parallel.global_counts(float(mask.sum()), float((mask.sum(-1) > 0).sum()))
        num_tokens, num_seqs = max(tokens, 1.0), max(seqs, 1.0)

        def closure(micro: TrainBatch, scores: Any) -> tuple:
            device_micro = TrainBatch(micro.input_ids.to(self.device), micro.attention_mask.to(self.device),
                                      micro.loss_mask.to(self.device),
                                      {k: v.to(self.device) for k, v in micro.extras.items()})
            entropy = scores.entropy if with_entropy else None  # the loss sees it only when it asked
            ctx = LossContext(device_micro, scores.logprobs, entropy, num_tokens, num_seqs, scores.values)
            out = loss_fn(ctx)
            loss, extra = out if isinstance(out, tuple) else (out, {})
            report = {key if "/" in key else f"train/{key}": float(value) for key, value in extra.items()}
            report["train/loss"] = float(loss.detach())
            report["train/entropy"] = float((scores.entropy.detach() * device_micro.loss_mask).sum() / num_tokens)
            return loss, report

        self.optimizer.zero_grad(set_to_none=True)
        # the entropy is always scored in the fp32 head (train/entropy, as the embedded engine logs it)
        reports = self._schedule(self.model, batch, closure, False, True, logit_term)
        metrics: dict[str, float] = {}
        for report in reports:
            for name, value in report.items():
                metrics[name] = metrics.get(name, 0.0) + value
        self._refuse_if_any_non_finite("loss", metrics)
        reduce_gradients(self.model, self.parallel)
        grad_norm = clip_and_norm(self.model, self.parallel, self.train_cfg.grad_clip)
        if not math.isfinite(grad_norm):
            self._refuse_if_any_non_finite("gradient", {"train/grad_norm": grad_norm})
        self.optimizer.step()
        self.weight_version += 1
        self.optimizer.zero_grad(set_to_none=True)
        metrics.update({"train/grad_norm": grad_norm,
                        "train/lr": float(self.optimizer.param_groups[0]["lr"]),
                        "train/num_tokens": num_tokens})
        return metrics

    def _refuse_if_any_non_finite(self, what: str, values: dict[str, float]) -> None:
        """Raise ``NonFiniteLossError`` on every rank when any rank saw a non-finite value."""
        import torch.distributed as dist

        bad = {name: value for name, value in values.items() if not math.isfinite(value)}
        flag = torch.tensor([float(bool(bad))])
        dist.all_reduce(flag)
        if flag.item() > 0:
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(what, bad or {"(another rank)": float("nan")}, self.weight_version + 1)

    # weights out -----------------------------------------------------------------------

    def named_tensors(self, include_tied: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` for the whole model, un-fused and unsharded, in the order
        of the HF model's state dict (a collective: every rank of every stage calls it)."""
        if self.bridged:
            hf = export_with_bridge(self.model_cfg.path, self.model)
        else:
            hf = full_hf_state(self.model, self.hf_config, self.parallel)
        for name in self._hf_order():
            if name in hf:
                yield name, hf[name]
            elif include_tied and name == "lm_head.weight":
                yield name, hf["model.embed_tokens.weight"]

    def _hf_order(self) -> list[str]:
        if not hasattr(self, "_order"):
            from transformers import AutoModelForCausalLM

            with torch.device("meta"):
                self._order = list(AutoModelForCausalLM.from_config(self.hf_config).state_dict())
        return self._order

    def state_numpy(self, include_tied: bool = False) -> dict[str, np.ndarray]:
        """The HF state dict as numpy arrays (bf16 widened to fp32), like the embedded engine's."""
        return {name: (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()
                for name, t in self.named_tensors(include_tied)}

    # checkpoints -----------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Megatron distributed checkpoint (model + optimizer) plus the HF export."""
        from loongsage.engines.megatron.checkpoint import save_checkpoint

        folder = Path(path)
        save_checkpoint(self, folder)
        return folder

    def load(self, path: str | Path) -> None:
        """Restore weights, optimizer, weight version and RNG state written by ``save``."""
        from loongsage.engines.megatron.checkpoint import load_checkpoint

        self.weight_version = load_checkpoint(self, Path(path))

    # colocated phases ------------------------------------------------------------------

    def offload(self) -> bool:
        """Parameters, gradients and optimizer state to host memory (a no-op on CPU)."""
        return offload_train_state(self.model, self.optimizer, self.device)

    def onload(self) -> bool:
        return onload_train_state(self.model, self.optimizer, self.device)
