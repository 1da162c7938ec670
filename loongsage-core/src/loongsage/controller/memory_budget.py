"""Start-up memory estimate of a run on one machine, and the check against what is free.

Before the first step the controller adds up what each process will hold at its peak and
compares the sum with the memory Ray's monitor lets the run use (it kills actors once the
machine passes ``RAY_memory_usage_threshold``, 0.95 by default, of its memory):

* **train actor**: weights, gradients and AdamW's two moments (4 x parameters x dtype size),
  the frozen reference when a KL term needs it, the activations autograd keeps for one
  micro-batch (10·hidden + 4·intermediate values per token and layer for a Llama/Qwen-style
  decoder: measured 12,090 for SmolLM2 against 11,904 from the formula, plus half as much
  again in flight during the backward), one chunk of fp32 logits, the process itself, and
  allocator slack of half of what a step allocates and frees again (gradients, activations):
  glibc's heap peaked that much above the live tensors (SmolLM2: 0.6 GB at 2 rows per
  micro-batch, 1.0-1.3 GB at 8);
* **each rollout engine**: weights, three times the KV cache of its running requests (the
  cache grows by concatenation, so the old and the new copy coexist and freed blocks are too
  small to reuse), fp32 logits of one decode step, and the process, unless it lives in its
  train rank's process (``placement.share_process``: the caller says how many do, from the
  same decision that places them, ``build.host_seats``);
* **weight sync**: one model-sized shared-memory ring (``engines.mesh_sync``). In a
  colocated CPU run of full fine-tuning the embedded engines take the ring's views as their
  weights, and an embedded DDP or single train rank keeps its own weights in it too (no delta
  shadow; FSDP2's shards are not the tensors it sends): the weights then count once, in the
  trainer (``shared_weights``);
* **the step terms' parts** (``config.step_terms``): what each of the run's step terms says
  its own actors hold and adds to each train actor (``MemoryShare``);
* **driver and Ray**: the controller process and Ray's own processes.

A row is a prompt (the longest of a sample of each data source's rendered prompts, at most
``rollout.max_prompt_tokens``) plus ``max_turns`` replies of ``rollout.max_new_tokens``; the
SFT warm start's rows are taken to be as long. With ``train.share_prompt`` an RL micro-batch
holds one group's rows at most and runs their prompt once (``engines.micro_batches``), so its
activations are one prompt plus each row's replies. The estimate is of the expected peak, not a
bound: it leaves out allocator slack and the Python objects of the run.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from loongsage.config.step_terms import ActiveTerm
from loongsage.controller.memory import GB, machine_memory
from loongsage.controller.placement import train_ranks
from loongsage.engines.routing import config_is_moe
from loongsage.errors import ConfigError
from loongsage.models.weight_files import checkpoint_files

PROCESS_BYTES = int(0.5 * GB)  # a worker with torch + transformers + Ray imported (measured 0.41-0.48 GB)
DRIVER_AND_RAY_BYTES = int(0.8 * GB)  # controller + gcs, raylet and agents (measured 0.81 GB RSS)
TOOL_RESULT_TOKENS = 64  # allowance per tool turn of a multi-turn agent
PROMPTS_SAMPLED = 32  # per data source, to find the longest prompt
WARN_FRACTION = 0.8
CHECK_MODES = ("refuse", "warn", "off")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def dtype_bytes(dtype: str) -> int:
    """Bytes per value of a ``model.dtype`` (4 for one not listed)."""
    return _DTYPE_BYTES.get(dtype, 4)


@dataclass
class ModelShape:
    """What the estimate needs to know of a model."""

    parameters: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    moe: bool = False  # top-k routed experts: the train engine shares no prompt there

    @classmethod
    def from_folder(cls, path: str) -> ModelShape:
        """Read a HF folder's config and count its parameters (no weights loaded)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        heads = config.num_attention_heads
        return cls(
            parameters=parameter_count(path, config),
            hidden=config.hidden_size,
            intermediate=getattr(config, "intermediate_size", 4 * config.hidden_size),
            layers=config.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            vocab=config.vocab_size,
            moe=config_is_moe(path),
        )


def saved_tensor_elements(folder: str | Path) -> int | None:
    """Elements of the model's saved tensors (``checkpoint_files``), read from the safetensors
    JSON headers alone; None when there are none or a header cannot be read. ``save_pretrained``
    writes a tied weight once and no non-persistent buffer, so for an unquantized HF checkpoint
    this is its parameter count."""
    files = checkpoint_files(folder)
    if not files:
        return None
    total = 0
    try:
        for file in files:
            with open(file, "rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                if length > file.stat().st_size - 8:
                    return None
                header = json.loads(handle.read(length))
            total += sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
    except (OSError, struct.error, ValueError, KeyError, TypeError):  # a pointer file, a truncated header
        return None
    return total


def parameter_count(path: str, config: Any) -> int:
    """The model's parameters: from the safetensors headers when the folder has them (the driver
    then never imports the model's code: 2.5 s of a run's start on a slow core), else counted
    on a model built on the meta device. Quantized weights are packed (several values per saved
    element), so a quantized model is always counted on the meta device."""
    saved = None if getattr(config, "quantization_config", None) else saved_tensor_elements(path)
    if saved is not None:
        return saved
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@dataclass
class Estimate:
    """Bytes per part of the run; ``parts`` keeps the breakdown for the message."""

    parts: dict[str, int] = field(default_factory=dict)
    detail: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def line(self, detailed: bool = True) -> str:
        """``9.0 GB: train actor 6.0 GB, ...``; ``detailed`` adds what makes up each part."""
        shown = ", ".join(
            f"{name} {size / GB:.1f} GB" + (f" ({self.detail[name]})" if detailed and name in self.detail else "")
            for name, size in self.parts.items()
        )
        return f"{self.total / GB:.1f} GB: {shown}"


def row_tokens(cfg: Any, sources: dict, tokenizer: Any) -> tuple[int, int]:
    """``(row, prompt)`` tokens of one training row: the longest sampled prompt plus the
    replies, and that prompt alone (module docstring)."""
    longest = 0
    for source in sources.values():
        size = source.size()
        tools = source.tool_schemas() or None
        for index in range(min(PROMPTS_SAMPLED, size if size is not None else PROMPTS_SAMPLED)):
            ids = tokenizer.apply_chat_template(source.get(index).messages, tools=tools, tokenize=True,
                                                add_generation_prompt=True, return_dict=False)
            longest = max(longest, len(ids))
    turns = max([int(getattr(s.spec.agent.params, "max_turns", 1) or 1) for s in sources.values()]
                or [1])
    prompt = min(longest, cfg.rollout.max_prompt_tokens)
    return prompt + turns * cfg.rollout.max_new_tokens + (turns - 1) * TOOL_RESULT_TOKENS, prompt


def micro_batch_tokens(cfg: Any, shape: ModelShape, tokens_per_row: int, prompt_tokens: int) -> tuple[int, str]:
    """Positions of the largest micro-batch, RL's or the SFT warm start's, and how it is made up.
    A group's prompt counts once where the embedded train engine shares it: ``share_prompt`` on,
    no gradient checkpointing, a dense model and groups of several samples (with one sample per
    prompt there is nothing to share, and rows are counted whole)."""
    t, r, sft = cfg.train, cfg.rollout, cfg.trainer.sft
    shared = (t.share_prompt and not t.gradient_checkpointing and not shape.moe
              and t.backend == "embedded_train" and r.n_samples_per_prompt > 1)
    rl_rows = min(t.micro_batch_size, r.n_samples_per_prompt if shared else
                  (r.prompts_per_step + r.oversample_groups) * r.n_samples_per_prompt)
    sft_rows = min(t.micro_batch_size, sft.batch_size) if sft.steps else 0
    replies = tokens_per_row - prompt_tokens
    rl = ((prompt_tokens + rl_rows * replies, f"{rl_rows} rows x {replies} reply tokens on one {prompt_tokens}-token prompt")
          if shared else (rl_rows * tokens_per_row, f"{rl_rows} rows x {tokens_per_row} tokens"))
    return max(rl, (sft_rows * tokens_per_row, f"{sft_rows} rows x {tokens_per_row} tokens (SFT)"))


def shared_weights(cfg: Any) -> tuple[bool, bool]:
    """``(engines, trainer)``: whether the rollout engines read their weights from the
    weight-sync ring, and whether the train ranks' weights are that ring (module docstring)."""
    t = cfg.train
    engines = (cfg.placement.mode == "colocated" and not cfg.placement.gpus_per_node
               and t.lora.rank == 0 and cfg.rollout.backend == "embedded_rollout")
    trainer = (engines and t.backend == "embedded_train" and not cfg.transfer.delta
               and not (t.strategy == "fsdp2" and t.dp_size > 1))
    return engines, trainer


def prefix_cache_bytes(cfg: Any, shape: ModelShape, tokens_per_row: int) -> int:
    """The most the embedded engine's prefix cache holds: ``rollout.prefix_cache_gb``, or, as it
    is cleared at every weight update (unless ``rollout.prefix_cache.keep_on_update``), the KV
    of one step's rows when that is less. SGLang's radix cache lives in its own KV pool."""
    r = cfg.rollout
    if r.backend != "embedded_rollout" or r.prefix_cache_gb <= 0:
        return 0
    budget = int(r.prefix_cache_gb * (1 << 30))
    if r.prefix_cache.keep_on_update:
        return budget
    rows = (r.prompts_per_step + r.oversample_groups) * r.n_samples_per_prompt
    per_token = shape.layers * 2 * shape.kv_heads * shape.head_dim * dtype_bytes(cfg.model.dtype)
    return min(budget, rows * tokens_per_row * per_token)


def estimate_run(cfg: Any, shape: ModelShape, tokens_per_row: int, prompt_tokens: int = 0,
                 step_terms: Sequence[ActiveTerm] = (), engines_in_train_processes: int = 0) -> Estimate:
    """The expected peak memory of every process of ``cfg``'s run (see the module docstring);
    ``prompt_tokens``: the part of a row that a group's rows share; ``step_terms``: the run's,
    whose ``memory`` adds their parts; ``engines_in_train_processes``: rollout engines that add no
    process of their own (``placement.share_process``)."""
    b = dtype_bytes(cfg.model.dtype)
    weights = shape.parameters * b
    t = cfg.train
    r = cfg.rollout
    micro_tokens, micro_batch = micro_batch_tokens(cfg, shape, tokens_per_row, prompt_tokens)
    per_token = 10 * shape.hidden + 4 * shape.intermediate
    if t.gradient_checkpointing:  # only each layer's input is kept, one layer is rebuilt at a time
        per_token_layers = shape.hidden * shape.layers + per_token
    else:
        per_token_layers = per_token * shape.layers
    activations = int(1.5 * micro_tokens * per_token_layers * b)
    logits = 3 * min(micro_tokens, t.logprob_chunk_tokens) * shape.vocab * 4
    reference = weights if cfg.algorithm.kl.coef else 0
    in_step = weights + activations + logits  # gradients and what one micro-batch needs
    slack = in_step // 2
    est = Estimate()
    # FSDP2 shards weights, grads and AdamW over the dp ranks; Megatron splits them over each
    # replica's tp x pp model-parallel ranks (activations are counted whole, an upper bound).
    shard = (t.dp_size if t.dp_size > 1 and t.strategy == "fsdp2" else 1) * t.megatron.tp * t.megatron.pp
    ranks = train_ranks(t)
    model_state = 4 * weights + reference  # weights, gradients, AdamW's two moments (+ the reference)
    rank = PROCESS_BYTES + model_state // shard + activations + logits + slack
    est.parts["train actor"] = ranks * rank
    est.detail["train actor"] = (f"{ranks} x (weights, gradients and AdamW {4 * weights / shard / GB:.1f} GB, "
                                 f"activations {activations / GB:.1f} GB for {micro_batch}, "
                                 f"allocator slack {slack / GB:.1f} GB)")
    requests = min(r.max_running_requests, (r.prompts_per_step + r.oversample_groups) * r.n_samples_per_prompt)
    kv = requests * tokens_per_row * shape.layers * 2 * shape.kv_heads * shape.head_dim * b
    engines_read_ring, trainer_is_ring = shared_weights(cfg)
    engine_weights = 0 if engines_read_ring else weights
    prefixes = prefix_cache_bytes(cfg, shape, tokens_per_row)
    engine = PROCESS_BYTES + engine_weights + 3 * kv + 2 * requests * shape.vocab * 4 + prefixes
    hosted = engines_in_train_processes
    est.parts["rollout engines"] = r.num_engines * engine - hosted * PROCESS_BYTES
    est.detail["rollout engines"] = (f"{r.num_engines} x (weights {engine_weights / GB:.1f} GB, KV cache "
                                     f"{kv / GB:.1f} GB for {requests} requests x {tokens_per_row} tokens, "
                                     f"prefix cache {prefixes / GB:.1f} GB)"
                                     + (f", {hosted} in train ranks' processes" if hosted else ""))
    est.parts["weight-sync ring"] = 0 if trainer_is_ring else weights
    if engines_read_ring:
        est.detail["weight-sync ring"] = ("the train ranks' weights" if trainer_is_ring else
                                          "the engines' weights")
    batch_tokens = (r.prompts_per_step + r.oversample_groups) * r.n_samples_per_prompt * tokens_per_row
    for share in (share for term in step_terms for share in term.memory(cfg, batch_tokens)):
        est.parts[share.part] = share.bytes
        est.parts["train actor"] += share.train_actor_bytes
        if share.detail:
            est.detail[share.part] = share.detail
    est.parts["driver and Ray"] = DRIVER_AND_RAY_BYTES
    return est


def room_bytes() -> tuple[int, int]:
    """``(room, total)``: bytes the run may take before Ray's memory monitor starts killing."""
    total, available = machine_memory()
    threshold = float(os.environ.get("RAY_memory_usage_threshold", "0.95"))
    return max(0, available - int((1 - threshold) * total)), total


def check_estimate(est: Estimate, mode: str, room: int, total: int) -> str:
    """Return the line to print; raise ``ConfigError`` when ``mode`` is refuse and it cannot fit.
    A run that fits gets one short line (the parts' sizes); a warning or a refusal says what
    makes up each part, the settings it names to lower."""
    free = f"{room / GB:.1f} GB free of {total / GB:.1f} GB"
    head = f"memory estimate {est.line()}; {free}"
    if est.total <= WARN_FRACTION * room:
        return f"memory estimate {est.line(detailed=False)}; {free}"
    lower = ("lower train.micro_batch_size (or set train.gradient_checkpointing=true), rollout.max_running_requests, "
             "rollout.max_new_tokens or rollout.num_engines")
    if est.total <= room or mode == "warn":
        return f"warning: {head}: the run may be killed by Ray's memory monitor; {lower}"
    biggest = max(("train actor", "rollout engines"), key=est.parts.__getitem__)
    key = "train.micro_batch_size" if biggest == "train actor" else "rollout.max_running_requests"
    raise ConfigError(key, f"the run needs about {head}, more than this machine can hold; {lower} "
                           "(placement.memory_check=warn starts it anyway)")


def check_run_memory(cfg: Any, sources: dict, tokenizer: Any, step_terms: Sequence[ActiveTerm] = (),
                     engines_in_train_processes: int = 0) -> str | None:
    """Estimate ``cfg``'s run and check it against this machine; the line to print, or None.

    Skipped (None) for ``placement.memory_check: off`` and when the actors run on a remote
    cluster, whose machines this process cannot see.
    """
    mode = cfg.placement.memory_check
    if mode not in CHECK_MODES:
        raise ConfigError("placement.memory_check", f"expected one of {list(CHECK_MODES)}, got {mode!r}")
    if mode == "off" or cfg.placement.ray_address or os.environ.get("RAY_ADDRESS"):
        return None
    est = estimate_run(cfg, ModelShape.from_folder(cfg.model.path), *row_tokens(cfg, sources, tokenizer),
                       step_terms=step_terms, engines_in_train_processes=engines_in_train_processes)
    return check_estimate(est, mode, *room_bytes())
