"""Chunked LM head + log-softmax (``engines.logprobs``) on the tiny Qwen2.

The chunked computation must give the same log-probabilities, entropies, ``LogitTerm``
values and gradients as the whole-batch one, whatever the chunk size, and never hold the
fp32 logits of more positions than one chunk: the test counts the largest
``[tokens, vocab]`` activation autograd saves for the backward (the last chunk's logits may
stay; the earlier ones are recomputed).
"""

from __future__ import annotations

import pytest
import torch

from loongsage.engines.embedded_train import load_causal_lm
from loongsage.engines.batch import LogitTerm
from loongsage.engines.logprobs import token_logprobs, token_scores


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_causal_lm(tiny_model_dir, "float32")


def ragged(n=4, length=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (n, length), generator=g)
    attention = torch.zeros(n, length, dtype=torch.long)
    for row in range(n):
        attention[row, : length - 5 * row] = 1
    return ids, attention


def whole_batch(model, ids, attention):
    """The unchunked reference: logits of every position at once."""
    hidden = model.base_model(input_ids=ids, attention_mask=attention,
                              position_ids=(attention.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
    logp = torch.log_softmax(model.get_output_embeddings()(hidden[:, :-1]).float(), -1)
    picked = logp.gather(-1, ids[:, 1:, None])[..., 0]
    entropy = -(logp.exp() * logp).sum(-1)
    keep = attention[:, 1:].float()
    pad = torch.zeros(ids.shape[0], 1)
    return torch.cat([pad, picked * keep], 1), torch.cat([pad, entropy * keep], 1)


def grads_of(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_values_and_gradients_match_the_whole_batch(model, chunk):
    ids, attention = ragged()
    weights = torch.linspace(-1, 1, ids.numel()).view(ids.shape)  # a per-token loss closure
    lp_ref, ent_ref = whole_batch(model, ids, attention)
    ref = grads_of(model, (lp_ref * weights).sum() + ent_ref.sum())
    lp, ent = token_logprobs(model, ids, attention, with_entropy=True, chunk_tokens=chunk)
    torch.testing.assert_close(lp, lp_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_ref, atol=1e-5, rtol=0)
    got = grads_of(model, (lp * weights).sum() + ent.sum())
    assert got.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=1e-4)


def test_padding_positions_are_zero(model):
    ids, attention = ragged()
    lp, ent = token_logprobs(model, ids, attention, with_entropy=True, chunk_tokens=5)
    padded = attention == 0
    assert padded.any() and (lp[padded] == 0).all() and (ent[padded] == 0).all()
    assert (lp[attention.bool()][1:] < 0).any()


def test_backward_keeps_no_logits_beyond_one_chunk(model):
    ids, attention = ragged(n=4, length=40)
    vocab = model.config.vocab_size
    weight = model.get_output_embeddings().weight.untyped_storage().data_ptr()
    kept = []  # positions of every [..., vocab] activation autograd saves for the backward

    def pack(tensor):
        if tensor.dim() and tensor.shape[-1] == vocab and tensor.untyped_storage().data_ptr() != weight:
            kept.append(tensor.numel() // vocab)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = token_logprobs(model, ids, attention, chunk_tokens=16)
    assert max(kept, default=0) <= 16, f"logits of {max(kept)} positions kept for the backward"
    lp.sum().backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


def _term(logits, per_token, per_row):
    """A loss term of the full logits: per-token and per-row inputs weight two statistics."""
    logp = torch.log_softmax(logits, -1)
    return torch.stack([per_token * logp[:, :5].sum(-1), per_row * logits.max(-1).values], -1)


@pytest.mark.parametrize("chunk", [3, 10_000])
def test_a_logit_term_gets_each_chunk_of_logits_with_its_inputs(model, chunk):
    """A ``LogitTerm`` sees the logits predicting each real token with that token's inputs:
    its values and their gradients equal the whole-batch computation, whatever the chunk."""
    ids, attention = ragged()
    extras = {"per_token": torch.linspace(-2, 2, ids.numel()).view(ids.shape), "per_row": torch.arange(4.0) + 1}
    hidden = model.base_model(input_ids=ids, attention_mask=attention,
                              position_ids=(attention.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
    logits = model.get_output_embeddings()(hidden[:, :-1]).float()
    per_row = extras["per_row"][:, None].expand(-1, ids.shape[1] - 1)
    want = _term(logits.reshape(-1, logits.shape[-1]), extras["per_token"][:, 1:].reshape(-1),
                 per_row.reshape(-1)).view(*logits.shape[:2], 2) * attention[:, 1:, None]
    want = torch.cat([torch.zeros(ids.shape[0], 1, 2), want], 1)
    ref = grads_of(model, want.sum())
    term = LogitTerm(_term, ("per_token", "per_row"), width=2)
    scores = token_scores(model, ids, attention, chunk_tokens=chunk, term=term, extras=extras)
    torch.testing.assert_close(scores.values, want, atol=1e-5, rtol=1e-5)
    got = grads_of(model, scores.values.sum())
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-4, rtol=1e-4)
