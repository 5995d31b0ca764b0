"""Golden-run regression test: a short fixed-seed run of the embedded default must
reproduce the committed per-step metrics (tests/golden/golden_run.json).

A refactor must not change the numbers.  A change that alters them on purpose
regenerates the file (``python scripts/golden_run.py``) in the same commit and
says why.  Tolerance: rtol 1e-5 (the runs are deterministic on one machine;
the slack only covers float reordering that leaves sampled tokens unchanged).
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("golden_run",
                                               os.path.join(ROOT, "scripts", "golden_run.py"))
golden_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden_run)

RTOL, ATOL = 1e-5, 1e-7


def _compare(want, got, where):
    if isinstance(want, dict):
        assert set(got) == set(want), f"{where}: keys {sorted(set(got) ^ set(want))} differ"
        for k in want:
            _compare(want[k], got[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            _compare(w, g, f"{where}[{i}]")
    elif isinstance(want, float | int) and not isinstance(want, bool):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=where)
    else:
        assert got == want, where


@pytest.mark.slow  # one ~40 s CLI run: 60 warm-start steps + 4 GRPO steps + 3 evaluations
def test_golden_run_matches(tmp_path):
    with open(golden_run.GOLDEN) as f:
        want = json.load(f)
    made_on = want.pop("environment", None)
    got = golden_run.run_golden(str(tmp_path / "run"))
    assert got["overrides"] == want["overrides"], "golden overrides changed: regenerate on purpose"
    # The run must carry signal, or the comparison guards nothing.
    assert any(r["grad_norm"] > 0 for r in want["metrics"])
    here = golden_run.environment()
    try:
        _compare(want, got, "golden")
    except AssertionError as e:
        if made_on != here:  # say so: sampled tokens amplify last-bit differences
            raise AssertionError(f"{e}\nthe golden file was made on {made_on}; this is {here}: "
                                 "check the numbers of the last commit here before blaming a "
                                 "change") from None
        raise
