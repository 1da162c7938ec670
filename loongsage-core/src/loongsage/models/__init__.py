"""Models without a hub: the tiny test model and SmolLM2-135M-Instruct from its wheel.

``loongsage models tiny --out DIR`` writes the tiny Qwen2; ``loongsage models smollm2``
converts the SmolLM2 GGUF once and prints the cached HF folder. Both print the folder,
which is what ``model.path`` takes. Importing this package does not import torch.
"""
