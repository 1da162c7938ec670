"""Core's built-in engines plugins, registered through the same hooks as third-party code."""

from loongsage.hookspecs import hookimpl


@hookimpl
def loongsage_register_engines(register):
    register(
        "embedded_train",
        "loongsage.engines.embedded_train:EmbeddedTrainEngine",
        doc="HF causal LM trainer on CPU or one GPU (micro-batching, AdamW, HF safetensors).",
    )
    register(
        "megatron",
        "loongsage.engines.megatron.engine:MegatronTrainEngine",
        doc="Megatron-Core GPTModel from a HF checkpoint: TP / PP / DP over the train ranks "
            "(gloo on CPU, NCCL on GPUs); needs loongsage-core[megatron].",
    )
    register(
        "embedded_rollout",
        "loongsage.engines.embedded_rollout.engine:EmbeddedRolloutEngine",
        doc="HF causal LM behind SGLang's HTTP API on loopback, with its own batched decode loop.",
    )
    register(
        "sglang",
        "loongsage.engines.sglang.engine:SGLangServerEngine",
        doc="An SGLang server per replica (python -m sglang.launch_server), weights over its distributed update.",
    )
