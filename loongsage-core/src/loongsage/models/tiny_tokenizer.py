"""A small byte-level BPE tokenizer trained locally, for the tiny test model.

The training text is generated (no download): arithmetic word problems with worked
answers in ``\\boxed{}``, bare equations, ChatML conversations and tool-call JSON, so the
merges cover what the test tasks and the AgentFlow router exchange. Digits are split one
per token (as Qwen2 does), which keeps arithmetic learnable for a 3 M-parameter model.
Every byte is in the alphabet, so any text round-trips.
"""

from __future__ import annotations

import json
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from loongsage.models.chatml import CHATML_TEMPLATE

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Ordinary (non-special) added tokens: they survive skip_special_tokens decoding, which the
# router's tool-call parser relies on.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB_SIZE = 1024

# Qwen2's pre-tokenizer split, with digits isolated one by one.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_NAMES = ["Tom", "Anna", "Li Wei", "Sara", "Omar", "Mia", "Ken", "Ravi", "Lucy", "Jon"]
_ITEMS = ["apples", "books", "coins", "pencils", "marbles", "cookies", "stickers", "cards"]
_SYSTEM = [
    "You are a helpful assistant.",
    "Please reason step by step, and put your final answer within \\boxed{}.",
]
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _word_problem(rng: random.Random) -> tuple[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice(list(_OPS))
    if op == "+":
        q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
    elif op == "-":
        a, b = max(a, b), min(a, b)
        q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
    else:
        a, b = a % 13, b % 13
        q = f"{name} buys {a} boxes with {b} {item} in each box. How many {item} in total?"
    r = _OPS[op](a, b)
    return q, f"{a} {op} {b} = {r}. The answer is \\boxed{{{r}}}."


def training_corpus(n: int = 3000, seed: int = 0) -> list[str]:
    """Generated lines the tokenizer is trained on (deterministic for a seed)."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(n):
        q, a = _word_problem(rng)
        x, y = rng.randint(0, 999), rng.randint(0, 999)
        lines.append(q)
        lines.append(a)
        s = x + y
        lines.append(f"What is {x} + {y}? {x} + {y} = {s}, so the answer is \\boxed{{{s}}}.")
        lines.append(
            f"<|im_start|>system\n{_SYSTEM[i % 2]}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
            f"<|im_start|>assistant\n{a}<|im_end|>\n<|endoftext|>"
        )
        call = {"name": "calculator", "arguments": {"expression": f"{x} + {y}"}}
        lines.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
        lines.append(f"<tool_response>\n{json.dumps({'result': x + y})}\n</tool_response>")
    return lines


def train_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE and wrap it as a HF fast tokenizer with a ChatML template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(seed=seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
