"""Golden-run regression test: a short fixed-seed run of the embedded default must
reproduce the committed per-step metrics of one of tests/golden/golden_run_<cpu>.json.

A refactor must not change the numbers.  A change that alters them on purpose
regenerates this machine's file (``python scripts/golden_run.py``, which deletes the
other machine types' files) in the same commit and says why.  One file per CPU model,
because sampled tokens turn another CPU's last-bit differences into another trajectory
(scripts/golden_run.py); a change that moves the numbers matches none of them.
Tolerance: rtol 1e-5 (the runs are deterministic on one machine; the slack only covers
float reordering that leaves sampled tokens unchanged).
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


def _mismatch(want: dict, got: dict) -> str | None:
    """The first difference of ``got`` from the golden file ``want``; None when it matches."""
    try:
        _compare(want, got, "golden")
    except AssertionError as e:
        return str(e)
    return None


@pytest.mark.xla_optimized  # the run compiles as a user's (and scripts/golden_run.py's) does
@pytest.mark.slow  # one ~50 s CLI run: 60 warm-start steps + 4 GRPO steps + 3 evaluations
def test_golden_run_matches(tmp_path):
    files = golden_run.golden_files()
    assert files, "no tests/golden/golden_run_*.json: run python scripts/golden_run.py"
    goldens = {}
    for path in files:
        with open(path) as f:
            want = json.load(f)
        # Every file must carry signal, or the comparison guards nothing.
        assert any(r["grad_norm"] > 0 for r in want["metrics"]), path
        goldens[os.path.basename(path)] = (want.pop("environment"), want)
    got = golden_run.run_golden(str(tmp_path / "run"))
    misses = {}
    for name, (made_on, want) in goldens.items():
        assert got["overrides"] == want["overrides"], f"{name}: golden overrides changed: " \
            "regenerate on purpose"
        miss = _mismatch(want, got)
        if miss is None:
            return
        misses[name] = (made_on, miss)
    here = golden_run.environment()
    ours = os.path.basename(golden_run.golden_path(here))
    lines = [f"the run matches none of the {len(misses)} golden files; this machine is {here}"]
    for name, (made_on, miss) in misses.items():
        lines.append(f"--- {name} (made on {made_on}):\n{miss}")
    if ours not in misses:
        lines.append(f"no golden file for this machine type ({ours}): if the numbers did not "
                     "change on purpose, add it from the last commit with python "
                     "scripts/golden_run.py --add")
    raise AssertionError("\n".join(lines))


def test_each_golden_file_is_named_for_its_machine_and_a_moved_number_fails():
    """One file per CPU model, named by `golden_run.golden_path`; the comparison takes a file
    as it is and names the first metric that moved past rtol 1e-5."""
    import copy

    files = golden_run.golden_files()
    cpus = []
    for path in files:
        with open(path) as f:
            want = json.load(f)
        env = want.pop("environment")
        assert golden_run.golden_path(env) == path
        cpus.append((env["cpu"], env.get("cpu_id")))
        assert _mismatch(want, copy.deepcopy(want)) is None
        moved = copy.deepcopy(want)
        i = max(range(len(want["metrics"])), key=lambda k: want["metrics"][k]["grad_norm"])
        moved["metrics"][i]["grad_norm"] *= 1 + 3e-5  # a norm > 0.01: 3e-5 is past atol too
        assert f"golden.metrics[{i}].grad_norm" in (_mismatch(want, moved) or "")
        moved = copy.deepcopy(want)
        moved["metrics"][0]["kl"] = want["metrics"][0]["kl"] + 1e-4
        assert _mismatch(want, moved) is not None
    assert len(set(cpus)) == len(cpus)
