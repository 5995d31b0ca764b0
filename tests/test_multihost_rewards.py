"""Rewards across the processes of a run (issue 37 item 5): each process scores only the rows
its devices sampled, so a reward that would differ between hosts cannot make them disagree,
and a reward that fails on one host stops every process. Real 2-process runs (2 processes x
2 CPU devices, a loopback coordinator), bounded by `_pair`'s timeout."""

from __future__ import annotations

import json

import pytest
from test_multihost import MIN, REWARD_FN, _error_lines, _pair

# 4 prompts x 2 samples = 8 rows on fsdp=4: rows 0-3 on process 0's devices, 4-7 on process 1's
FOUR = [*MIN, "mesh.data=1", "mesh.fsdp=4", "rollout.prompts_per_step=4"]


@pytest.mark.slow  # ~21 s in the full suite on 2 busy cores
def test_a_reward_that_fails_on_one_process_stops_both(tmp_path):
    # A reward function that raises on process 1 only must not leave process 0 waiting for
    # process 1's rewards: both exit 2 with process 1's line.
    d = tmp_path / "run"
    fn = REWARD_FN.replace(":digit_share", ":fails_on_process_1")
    out, _ = _pair([d, d], *FOUR, f"reward.functions.f={fn}", timeout=240)
    lines = []
    for i, (rc, _, err) in enumerate(out):
        errs = _error_lines(err)
        assert rc == 2 and "Traceback" not in err and len(errs) == 1, (i, err[-3000:])
        lines.append(errs[0])
    assert lines[0] == lines[1], lines
    assert "process 1: " in lines[0] and "this host cannot score" in lines[0], lines[0]


@pytest.mark.slow  # ~56 s in the full suite on 2 busy cores
def test_a_process_killed_mid_run_stops_the_survivor_with_one_line(tmp_path, monkeypatch):
    # Process 1 is SIGKILLed while scoring step 2 (after checkpoint 1): process 0 waits for
    # its rows in the all-gather, and must end at once with one line, not hang or abort with
    # a long log; the rerun resumes from checkpoint 1 on both processes.
    # A second reward returns the id of the process that scores it: each row is scored by the
    # one process that sampled it, so half the rows score 0 and half 1, and every process
    # trains on the same combined rewards, whose mean is exactly 0.5 at every step.
    host = tmp_path / "host_reward.py"
    host.write_text("import os\n\n\ndef by_process(completion, prompt, row):\n"
                    "    return float(os.environ['AIS_JAX_PROCESS_ID'])\n")
    monkeypatch.setenv("AIS_JAX_ROWS", "4")  # process 1's rows of one step (FOUR: 8 rows)
    d = tmp_path / "run"
    fn = REWARD_FN.replace(":digit_share", ":dies_on_process_1")
    rewards = [f"reward.functions.f={fn}", f"reward.functions.host={host}:by_process"]
    out, _ = _pair([d, d], *FOUR, *rewards, timeout=240)
    assert out[1][0] == -9, out[1][2][-2000:]  # SIGKILL
    rc, _, err = out[0]
    errs = _error_lines(err)
    assert rc == 1 and "Traceback" not in err and len(errs) == 1, err[-3000:]
    assert "another process of this 2-process run died" in errs[0], errs[0]
    assert (d / "checkpoints" / "1").is_dir()
    monkeypatch.setenv("AIS_JAX_ROWS", "1000000")  # no death this time
    out, _ = _pair([d, d], *FOUR, *rewards, timeout=240)
    # every process's stderr on failure: the one that died first is the one to read
    assert [rc for rc, _, _ in out] == [0, 0], [err[-3000:] for _, _, err in out]
    assert "resumed from step 1" in out[0][1], out[0][1]
    with open(d / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f if line.strip()]
    assert [(r["step"], r["reward/host"]) for r in records] == [(1, 0.5), (2, 0.5)], records
