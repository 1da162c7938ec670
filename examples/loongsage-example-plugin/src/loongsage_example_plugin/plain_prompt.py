"""An agent of one turn without a chat template, to show the agent contract at its smallest."""

from loongsage.plugin import Sample


class PlainPrompt:
    """Tokenise ``prefix + last user message + suffix``; sample ``n`` responses in one batched request."""

    def __init__(self, params, context):
        self.params = params
        self.tokenizer = context.tokenizer

    async def run_group(self, prompt, n, client, sampling_params):
        text = next(m["content"] for m in reversed(prompt.messages) if m["role"] == "user")
        prompt_ids = self.tokenizer.encode(self.params.prefix + text + self.params.suffix)
        outputs = await client.agenerate_batch([prompt_ids] * n, sampling_params)
        return [self._sample(prompt_ids, out) for out in outputs]

    def _sample(self, prompt_ids, out):
        ids = list(out.output_ids)
        if out.output_logprobs is None:
            raise ValueError(f"plain_prompt: request {out.rid} came back without logprobs")
        versions = out.output_weight_versions or [out.weight_version] * len(ids)
        return Sample(prompt_ids=list(prompt_ids), response_ids=ids, response_logprobs=list(out.output_logprobs),
                      weight_versions=[int(v) for v in versions], loss_mask=[1] * len(ids),
                      finish_reason=out.finish_reason or "stop",
                      text=self.tokenizer.decode(ids, skip_special_tokens=True))
