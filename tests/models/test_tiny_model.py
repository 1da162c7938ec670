"""The tiny test model: deterministic, a plain HF folder, a tokenizer fit for the tasks."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from loongsage.models.command import main as models_main
from loongsage.models.tiny import build_tiny_model


def _digest(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_build_is_deterministic_and_seed_changes_weights(tmp_path, tiny_model_dir):
    a = build_tiny_model(tmp_path / "a", seed=0)
    assert _digest(a) == _digest(tiny_model_dir)
    b = build_tiny_model(tmp_path / "b", seed=1)
    da, db = _digest(a), _digest(b)
    assert da["tokenizer.json"] == db["tokenizer.json"]
    assert da["model.safetensors"] != db["model.safetensors"]


def test_architecture_and_size(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (256, 768, 4)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    assert cfg.tie_word_embeddings
    assert cfg.vocab_size == len(tok)
    n = sum(p.numel() for p in model.parameters())
    assert 3.0e6 < n < 3.6e6
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert cfg.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert cfg.pad_token_id == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")


def test_tokenizer_round_trips_and_splits_digits(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "Ana has 1234 coins, ünïcode ✓ 😀. The answer is \\boxed{-56}."
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    pieces = tok.convert_ids_to_tokens(tok("x 1234")["input_ids"])
    assert [p for p in pieces if p.strip("Ġ").isdigit()] == ["1", "2", "3", "4"]
    # tool-call markers are single, non-special tokens: they survive skip_special_tokens
    ids = tok("<tool_call>\n{}\n</tool_call><|im_end|>")["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<tool_call>")
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"


def test_chat_template_renders_chatml_with_tools(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    msgs += [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calc", "arguments": {"e": "2+3"}}}]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "\\boxed{5}"},
    ]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert '{"type": "function", "function": {"name": "calc"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"e": "2+3"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n\\boxed{5}<|im_end|>\n"
    ) in text
    assert not text.endswith("<|im_start|>assistant\n")


def test_model_forward_is_finite_and_near_uniform(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = torch.tensor([tok("What is 2 + 3?")["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    # an untrained model: cross-entropy within a nat of the uniform distribution's
    assert abs(loss.item() - torch.log(torch.tensor(float(len(tok)))).item()) < 1.0


def test_cli_writes_folder(tmp_path, capsys):
    assert models_main(["tiny", "--out", str(tmp_path / "m")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").is_file()
