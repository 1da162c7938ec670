"""Per-token log-probabilities (and entropy) of given token ids under a HF causal LM.

Alignment follows ``loongsage.engines.batch``: ``logprobs[:, t] = log p(ids[t] | ids[:t])``
and position 0 is 0. Instead of the model's own forward (which materialises logits in the
model dtype), we run the decoder body and apply the output embedding ourselves, in fp32
when ``fp32_lm_head`` (REFERENCE.md §1.9: a bf16 LM head is a main source of train /
inference mismatch). This covers HF causal LMs whose logits are ``lm_head(hidden)``
(Llama, Qwen2/3, Mistral, SmolLM); models with logit soft-capping or scaling are not
special-cased. Position ids come from the attention mask, so left or right padding both
give the positions an unpadded sequence would have.
"""

from __future__ import annotations

import torch
from torch import nn


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens of each row (padding gets 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def lm_head_logits(model: nn.Module, hidden: torch.Tensor, fp32_lm_head: bool) -> torch.Tensor:
    """Logits from final hidden states, as fp32 (matmul in fp32 when ``fp32_lm_head``)."""
    head = model.get_output_embeddings()
    if fp32_lm_head:
        bias = None if head.bias is None else head.bias.float()
        return nn.functional.linear(hidden.float(), head.weight.float(), bias)
    return head(hidden).float()


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    fp32_lm_head: bool = True,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs [N, L], entropy [N, L] or None)`` for the tokens of ``input_ids``.

    Differentiable when grad is enabled. Entropy at t is that of the distribution that
    predicted token t (so it lines up with ``logprobs``); position 0 is 0 for both.
    """
    out = model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    hidden = out.last_hidden_state[:, :-1]
    logits = lm_head_logits(model, hidden, fp32_lm_head)  # [N, L-1, V] fp32
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    pad = logits.new_zeros(input_ids.shape[0], 1)
    logprobs = torch.cat([pad, picked - lse], dim=1)
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        ent = lse - (probs * logits).sum(-1)
        entropy = torch.cat([pad, ent], dim=1)
    return logprobs, entropy
