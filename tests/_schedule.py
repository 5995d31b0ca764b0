"""The order in which the two xdist workers take the test files: the longest first.

``--dist loadfile`` hands each worker one whole file at a time, in collection order, and the
next one as soon as its current file has two tests or fewer left (pytest-xdist 3.8's
``LoadScopeScheduling``).  Its default order sorts the files by their *number* of tests, which
put files of a few long tests (the 2-process runs of tests/test_multihost.py, the notebooks) in
the last third: one worker ran them alone while the other had finished.  pyproject's addopts
turn that order off (``--no-loadscope-reorder``) and `longest_first` (tests/conftest.py's
``pytest_collection_modifyitems``) puts the files below first, longest first, as a greedy
longest-processing-time schedule; every other file follows in its collection order.  The order
of the tests inside a file does not change.

``SECONDS`` are each file's test time in a full-suite run (pytest ``--durations``, 2 workers,
2 shared cores); only their order matters, so a rough figure is fine.  A file that
grows long belongs here; a stale figure makes the suite slower, never wrong.
"""

from __future__ import annotations

# Each file's tests over ~9 s in a full-suite run of 2026-12-06, just before a62318d (27.5 min
# under load: pytest's 80 longest durations, summed per file), or the older table's figure
# (177524a, 50 min under a load of 9-14; x 0.54) where that was larger (files of many shorter
# tests); tests/test_decode.py estimated from tests/conftest.py's note (51-65 s alone, x 0.54);
# tests/test_fp4.py less the ~20% its shared programs saved (tests/conftest.py, `_xla_optimized`).
# tests/test_golden.py and tests/test_pretrained.py less what 48949bc saved (measured alone, in
# CPU seconds: one warm-start compile at XLA's defaults per golden run, ~6 s each; SmolLM2's
# decode at XLA's defaults, 8.6 s less for the file): their order is unchanged.
SECONDS: dict[str, float] = {
    "tests/test_cpu_isa.py": 220,
    "tests/test_golden.py": 194,
    "tests/test_trainer.py": 185,
    "tests/test_multihost.py": 168,
    "tests/test_gcs_run.py": 117,
    "tests/test_notebooks.py": 103,
    "tests/test_lora_train.py": 103,
    "tests/test_train.py": 100,
    "tests/test_pretrained.py": 88,
    "tests/test_fp4.py": 80,
    "tests/test_llada_trajectory.py": 80,
    "tests/test_multihost_rewards.py": 76,
    "tests/test_reliability_results.py": 75,
    "tests/test_lora_llada.py": 57,
    "tests/test_reliability_run.py": 55,
    "tests/test_llada_train.py": 54,
    "tests/test_llada_scale.py": 49,
    "tests/test_sampler.py": 44,
    "tests/test_multihost_start.py": 39,
    "tests/test_split_rollout.py": 31,
    "tests/test_decode.py": 30,
    "tests/test_llada_trajectory_selection.py": 27,
    "tests/test_timing.py": 26,
    "tests/test_llada_surrogate.py": 23,
    "tests/test_attention_pallas.py": 21,
    "tests/test_reliability_bounds.py": 21,
    "tests/test_gpu_benchmarks.py": 20,
    "tests/test_reasoning_gym.py": 16,
    "tests/test_plan.py": 15,
    "tests/test_proximal.py": 12,
    "tests/test_runtime.py": 11,
}


def longest_first(items: list) -> list:
    """``items`` (pytest items) reordered file by file: the files of `SECONDS`, longest first,
    then the others in their first test's collection order; each file's tests keep theirs."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::", 1)[0], i)

    def key(item) -> tuple[float, int]:
        path = item.nodeid.split("::", 1)[0]
        return (-SECONDS.get(path, 0.0), first[path])

    return sorted(items, key=key)
