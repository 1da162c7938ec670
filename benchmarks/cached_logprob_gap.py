"""Where cached and cold-prefill log-probs part (fp32), and what closing the gap costs.

The embedded engine's prefix cache hands a later turn the keys/values an earlier forward
computed: the prompt's prefill, then one decode step per generated token. A cold prefill
computes the same positions again, all in one forward. In exact arithmetic the two agree; in
fp32 they differ by rounding, and on SmolLM2 (30 layers) by about 1e-5 in log-prob, the size
of the prefix-cache bound (``docs/benchmarks.md``). This script finds where, teacher-forced
on fixed random tokens (no sampling, no engine, no threads but one):

* **cached**: a ``--prompt``-token prefill, ``--reply`` one-token decode steps, a prefill of
  ``--turn`` new tokens continuing that cache, then ``--decode`` decode steps;
* **cold**: one prefill of the whole history (prompt + reply + turn), then the same decode steps.

Both score the same tokens; reported is the largest |log-prob difference| over the vocabulary
and at the fed tokens, per attention variant (``sdpa``: PyTorch's fp32 SDPA as the engine runs
it; ``sdpa_fp64``: the same kernel on inputs cast to fp64, the output cast back) and per batch
size (``--rows`` identical rows: MKL's fp32 matmul takes another path for a few rows, so one
row's result then depends on how many rows the forward holds; which row counts do is
printed). Then the time of one decode step's attention at ``--time-shape`` (rows, keys) in
fp32 and in fp64, beside that layer's linear layers, best of 5 x 30 calls (fp64 attention:
cast at every call, as a KV cache kept in fp32 needs; and on a KV cache kept in fp64).

    .venv/bin/python benchmarks/cached_logprob_gap.py [--model builtin:smollm2] [--rows 1,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from typing import Any

import torch
import torch.nn.functional as F


def sdpa_fp64(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """transformers' SDPA attention computed in fp64 (inputs cast up, the output cast back)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None and attention_mask.dtype.is_floating_point:
        attention_mask = attention_mask.double()
    out, weights = sdpa_attention_forward(module, query.double(), key.double(), value.double(),
                                          attention_mask, **kwargs)
    return out.to(query.dtype), weights


def register_fp64_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("sdpa_fp64", sdpa_fp64)
    AttentionMaskInterface.register("sdpa_fp64", sdpa_mask)  # the same masks as sdpa


def gap(path: str, attention: str, rows: int, args: argparse.Namespace) -> dict[str, float]:
    """Cached vs cold log-probs of the same tokens (module docstring)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation=attention).eval()
    history = args.prompt + args.reply + args.turn
    generator = torch.Generator().manual_seed(0)
    length = history + args.decode
    tokens = torch.randint(100, model.config.vocab_size, (1, length), generator=generator).repeat(rows, 1)

    def forward(cache: Any, start: int, end: int) -> torch.Tensor:
        out = model(tokens[:, start:end], cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float().log_softmax(-1)

    def decode(cache: Any) -> list[torch.Tensor]:
        return [forward(cache, t, t + 1) for t in range(history, history + args.decode - 1)]

    with torch.inference_mode():
        cached = DynamicCache(config=model.config)
        forward(cached, 0, args.prompt)
        for t in range(args.prompt, args.prompt + args.reply):
            forward(cached, t, t + 1)
        warm = [forward(cached, args.prompt + args.reply, history)] + decode(cached)
        fresh = DynamicCache(config=model.config)
        cold = [forward(fresh, 0, history)] + decode(fresh)
    warm, cold = torch.stack(warm)[:, 0], torch.stack(cold)[:, 0]
    fed = tokens[0, history:history + args.decode, None]
    return {"vocab": (warm - cold).abs().max().item(),
            "fed": (warm.gather(-1, fed) - cold.gather(-1, fed)).abs().max().item()}


def matmul_rows_that_differ(path: str, most: int = 64) -> list[int]:
    """The row counts ``m`` (1..``most``) for which an fp32 linear layer's product of ``m`` rows
    is not bitwise the first ``m`` rows of a 256-row product (the model's MLP shape)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    weight = torch.randn(cfg.intermediate_size, cfg.hidden_size) / cfg.hidden_size ** 0.5
    x = torch.randn(256, cfg.hidden_size)
    full = F.linear(x, weight)
    return [m for m in range(1, most + 1) if not torch.equal(F.linear(x[:m], weight), full[:m])]


def best_ms(fn, calls: int = 30, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1000


def attention_cost(path: str, rows: int, keys: int) -> dict[str, float]:
    """One decode step's attention in fp32 and in fp64, and one layer's linear layers (ms)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    dim = cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_key_value_heads
    q = torch.randn(rows, cfg.num_attention_heads, 1, dim)
    k, v = torch.randn(rows, kv, keys, dim), torch.randn(rows, kv, keys, dim)
    mask = torch.ones(rows, 1, 1, keys, dtype=torch.bool)
    shapes = [(cfg.hidden_size, cfg.hidden_size)] * 2 + [(kv * dim, cfg.hidden_size)] * 2 + \
        [(cfg.intermediate_size, cfg.hidden_size)] * 2 + [(cfg.hidden_size, cfg.intermediate_size)]
    weights = [torch.randn(out, inp) for out, inp in shapes]
    inputs = {n: torch.randn(rows, n) for n in (cfg.hidden_size, cfg.intermediate_size)}
    k64, v64 = k.double(), v.double()

    def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)

    return {
        "attention_fp32_ms": best_ms(lambda: attend(q, k, v)),
        "attention_fp64_ms": best_ms(lambda: attend(q.double(), k.double(), v.double()).float()),
        "attention_fp64_kept_ms": best_ms(lambda: attend(q.double(), k64, v64).float()),
        "linears_ms": best_ms(lambda: [F.linear(inputs[w.shape[1]], w) for w in weights]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2")
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--reply", type=int, default=40)
    parser.add_argument("--turn", type=int, default=10)
    parser.add_argument("--decode", type=int, default=20)
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--time-shape", default="16,300", help="rows,keys of the timed decode step")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    from loongsage.models.resolve import resolve_model_path

    path = str(resolve_model_path(args.model))
    register_fp64_attention()
    gaps = {f"{attention} rows={rows}": gap(path, attention, rows, args)
            for attention in ("sdpa", "sdpa_fp64") for rows in map(int, args.rows.split(","))}
    cost = attention_cost(path, *map(int, args.time_shape.split(",")))
    differ = matmul_rows_that_differ(path)
    if args.json:
        print(json.dumps({"gaps": gaps, "cost": cost, "matmul_rows_that_differ": differ}, indent=2))
        return
    print(f"{args.model}: cached vs cold, max |log-prob difference|")
    for name, g in gaps.items():
        print(f"  {name:20} over the vocabulary {g['vocab']:.2e}, at the fed tokens {g['fed']:.2e}")
    print(f"fp32 linear products of m rows that are not bitwise the first m rows of a 256-row "
          f"one, m in 1..64: {differ}")
    fp32, fp64 = cost["attention_fp32_ms"], cost["attention_fp64_ms"]
    kept = cost["attention_fp64_kept_ms"]
    linears = cost["linears_ms"]
    print(f"decode-step attention at {args.time_shape} (rows,keys), per layer: fp32 {fp32:.2f} ms, "
          f"fp64 {fp64:.2f} ms ({fp64 / fp32:.1f}x); the layer's linears {linears:.2f} ms; "
          f"a decode step's layer {(fp64 + linears) / (fp32 + linears):.2f}x with fp64 attention")
    print(f"  with the KV cache kept in fp64 (no cast, twice the memory): {kept:.2f} ms "
          f"({kept / fp32:.1f}x), the layer {(kept + linears) / (fp32 + linears):.2f}x")


if __name__ == "__main__":
    main()
