"""Agent loops: classes built as ``cls(params, tokenizer)`` that turn a prompt group into samples."""
