"""Structured configuration: one typed dataclass per section of the config tree.

Data only, at the bottom of the package: engines read their sections (``model``, ``train``,
``rollout``) from it, and ``loongsage.config`` composes, validates and resolves a config
against it. The root node is a dict of sections rather than a dataclass because one section is called
``async``, a Python keyword. Plugin-bound fields (``algorithm.policy_loss`` and friends)
are ``PluginRef`` nodes: a ``name`` plus that plugin's own parameters, typed by the
parameter dataclass the plugin registered (validated in ``loongsage.config.validate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from loongsage.transfer.frames import TransferConfig


@dataclass
class ModelConfig:
    """Which checkpoint to train and how to load it."""

    path: str = MISSING  # any Hugging Face folder; see `loongsage models` for local ones
    tokenizer_path: Optional[str] = None  # defaults to `path`
    dtype: str = "float32"  # float32 | bfloat16 | float16
    fp32_lm_head: bool = True  # compute logits and log-softmax in fp32 (train/infer consistency)
    trust_remote_code: bool = False  # let transformers run the checkpoint's own Python modelling code


@dataclass
class MegatronSettings:
    """``train.megatron``: model-parallel sizes of the megatron backend (x ``train.dp_size``)."""

    tp: int = 1  # tensor-parallel ranks (vocab-parallel LM head, column/row-parallel layers)
    pp: int = 1  # pipeline stages (Megatron's 1F1B schedule)
    cp: int = 1  # context parallelism: only 1 is supported here


@dataclass
class LoraSettings:
    """``train.lora``: LoRA adapters instead of full fine-tuning (``engines.lora``; rank 0 = off)."""

    rank: int = 0  # adapter rank r (peft's LoraConfig.r); 0 = full fine-tuning
    alpha: float = 16.0  # lora_alpha: the update is scaled by alpha / rank
    dropout: float = 0.0  # dropout on the adapters' input while training, in [0, 1)
    # names of the modules that get adapters (peft matches them against the module names)
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    sync: str = "adapter"  # adapter (only adapter tensors; the embedded engine merges) | merged


@dataclass
class TrainConfig:
    """The train engine: backend, optimiser and batching."""

    backend: str = "embedded_train"  # engine plugin training the policy: embedded_train | megatron
    lr: float = 1e-5  # AdamW learning rate (constant over the RL steps)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW (beta1, beta2)
    eps: float = 1e-8  # AdamW epsilon
    grad_clip: float = 1.0  # clip the global gradient norm to this before each optimizer step; 0 = off
    micro_batch_size: int = 8  # sequences per forward/backward
    share_prompt: bool = True  # a group's prompt runs once per micro-batch, replies on its KV cache
    # > 0: length-sorted micro-batches of rows x longest <= this (overrides micro_batch_size)
    max_tokens_per_micro_batch: int = 0
    mini_batches_per_step: int = 1  # optimizer steps per rollout batch
    num_threads: int = 0  # torch threads per train rank (0 = the cores its placement gives it)
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, more compute
    logprob_chunk_tokens: int = 512  # positions per fp32 LM-head + log-softmax chunk ([tokens, vocab] logits)
    dp_size: int = 1  # data-parallel train ranks: one torch.distributed group (gloo / NCCL)
    strategy: str = "ddp"  # ddp | fsdp2 (sharded params, grads, optimizer state); for dp_size > 1
    megatron: MegatronSettings = field(default_factory=MegatronSettings)  # train.backend=megatron
    lora: LoraSettings = field(default_factory=LoraSettings)


@dataclass
class EngineHealthConfig:
    """The engine monitor (controller/engine_health.py): when an engine counts as dead or hung."""

    enable: bool = True  # run the monitor (not with placement.share_process, where a rank owns its engine)
    interval_s: float = 2.0  # between two looks at every engine
    failures: int = 3  # /health probes in a row without a 200 that mean hung (a local stopped process: at once)
    max_restarts: int = 3  # restarts per run; past them a dead engine stays down
    restart_timeout_s: float = 300.0  # a restarted engine's start, weights and /health
    max_attempts: int = 3  # sends of one /generate or router turn, the first included, before it fails


@dataclass
class SGLangConfig:
    """``rollout.backend=sglang``: how each replica's server is launched (engines/sglang/engine.py)."""

    # the server's command; --model-path, --port and the other flags are appended
    launch_command: List[str] = field(default_factory=lambda: ["python", "-m", "sglang.launch_server"])
    tp_size: int = 1  # --tp-size: tensor-parallel GPUs per server
    mem_fraction_static: float = 0.8  # --mem-fraction-static: GPU memory share for weights and KV cache
    context_length: Optional[int] = None  # --context-length; null = the model's own
    routed_experts: bool = False  # --enable-return-routed-experts (router replay)
    extra_args: List[str] = field(default_factory=list)  # appended to the server's command line as they are
    startup_timeout_s: float = 600.0  # wait this long for a launched server's /health before failing


@dataclass
class PrefixCacheConfig:
    """``rollout.prefix_cache``: how the embedded engine's prefix cache treats weight updates."""

    # on: later turns continue on KV of older weights (the mismatch shows in
    # train/is_approx_k3_kl); off: every weight update clears the cache
    keep_on_update: bool = False  # keep the prefix cache across weight updates


@dataclass
class RolloutConfig:
    """The rollout engines and sampling."""

    backend: str = "embedded_rollout"  # engine plugin generating samples: embedded_rollout | sglang
    num_engines: int = 1  # rollout engine replicas (colocated: engine i shares bundle i with train rank i)
    prompts_per_step: int = 4  # B: prompt groups per training step
    n_samples_per_prompt: int = 4  # G: samples per prompt group
    max_new_tokens: int = 64  # most tokens generated per reply (per turn for multi-turn agents)
    max_prompt_tokens: int = 512  # longest prompt in tokens (capped at the model's context less one)
    long_prompts: str = "refuse"  # a prompt above max_prompt_tokens (or the context): refuse | drop (counted)
    temperature: float = 1.0  # sampling temperature of training rollouts (0 = greedy)
    top_p: float = 1.0  # nucleus sampling: keep the smallest token set of this probability, in (0, 1]
    top_k: int = -1  # keep the k most likely tokens; -1 = off
    max_running_requests: int = 64  # engine's decode batch cap
    num_threads: int = 0  # torch threads per embedded rollout engine (0 = the cores its placement gives it)
    # a turn prefills only its new tokens (engines.embedded_rollout.prefix_cache)
    prefix_cache_gb: float = 1.0  # GiB of earlier requests' prefix KV an engine keeps (LRU; 0 = off)
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    partial: bool = False  # partial rollout across weight updates
    # partial rollout: tokens sampled under an older weight version than the sample's newest leave the loss
    mask_offpolicy_in_partial_rollout: bool = False
    oversample_groups: int = 0  # extra prompt groups dispatched per step
    health: EngineHealthConfig = field(default_factory=EngineHealthConfig)
    # a trajectory marked failed (agent timed out, its engine turn failed): zero_reward trains it
    # with reward 0; drop_group generates the group again (at most reward.drop_group_retries times)
    failed_trajectory: str = "zero_reward"
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    # keep every step's trained batch in <run_dir>/batches/ (what `loongsage replay` and
    # rollout.from_recording read; controller.recording)
    record: bool = False
    # train on a recorded run's batches (its run directory) with no rollout engine
    # (controller.recorded_rollout)
    from_recording: Optional[str] = None


@dataclass
class KLConfig:
    """KL regularisation against a frozen reference."""

    method: str = "k3"  # kl_policy name
    coef: float = 0.0  # 0 disables the reference model entirely
    use_as: str = "loss"  # loss | reward


# how the per-token loss is reduced (loongsage.algorithms.aggregation); here so that validating a
# config (and with it `loongsage --help` and `loongsage plugins`) needs no torch
AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


@dataclass
class AlgorithmConfig:
    """Advantage, policy loss, KL, IS correction, filters (step terms may add a section here:
    ``config.step_terms``)."""

    advantage_estimator: Any = field(default_factory=lambda: {"name": "grpo"})
    policy_loss: Any = field(default_factory=lambda: {"name": "ppo_clip"})
    loss_agg_mode: str = "token_mean"  # one of AGG_MODES
    loss_agg_norm_len: Optional[float] = None  # C of seq_mean_token_sum_norm (Dr. GRPO); null = padded width
    kl: KLConfig = field(default_factory=KLConfig)
    is_correction: Any = None  # PluginRef, list of PluginRefs (e.g. [opsm, token]) or null
    filters: List[Any] = field(default_factory=list)  # PluginRefs


@dataclass
class AsyncConfig:
    """Fully asynchronous runtime: window policy and its bounds."""

    enable: bool = False  # rollout runs ahead of training by up to stale_steps versions (else step by step)
    window_policy: Any = field(default_factory=lambda: {"name": "no_window"})
    stale_steps: int = 1  # S: max policy versions a trained token may lag


@dataclass
class PlacementConfig:
    """Where actors run: Ray placement groups built from resource bundles (docs/cluster.md).

    Colocated: bundle i holds train rank i and rollout engine i, which take turns on its
    device. Disaggregated: one placement group per role, each actor in a bundle of its own.
    """

    mode: str = "colocated"  # colocated | disaggregated
    ray_address: Optional[str] = None  # defaults to RAY_ADDRESS, else a local cluster
    num_cpus: Optional[int] = None  # for a local cluster
    train_cpus: float = 1.0  # CPUs booked per train rank
    rollout_cpus: float = 1.0  # CPUs booked per rollout engine
    gpus_per_node: int = 0  # 0: CPU bundles; else one GPU per train rank / engine bundle
    nodes: int = 1  # nodes the run waits for before placing (and the GPUs it may use)
    train_strategy: str = "PACK"  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD; colocated: its group
    rollout_strategy: str = "PACK"  # the rollout group's (disaggregated)
    train_resources: Dict[str, float] = field(default_factory=dict)  # custom resources per bundle
    rollout_resources: Dict[str, float] = field(default_factory=dict)  # (colocated: both merged)
    timeout_s: float = 120.0  # wait this long for the cluster to fit the bundles
    object_store_memory: int = 1 << 30  # bytes of Ray's object store, for a local cluster
    memory_check: str = "refuse"  # refuse | warn | off, when the start-up memory estimate exceeds free memory
    # colocated: rollout engine i lives in train rank i's process when its engine class allows it
    # (the embedded one): one copy of torch and transformers less; it then fails and restarts
    # with that rank (no engine monitor). false: every engine an actor of its own
    share_process: bool = True


@dataclass
class RewardOptions:
    """The generic keys of every ``data_sources[i].reward`` node, next to the reward's own
    parameters; their defaults come from the run-wide ``reward`` section."""

    timeout_s: float = 30.0  # deadline of one reward call; past it the worker is killed
    on_error: str = "zero"  # a timed-out or failed call: zero | drop_group | fail


@dataclass
class RewardConfig(RewardOptions):
    """Reward calls: their worker processes and the defaults of every source's reward node."""

    workers: int = 0  # reward worker processes; 0 = one per core this process may use
    drop_group_retries: int = 2  # on_error=drop_group: regenerations of a prompt's group before the run fails


@dataclass
class BudgetConfig:
    """Time budgets of plugin calls that run in-process (past one, the run stops with an error
    naming the plugin)."""

    dataset_load_s: float = 600.0  # building one data source's dataset (reading its file)
    dataset_get_s: float = 60.0  # one dataset.get(index)
    filter_s: float = 120.0  # one data filter call on a round of groups
    prompt_check_s: float = 120.0  # reading, rendering, measuring every record at start-up (the rest: when drawn)


@dataclass
class DataSourceConfig:
    """One data source: its prompts, agent, reward (or an environment in their place), sandbox
    and sampling (installed step terms add keys of their own: ``config.step_terms``)."""

    name: str = MISSING  # unique; names the source in prompts, samples and metrics (rollout/reward_mean/<name>)
    weight: float = 1.0  # proportion of every batch (normalised over sources)
    dataset: Any = None  # PluginRef keyed by `format`; required unless `environment` is set
    agent: Any = None  # PluginRef; null = single_turn (an environment runs its own episodes)
    reward: Any = None  # PluginRef; required unless `environment` is set
    # PluginRef keyed by `type`: tasks, episodes and rewards from an environment library, in
    # place of dataset, agent and reward (loongsage.data.environments)
    environment: Any = None
    sandbox: Any = None  # PluginRef keyed by `type`
    # data_filter PluginRefs applied to this source's groups, before algorithm.filters
    filters: List[Any] = field(default_factory=list)
    sampling: Dict[str, Any] = field(default_factory=dict)  # overrides of rollout sampling
    system_prompt: Optional[str] = None  # sent as the first (system) message of every prompt
    # scored by trainer.eval_* only (e.g. held-out tasks): never in a training batch or the SFT
    # warm start; while any source is eval_only, evaluations draw from those sources alone
    eval_only: bool = False


PARSER_MIDDLEWARE = "tool_call_parser"  # the built-in router middleware every chain has, last unless listed


@dataclass
class AgentFlowConfig:
    """The AgentFlow router."""

    host: str = "127.0.0.1"  # any other address needs api_key (agentflow/access.py)
    port: int = 0  # 0 = pick a free port
    tool_parser: str = "hermes"  # tool_parser plugin reading tool calls in replies (and writing SFT demos)
    # router_middleware PluginRefs, in chain order; the built-in tool_call_parser is added last unless listed
    middlewares: List[Any] = field(default_factory=list)
    api_key: Optional[str] = None  # else LOONGSAGE_ROUTER_API_KEY; with one, agents get per-trajectory tokens
    max_body_bytes: int = 32 << 20  # request bodies past this are refused with 413
    header_timeout_s: float = 30.0  # a connection whose request headers are not in by then is closed
    body_timeout_s: float = 120.0  # a request body not read whole by then is refused with 408


@dataclass
class LoggingConfig:
    """Trackers, run directory and trajectory samples."""

    trackers: List[Any] = field(default_factory=lambda: ["console", "jsonl"])  # tracker PluginRefs
    run_root: str = "runs"  # a new run's directory is <run_root>/<run_name> (unless trainer.run_dir)
    run_name: Optional[str] = None  # null = the start time, YYYYMMDD-HHMMSS
    samples_per_step: int = 4  # decoded trajectories saved per step
    tracker_samples_every: int = 10  # every N steps the saved samples go to the trackers too (0 = never)
    progress_bar: bool = True  # a tqdm bar of the steps on stderr, when it is a terminal


@dataclass
class CheckpointConfig:
    """Checkpointing."""

    interval: int = 0  # steps between checkpoints; 0 = only at the end
    keep_last: int = 2  # newest step_* checkpoints kept on disk; older ones are deleted
    # save the trainer after every step that is not checkpointed (checkpoints/.snapshot_step_N, one kept):
    # an actor death then loses at most the step in flight (controller/step_snapshot.py)
    snapshot: bool = True


@dataclass
class SFTConfig:
    """Supervised warm start run by `loongsage sft` or before RL (trainer.sft_steps)."""

    steps: int = 0  # optimizer steps of the warm start; 0 = none
    lr: float = 1e-3  # its peak learning rate (a fresh AdamW; train.lr's is reset after it)
    warmup_steps: int = 0  # the learning rate rises linearly to lr over these first steps
    lr_decay: str = "constant"  # then: constant | linear | cosine (to zero at the last step)
    batch_size: int = 16  # examples per step, split over train.dp_size ranks
    examples: int = 512  # generated from the data sources' ground truths


@dataclass
class TrainerConfig:
    """The training loop: steps, seed, resume."""

    steps: int = 10  # RL steps: one rollout batch and train.mini_batches_per_step optimizer steps each
    seed: int = 0  # seeds the data order, generated datasets, SFT examples, sampling and torch
    resume: bool = False  # continue the run in trainer.run_dir from its newest intact checkpoint
    auto_resume: int = 3  # restarts from the last checkpoint when an actor dies (0 = stop with the resume command)
    run_dir: Optional[str] = None  # resume into / write to this directory
    overwrite: bool = False  # a fresh run in a run_dir holding another run's files deletes them first
    eval_interval: int = 0  # steps between evaluations (0 = never); also before step 0
    eval_prompts: int = 64  # fixed prompts per evaluation, split over the data sources
    eval_temperature: float = 0.0  # 0 = greedy, so the eval curve is free of sampling noise
    router_replay: str = "off"  # MoE: off | rollout (R3, the engines' routes) | old_policy (R2)
    sft: SFTConfig = field(default_factory=SFTConfig)


SECTIONS: Dict[str, type] = {
    "model": ModelConfig,
    "train": TrainConfig,
    "rollout": RolloutConfig,
    "algorithm": AlgorithmConfig,
    "async": AsyncConfig,
    "placement": PlacementConfig,
    "agentflow": AgentFlowConfig,
    "logging": LoggingConfig,
    "checkpoint": CheckpointConfig,
    "trainer": TrainerConfig,
    "transfer": TransferConfig,  # weight sync: bucket size, slots, checksum, delta
    "reward": RewardConfig,
    "budgets": BudgetConfig,
}

# the root's keys besides SECTIONS (loongsage.config.store.root_schema), as `config show --doc` says them
ROOT_KEYS: Dict[str, str] = {
    "data_sources": "the prompt sources every batch is drawn from (at least one)",
    "plugins": "modules imported and registered as plugins (pluggy hooks) before the config is validated",
}
