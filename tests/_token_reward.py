"""A deterministic reward with signal for untrained tiny models (tests/test_multihost.py)."""


def digit_share(completion: str, prompt: str, row: dict) -> float:
    """The share of the completion's characters that are digits (0 for an empty one)."""
    del prompt, row
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)
