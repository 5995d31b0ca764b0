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


_STOP_CALLS: dict[str, int] = {}  # calls per stop flag (each test has its own flag path)


def stops_after_step_2(completion: str, prompt: str, row: dict) -> float:
    """`digit_share`; at this process's 64th call for the flag ``$AIS_JAX_STOP_FLAG`` (step 2's
    rows of a 32-row-per-step run are scored), if the flag file does not exist yet, creates it
    and SIGTERMs the process: the run finishes step 2, checkpoints it, and exits 143.  A run
    whose flag already exists is never stopped (the resume, or a reference run).

    The count is kept per flag path, not per module: the reward loader may keep this module
    between two runs in one process, and each test uses its own flag."""
    import signal

    flag = os.environ["AIS_JAX_STOP_FLAG"]
    _STOP_CALLS[flag] = _STOP_CALLS.get(flag, 0) + 1
    if _STOP_CALLS[flag] == 64 and not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGTERM)
    return digit_share(completion, prompt, row)

