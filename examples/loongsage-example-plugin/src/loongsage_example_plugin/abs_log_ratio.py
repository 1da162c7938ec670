"""A token-level KL policy: |log π_θ − log π_ref|, an L1 distance in log space (zero exactly
where the policies agree), to show the kl_policy contract."""


def abs_log_ratio(logprobs, ref_logprobs):
    return (logprobs - ref_logprobs).abs()
