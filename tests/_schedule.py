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

# Measured at 177524a (50 min under a load of 9-14: the sums of the 60 longest tests only).
SECONDS: dict[str, float] = {
    "tests/test_golden.py": 347,
    "tests/test_trainer.py": 261,
    "tests/test_fp4.py": 254,
    "tests/test_multihost.py": 247,
    "tests/test_cpu_isa.py": 243,
    "tests/test_lora_train.py": 191,
    "tests/test_pretrained.py": 149,
    "tests/test_reliability_results.py": 110,
    "tests/test_multihost_rewards.py": 105,
    "tests/test_reliability_run.py": 101,
    "tests/test_llada_train.py": 100,
    "tests/test_train.py": 95,
    "tests/test_llada_scale.py": 91,
    "tests/test_notebooks.py": 85,
    "tests/test_llada_trajectory.py": 80,
    "tests/test_gcs_run.py": 78,
    "tests/test_multihost_start.py": 72,
    "tests/test_sampler.py": 59,
    "tests/test_split_rollout.py": 56,
    "tests/test_timing.py": 48,
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
