"""The table of pre-registered studies at the top of docs/results.md (experiments/prereg_index.py):
its rows against scipy and a hand-applied Holm correction, the stopping rule's row, and the
repository's own table from the logs."""

import os
import sys

import pytest
from scipy import stats as sps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def index():
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    try:
        import prereg_index
        yield prereg_index
    finally:
        sys.path.remove(os.path.join(ROOT, "experiments"))


def test_rows_match_scipy_and_holm_by_hand(index):
    h1, h2 = [0.03, 0.05, 0.01, 0.04, 0.02], [0.02, -0.03, 0.01, 0.00, -0.01]
    rows = index.study_rows("S", "#s", 10, 10, [("H1: a - c > 0", h1), ("H2: b - c > 0", h2)])
    p1 = sps.ttest_1samp(h1, 0.0, alternative="greater").pvalue  # 0.0041
    p2 = sps.ttest_1samp(h2, 0.0, alternative="greater").pvalue  # 0.5
    assert p1 < 0.01 and p2 > 0.4
    # Holm over two: the smaller p times 2, the larger times 1 (never below the first)
    holm1, holm2 = 2 * p1, max(2 * p1, p2)
    half = sps.t.ppf(0.975, 4) * sps.sem(h1)
    assert rows[0] == (f"| [S](#s) | H1: a - c > 0 | +0.030 [{0.03 - half:+.3f}, "
                       f"{0.03 + half:+.3f}] | {holm1:.3f} | supported at 0.05 |")
    assert rows[1].startswith("| [S](#s) | H2: b - c > 0 | -0.002 [")
    assert rows[1].endswith(f"| {holm2:.3f} | not supported at 0.05 |")


def test_an_unfinished_study_is_one_row_and_not_analysed(index):
    rows = index.study_rows("S", "#s", 3, 50, [("H1: a - b > 0", [])] * 4)
    assert rows == ["| [S](#s) | 4 pre-registered | - | - | 3 of 50 runs logged: "
                    "not analysed yet |"]


def test_the_repository_table_from_the_logs(index):
    table = index.index_table()
    assert table[0].startswith("| study | hypothesis")
    studies = {r.split("](")[0][3:] for r in table[2:]}
    assert studies == {s.title for s in (*index.STUDIES, *index.DESCRIPTIVE)}
    # the finished replication: its Holm p-values as its own section prints them
    rep = [r for r in table if r.startswith("| [Long responses")]
    assert [r.split(" | ")[3] for r in rep] == ["0.062", "0.086"]
    with open(os.path.join(ROOT, "docs", "results.md")) as f:
        page = f.read()
    assert "\n".join(table) in page
