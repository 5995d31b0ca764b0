"""Tests of ais_jax.run.plots: PNGs from a synthetic metrics.jsonl, run overlays, bad-input
errors."""

import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from ais_jax.run import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write_metrics(run_dir, steps=12, *, accuracy=True, shift=0.0):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for s in range(steps):
            row = {
                "step": s,
                "reward_mean": 0.1 + s / steps + shift,
                "loss": 1.0 - s / steps,
                "alpha": 0.5,
                "alpha_ess": 0.9,
                "alpha_mis": 0.6,
                "alpha_var": 0.1,
                "d_bar": 0.01 + shift,
                "ess_ratio": 0.8,
                "response_len": 4 + s % 3,
                "step_time_s": 0.25,
            }
            if accuracy:
                row["accuracy"] = s / steps
            if s % 4 == 0:
                row["eval_accuracy"] = s / (2 * steps)
            f.write(json.dumps(row) + "\n")
            if s == 3:
                f.write("\n")  # blank lines are allowed


def _assert_png(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_SIGNATURE, path
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100
    assert data[-8:-4] == b"IEND"


def test_plot_run_writes_valid_pngs(tmp_path):
    run = tmp_path / "run"
    _write_metrics(run)
    written = plots.plot_run(run)
    names = sorted(os.path.basename(p) for p in written)
    assert names == sorted(f"{n}.png" for n in plots.PANELS)
    for path in written:
        assert os.path.dirname(path) == str(run / "plots")
        _assert_png(path)
    out = plots.plot_run(run, tmp_path / "elsewhere", smooth=3)
    assert len(out) == len(plots.PANELS)
    for path in out:
        _assert_png(path)


def test_read_metrics_merges_and_orders_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 2, "loss": 5.0, "note": "text is ignored"},
        {"step": 0, "loss": 1.0, "reward_mean": None},
        {"step": 1, "loss": 2.0},
        {"step": 2, "loss": 3.0, "eval_accuracy": 0.5},  # a resumed run re-logs step 2
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    series = plots.read_metrics(path)
    np.testing.assert_array_equal(series["loss"][0], [0, 1, 2])
    np.testing.assert_array_equal(series["loss"][1], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(series["eval_accuracy"][0], [2])
    assert math.isnan(series["reward_mean"][1][0])
    assert "note" not in series


def test_missing_metrics_skip_their_panel(tmp_path):
    run = tmp_path / "run"
    os.makedirs(run)
    (run / "metrics.jsonl").write_text(
        '{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5, "d_bar": 0.02}\n'
    )
    names = sorted(os.path.basename(p) for p in plots.plot_run(run))
    assert names == ["d_bar.png", "loss.png"]


def test_smoothing_is_a_nan_aware_trailing_mean():
    vals = np.array([1.0, 3.0, np.nan, 5.0])
    np.testing.assert_allclose(plots.moving_average(vals, 2), [1.0, 2.0, 3.0, 5.0])
    np.testing.assert_array_equal(plots.moving_average(vals, 1), vals)


def test_plot_runs_overlays_arms(tmp_path):
    runs = {}
    for i, arm in enumerate(("bf16", "fp8", "tis", "ais")):
        runs[arm] = str(tmp_path / arm)
        _write_metrics(runs[arm], accuracy=arm != "fp8", shift=0.1 * i)
    written = plots.plot_runs(runs, tmp_path / "cmp")
    names = {os.path.basename(p) for p in written}
    assert names == {f"compare_{k}.png" for k in plots.COMPARE_KEYS}
    for path in written:
        _assert_png(path)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "ais_jax.plots", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_single_and_compare(tmp_path):
    _write_metrics(tmp_path / "a")
    _write_metrics(tmp_path / "b", shift=0.2)
    proc = _cli(tmp_path / "a", "--out", tmp_path / "figs")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split()) == len(plots.PANELS)
    _assert_png(tmp_path / "figs" / "alpha.png")
    proc = _cli(f"fp8={tmp_path / 'a'}", f"ais={tmp_path / 'b'}", "--out", tmp_path / "cmp")
    assert proc.returncode == 0, proc.stderr
    _assert_png(tmp_path / "cmp" / "compare_reward_mean.png")


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"step": 0, "loss": 1}\n{"step": 1, "loss": \n', "metrics.jsonl:2: not valid JSON"),
        ('{"step": 0}\n[1, 2]\n', "metrics.jsonl:2: expected a JSON object, got list"),
        ('{"loss": 1.0}\n', "metrics.jsonl:1: missing or non-numeric 'step'"),
        ('{"step": "x", "loss": 1.0}\n', "metrics.jsonl:1: missing or non-numeric 'step'"),
        ("\n\n", "holds no metric lines"),
    ],
)
def test_bad_metrics_file_exits_2_with_one_line(tmp_path, content, expected):
    (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(plots.PlotError, match=expected):
        plots.plot_run(tmp_path)
    assert plots.main([str(tmp_path)]) == 2


def test_cli_bad_input_messages(tmp_path, capsys):
    assert plots.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run directory" in err and "nope" in err
    assert plots.main([str(tmp_path)]) == 2  # directory without metrics.jsonl
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metrics.jsonl not found" in err
    _write_metrics(tmp_path / "a")
    assert plots.main([f"x={tmp_path / 'a'}", f"y={tmp_path / 'a'}"]) == 2
    assert "--out" in capsys.readouterr().err
    assert plots.main([str(tmp_path / "a"), "--smooth", "0"]) == 2
    assert "smooth must be an int >= 1" in capsys.readouterr().err
    (tmp_path / "a" / "metrics.jsonl").write_text('{"step": 0}\n{oops}\n')
    proc = _cli(tmp_path / "a")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "metrics.jsonl:2:" in proc.stderr
    assert "Traceback" not in proc.stderr
