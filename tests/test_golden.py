"""Golden-run regression test: fixed-seed runs of the embedded default must reproduce the
committed numbers (scripts/golden_run.py).

A refactor must not change the numbers.  A change that alters them on purpose regenerates
this machine's files (``python scripts/golden_run.py``, which deletes the other machine
types' files) in the same commit and says why.

* On any CPU, the cross-CPU run must agree with tests/golden/cross_cpu.json (CPUs without
  fused multiply-add: cross_cpu_sse4_2.json) within ``golden_run.CROSS_CPU_RTOL`` /
  ``CROSS_CPU_ATOL`` (set from the spread measured across XLA's ISAs, with a margin: another
  CPU's rounding passes, a moved number fails).
* Exactly, per CPU kind: the golden run must reproduce one of
  tests/golden/golden_run_<cpu>.json.  One file per CPU model, because sampled tokens turn
  another CPU's last-bit differences into another trajectory; rtol 1e-5 (the runs are
  deterministic on one machine; the slack only covers float reordering that leaves sampled
  tokens unchanged).  It fails when this machine type has a file and the run matches none;
  a machine type without a file passes on the cross-CPU check and warns once how to add it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("golden_run",
                                               os.path.join(ROOT, "scripts", "golden_run.py"))
golden_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden_run)

RTOL, ATOL = 1e-5, 1e-7


def _compare(want, got, where, rtol, atol):
    if isinstance(want, dict):
        assert set(got) == set(want), f"{where}: keys {sorted(set(got) ^ set(want))} differ"
        for k in want:
            _compare(want[k], got[k], f"{where}.{k}", rtol, atol)
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            _compare(w, g, f"{where}[{i}]", rtol, atol)
    elif isinstance(want, float | int) and not isinstance(want, bool):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=where)
    else:
        assert got == want, where


def _mismatch(want: dict, got: dict, rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """The first difference of ``got`` from the golden file ``want``; None when it matches."""
    try:
        _compare(want, got, "golden", rtol, atol)
    except AssertionError as e:
        return str(e)
    return None


def _load(path: str) -> tuple[dict, dict]:
    """A golden file's ``(environment, numbers)``; every file must carry signal."""
    with open(path) as f:
        want = json.load(f)
    assert any(r["grad_norm"] > 0 for r in want["metrics"]), path
    return want.pop("environment"), want


def _cross_cpu_miss(got: dict, path: str | None = None) -> str | None:
    """How the cross-CPU run ``got`` differs from its reference (``path``; None: this CPU's,
    tests/golden/cross_cpu.json or, without FMA, cross_cpu_sse4_2.json) past the cross-CPU
    tolerance; None when it agrees."""
    _, want = _load(path or golden_run.cross_cpu_path())
    assert got["overrides"] == want["overrides"], "cross-CPU overrides changed: regenerate"
    return _mismatch(want, got, golden_run.CROSS_CPU_RTOL, golden_run.CROSS_CPU_ATOL)


def _exact_verdict(got: dict, files: list[str], here: dict) -> str | None:
    """None when the golden run ``got`` matches one of ``files``; a warning when it matches
    none and this machine type (``here``) has no file; AssertionError when it has one."""
    misses = {}
    for path in files:
        made_on, want = _load(path)
        name = os.path.basename(path)
        assert got["overrides"] == want["overrides"], f"{name}: golden overrides changed: " \
            "regenerate on purpose"
        miss = _mismatch(want, got)
        if miss is None:
            return None
        misses[name] = (made_on, miss)
    ours = os.path.basename(golden_run.golden_path(here))
    if ours not in misses:
        return (f"no exact golden file for this machine type ({ours}): the numbers were "
                "checked on the cross-CPU tolerance only; to guard them exactly here, add "
                "its file from a commit whose numbers are right: python scripts/golden_run.py "
                "--add")
    lines = [f"the run matches none of the {len(misses)} golden files; this machine is {here}"]
    for name, (made_on, miss) in misses.items():
        lines.append(f"--- {name} (made on {made_on}):\n{miss}")
    raise AssertionError("\n".join(lines))


@pytest.mark.xla_optimized  # the run compiles as a user's (and scripts/golden_run.py's) does
@pytest.mark.slow  # two CLI runs, ~50 s and ~30 s: warm starts of 60 and 30 steps, 4 and 2 RL steps
def test_golden_run_matches(tmp_path):
    miss = _cross_cpu_miss(golden_run.run_golden(str(tmp_path / "cross"),
                                                 golden_run.CROSS_CPU_OVERRIDES))
    assert miss is None, f"the cross-CPU run moved past its tolerance (rtol " \
        f"{golden_run.CROSS_CPU_RTOL}, atol {golden_run.CROSS_CPU_ATOL}):\n{miss}"
    files = golden_run.golden_files()
    assert files, "no tests/golden/golden_run_*.json: run python scripts/golden_run.py"
    note = _exact_verdict(golden_run.run_golden(str(tmp_path / "run")), files,
                          golden_run.environment())
    if note:
        warnings.warn(note, stacklevel=1)


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


@pytest.mark.parametrize("fma", [True, False])
def test_cross_cpu_tolerance_takes_rounding_and_fails_a_moved_metric(fma):
    """The cross-CPU reference within its tolerance passes; one metric moved past it fails,
    named (the check the golden run falls back on where a CPU kind has no exact file)."""
    import copy

    path = golden_run.cross_cpu_path(fma)
    _, want = _load(path)
    rtol, atol = golden_run.CROSS_CPU_RTOL, golden_run.CROSS_CPU_ATOL
    assert len(want["metrics"]) == 2 and want["overrides"] == golden_run.CROSS_CPU_OVERRIDES
    rounded = copy.deepcopy(want)
    for r in rounded["metrics"]:  # every float moved by half the tolerance
        for k, v in r.items():
            if isinstance(v, float):
                r[k] = v + 0.5 * (atol + rtol * abs(v))
    assert _cross_cpu_miss(rounded, path) is None
    for k in ("grad_norm", "loss", "kl", "alpha"):
        moved = copy.deepcopy(want)
        v = want["metrics"][1][k]
        moved["metrics"][1][k] = v + 2 * (atol + rtol * abs(v))
        assert f"golden.metrics[1].{k}" in (_cross_cpu_miss(moved, path) or ""), k
    moved = copy.deepcopy(want)
    moved["eval_after"]["pass@2"] += 1 / 16  # one more of 16 held-out problems
    assert _cross_cpu_miss(moved, path) is not None


def test_a_cpu_kind_without_its_file_passes_with_a_note_and_one_with_it_fails():
    """The exact check: a match passes silently; no match fails where this machine type has
    a file, and only says how to add one where it has none (here: another CPU kind)."""
    import copy

    files = golden_run.golden_files()
    env, want = _load(files[0])
    here = dict(env)
    assert _exact_verdict(copy.deepcopy(want), files, here) is None
    moved = copy.deepcopy(want)
    moved["metrics"][0]["loss"] += 0.01
    with pytest.raises(AssertionError, match="matches none of"):
        _exact_verdict(moved, files, here)
    other = {**env, "cpu": "Some Future CPU", "cpu_id": "family 99 model 1 avx2"}
    note = _exact_verdict(moved, files, other)
    assert "golden_run_some-future-cpu-family-99-model-1-avx2.json" in note
    assert "python scripts/golden_run.py --add" in note


@pytest.mark.parametrize("flags,cap", [("", None), ("--xla_cpu_max_isa=SSE4_2", "sse4_2"),
                                       ("--a=1 --xla_cpu_max_isa=AVX2", "avx2"),
                                       ("--xla_cpu_max_isa=AVX512_BF16", "avx512")])
def test_an_isa_cap_is_another_machine_type(monkeypatch, flags, cap):
    """Under XLA_FLAGS=--xla_cpu_max_isa=X XLA:CPU emits X's code: the numbers of another
    machine type, so its golden file is another one."""
    monkeypatch.setenv("XLA_FLAGS", flags)
    assert golden_run._isa_cap() == cap
    cpu_id = golden_run._cpu_id()
    if cpu_id is not None and cap is not None and cap != "avx512":
        assert cpu_id.endswith(f" {cap}")
