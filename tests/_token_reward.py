"""Deterministic rewards with signal for untrained tiny models (tests/test_multihost.py)."""

import os


def digit_share(completion: str, prompt: str, row: dict) -> float:
    """The share of the completion's characters that are digits (0 for an empty one)."""
    del prompt, row
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def counted_digit_share(completion: str, prompt: str, row: dict) -> float:
    """`digit_share`, and one line per call appended to ``$AIS_JAX_SCORED_DIR/<pid>``: the
    test counts how many rows each process scored."""
    with open(os.path.join(os.environ["AIS_JAX_SCORED_DIR"], str(os.getpid())), "a") as f:
        f.write("1\n")
    return digit_share(completion, prompt, row)


def fails_on_process_1(completion: str, prompt: str, row: dict) -> float:
    """Raises on the second process of a multi-process run (``AIS_JAX_PROCESS_ID=1``) only."""
    if os.environ.get("AIS_JAX_PROCESS_ID") == "1":
        raise ValueError("this host cannot score")
    return digit_share(completion, prompt, row)


def dies_on_process_1(completion: str, prompt: str, row: dict) -> float:
    """SIGKILLs the second process of a multi-process run at its first call of step 2 (a host
    that dies mid-run: no Python cleanup, no message)."""
    import signal

    CALLS[0] += 1
    if os.environ.get("AIS_JAX_PROCESS_ID") == "1" and CALLS[0] > int(os.environ["AIS_JAX_ROWS"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return digit_share(completion, prompt, row)


CALLS = [0]
