"""experiments/prereg_tables.py's per-arm table (`arms_table`) and per-window table (`window_row`),
shared by every study's report, on hand-made arms with hand-computed cells."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
from prereg_tables import arms_table, run_mean, window_header, window_means, window_row


def _run(after: float, before: float, wall: float, rows: list[dict]) -> dict:
    return {"summary": {"eval_after": {"sampled_accuracy": after, "accuracy": after / 2},
                        "eval_before": {"sampled_accuracy": before}},
            "rows": rows, "meta": {"wall_s": wall}}


def test_run_mean_known_answers():
    run = _run(0.0, 0.0, 0.0, [{"d_bar": 0.1}, {"d_bar": 0.3, "alpha": 1.0}, {}])
    assert run_mean(run, "d_bar") == 0.2  # (0.1 + 0.3) / 2: rows without the key are skipped
    assert run_mean(run, "alpha") == 1.0
    assert run_mean(run, "ess_ratio") is None


def test_arms_table_known_answers():
    runs = {
        # a: sampled after 0.2 / 0.4 (mean 0.3, sd sqrt(0.02) = 0.141), d_bar means 0.1 / 0.3
        "a": [_run(0.2, 0.1, 10.0, [{"d_bar": 0.1}]), _run(0.4, 0.3, 20.0, [{"d_bar": 0.3}])],
        # b logs no d_bar in its second run: its cell is "-"
        "b": [_run(0.5, 0.5, 30.0, [{"d_bar": 0.2}]), _run(0.5, 0.5, 31.0, [{}])],
    }
    out = arms_table(runs, (("sampled_accuracy", "sampled after"), ("accuracy", "greedy")),
                     (("d_bar", "d_bar (mean)"),))
    assert out == [
        "| arm | sampled after | greedy | sampled before | d_bar (mean) | wall s (mean) |",
        "|---|---|---|---|---|---|",
        "| a | 0.300 ± 0.141 | 0.150 ± 0.071 | 0.200 ± 0.141 | 0.200 ± 0.141 | 15 |",
        "| b | 0.500 ± 0.000 | 0.250 ± 0.000 | 0.500 ± 0.000 | - | 30 |",
    ]


def test_window_table_known_answers():
    # 5 steps in windows of 2: the last window holds one step
    a = {"rows": [{"d_bar": x} for x in (0.1, 0.3, 0.5, 0.7, 1.0)]}
    b = {"rows": [{"d_bar": x} for x in (0.3, 0.5, 0.1, 0.1, 0.0)]}
    assert window_means(a, "d_bar", 2) == [0.2, 0.6, 1.0]
    assert window_means(b, "d_bar", 2) == [0.4, 0.1, 0.0]
    # the mean over the two runs of each window: 0.3, 0.35, 0.5
    assert (window_row("ais", "d_bar", [a, b], "d_bar", 2, 3)
            == "| ais | d_bar | 0.300 -> 0.350 -> 0.500 |")
    assert window_header(10, 60) == ["| arm | statistic | steps 1-10 -> ... -> 51-60 |",
                                     "|---|---|---|"]
