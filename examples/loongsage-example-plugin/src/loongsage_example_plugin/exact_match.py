"""A reward comparing the response's last token with the ground truth, exactly."""


def exact_match(text, ground_truth, params, **context):
    """Score 1.0 for an exact final answer, else 0.0."""
    words = text.split()
    answer = words[-1].strip(params.strip_chars) if words else ""
    return {"score": float(answer == str(ground_truth)), "answered": bool(words)}
