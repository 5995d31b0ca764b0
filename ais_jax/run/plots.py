"""Training curves from ``metrics.jsonl``: one run, or several runs overlaid.

Usage::

    python -m ais_jax.plots runs/tiny_arithmetic              # -> runs/tiny_arithmetic/plots/
    python -m ais_jax.plots runs/x --out figs --smooth 5
    python -m ais_jax.plots bf16=runs/bf16 fp8=runs/fp8 tis=runs/tis ais=runs/ais --out cmp

Each line of ``metrics.jsonl`` is one JSON object with a numeric ``step`` and
numeric metrics (``reward_mean``, ``accuracy``, ``loss``, ``alpha``, ...);
lines may carry extra keys (``eval_accuracy``) or lack some.  When a step
appears twice (a resumed run re-logs steps after its last checkpoint) the
later line wins.  Figures are drawn with matplotlib's Agg renderer (no
display, no pyplot global state).  Bad input exits with status 2 and one line
on stderr naming the file and line.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ais_jax.core import storage
from ais_jax.core.errors import UsageError

METRICS_FILE = "metrics.jsonl"

# PNG name -> (title, y label, metric keys drawn on it).
PANELS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "reward": ("Reward and accuracy", "value", ("reward_mean", "accuracy", "eval_accuracy")),
    "d_bar": ("Rollout-training mismatch d_bar", "mean |log-ratio|", ("d_bar",)),
    "ess_ratio": ("Effective sample size ratio", "ESS / N", ("ess_ratio",)),
    "alpha": (
        "AIS coefficient and its parts",
        "value",
        ("alpha", "alpha_ess", "alpha_mis", "alpha_var"),
    ),
    "response_len": ("Response length", "tokens", ("response_len",)),
    "loss": ("Loss", "loss", ("loss",)),
}
# Metrics overlaid across runs by `plot_runs` (one PNG each).
COMPARE_KEYS = (
    "reward_mean",
    "accuracy",
    "eval_accuracy",
    "d_bar",
    "ess_ratio",
    "alpha",
    "response_len",
    "loss",
)

Series = dict[str, tuple[np.ndarray, np.ndarray]]  # metric -> (steps [n], values [n])


class PlotError(ValueError):
    """Unreadable input; the message names the file (and line) and the fix."""


def _number(value: object) -> float | None:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def read_metrics(path: str | os.PathLike) -> Series:
    """Per-metric ``(steps, values)`` arrays from a ``metrics.jsonl`` file, sorted by step.

    Blank lines are skipped; ``null`` values become NaN (gaps); non-numeric
    values (strings, lists) are ignored.

    Raises:
      PlotError: missing or unreadable file, a line that is not a JSON object,
        a line without a numeric ``step``, or no metric lines at all.
    """
    path = os.fspath(path)
    text = _remote_text(path) if storage.is_remote(path) else None
    if text is None and not os.path.isfile(path):
        raise PlotError(f"{path} not found; pass a run directory that holds {METRICS_FILE}")
    rows: dict[int, dict[str, float]] = {}
    try:
        with open(path, encoding="utf-8") if text is None else io.StringIO(text) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise PlotError(
                        f"{path}:{lineno}: not valid JSON ({e.msg}); fix or delete the line"
                    ) from None
                if not isinstance(obj, dict):
                    raise PlotError(
                        f"{path}:{lineno}: expected a JSON object, got "
                        f"{type(obj).__name__}; fix or delete the line"
                    )
                step = obj.get("step")
                if (
                    isinstance(step, bool)
                    or not isinstance(step, int | float)
                    or not (math.isfinite(step))
                ):
                    raise PlotError(
                        f"{path}:{lineno}: missing or non-numeric 'step' "
                        f"({step!r}); fix or delete the line"
                    )
                values = {
                    k: v
                    for k, v in ((k, _number(v)) for k, v in obj.items())
                    if v is not None and k != "step"
                }
                rows.setdefault(int(step), {}).update(values)
    except UnicodeDecodeError as e:
        raise PlotError(f"{path}: not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise PlotError(f"cannot read {path}: {e.strerror}") from None
    if not rows:
        raise PlotError(f"{path} holds no metric lines; run training first")
    series: Series = {}
    for key in sorted({k for r in rows.values() for k in r}):
        steps = np.array([s for s in sorted(rows) if key in rows[s]], dtype=np.int64)
        vals = np.array([rows[s][key] for s in steps], dtype=np.float64)
        series[key] = (steps, vals)
    return series


def _remote_text(path: str) -> str:
    """The text of ``metrics.jsonl`` in a bucket (a run directory ``gs://...``)."""
    try:
        return storage.read_bytes(path).decode("utf-8")
    except FileNotFoundError:
        raise PlotError(
            f"{path} not found; pass a run directory that holds {METRICS_FILE}"
        ) from None
    except UnicodeDecodeError as e:
        raise PlotError(f"{path}: not UTF-8 text ({e.reason})") from None
    except UsageError as e:  # the store's one line (no bucket, no credentials, no gcsfs)
        raise PlotError(str(e)) from None


def _metrics_path(run_dir: str | os.PathLike) -> str:
    run_dir = os.fspath(run_dir)
    if storage.is_remote(run_dir):
        return storage.join(run_dir, METRICS_FILE)
    if not os.path.isdir(run_dir):
        raise PlotError(f"run directory {run_dir} not found; pass the out_dir of a training run")
    return os.path.join(run_dir, METRICS_FILE)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over ``window`` points, NaN-aware (1 = unchanged)."""
    if window <= 1 or values.size == 0:
        return values
    ok = np.isfinite(values)
    kernel = np.ones(window)
    num = np.convolve(np.where(ok, values, 0.0), kernel)[: values.size]
    den = np.convolve(ok.astype(np.float64), kernel)[: values.size]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.maximum(den, 1), np.nan)


def _draw(
    path: str,
    title: str,
    ylabel: str,
    lines: Sequence[tuple[str, np.ndarray, np.ndarray]],
    smooth: int,
) -> None:
    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, steps, vals in lines:
        marker = "o" if steps.size <= 30 else None
        window = 1 if label.startswith("eval_") else smooth  # sparse evaluations: raw
        ax.plot(steps, moving_average(vals, window), label=label, marker=marker, markersize=3)
    ax.set_title(title if smooth <= 1 else f"{title} (moving average of {smooth})")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png")


def _check_smooth(smooth: int) -> None:
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise PlotError(f"smooth must be an int >= 1 (1 = no smoothing), got {smooth!r}")


def plot_run(
    run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, smooth: int = 1
) -> list[str]:
    """Draw the panels of `PANELS` for one run.

    Args:
      run_dir: the run's ``out_dir`` (holds ``metrics.jsonl``).
      out_dir: where the PNGs go; default ``run_dir/plots`` (a bucket run:
        ``./plots/<run name>``).
      smooth: trailing moving-average window in logged points (1 = raw
        values); ``eval_*`` metrics are never smoothed.

    Returns:
      Paths of the PNGs written (panels whose metrics never appear are skipped).

    Raises:
      PlotError: missing directory or file, or a malformed line.
    """
    _check_smooth(smooth)
    series = read_metrics(_metrics_path(run_dir))
    out = os.fspath(out_dir) if out_dir is not None else _default_out(os.fspath(run_dir))
    os.makedirs(out, exist_ok=True)
    written = []
    for name, (title, ylabel, keys) in PANELS.items():
        lines = [(k, *series[k]) for k in keys if k in series]
        if lines:
            path = os.path.join(out, f"{name}.png")
            _draw(path, title, ylabel, lines, smooth)
            written.append(path)
    return written


def _default_out(run_dir: str) -> str:
    """``run_dir/plots``; for a bucket run ``./plots/<run name>`` (PNGs are local files)."""
    if storage.is_remote(run_dir):
        return os.path.join("plots", run_dir.rstrip("/").rsplit("/", 1)[-1])
    return os.path.join(run_dir, "plots")


def plot_runs(
    run_dirs: Mapping[str, str | os.PathLike], out_dir: str | os.PathLike, smooth: int = 1
) -> list[str]:
    """Overlay several runs (label -> run directory), one PNG per metric of `COMPARE_KEYS`.

    Args:
      run_dirs: e.g. ``{"bf16": "runs/bf16", "fp8": "runs/fp8", "ais": "runs/ais"}``.
      out_dir: where ``compare_<metric>.png`` files go.
      smooth: trailing moving-average window in points (1 = raw values).

    Returns:
      Paths of the PNGs written (metrics absent from every run are skipped).

    Raises:
      PlotError: no runs, or a missing directory / file or malformed line.
    """
    _check_smooth(smooth)
    if not run_dirs:
        raise PlotError("no runs to compare; pass at least one label -> run directory")
    all_series = {label: read_metrics(_metrics_path(d)) for label, d in run_dirs.items()}
    out = os.fspath(out_dir)
    os.makedirs(out, exist_ok=True)
    written = []
    for key in COMPARE_KEYS:
        lines = [(label, *s[key]) for label, s in all_series.items() if key in s]
        if lines:
            path = os.path.join(out, f"compare_{key}.png")
            _draw(path, key, key, lines, 1 if key.startswith("eval_") else smooth)
            written.append(path)
    return written


def _parse_run(arg: str) -> tuple[str, str]:
    label, sep, path = arg.partition("=")
    if sep and label and path:
        return label, path
    return os.path.basename(os.path.normpath(arg)) or arg, arg


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 on bad input)."""
    parser = argparse.ArgumentParser(
        prog="python -m ais_jax.plots",
        description="Plot training curves from OUT_DIR/metrics.jsonl; several runs are overlaid.",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="OUT_DIR",
        help="a run directory, or LABEL=DIR for each run to overlay",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output directory (default: OUT_DIR/plots; required for several runs)",
    )
    parser.add_argument(
        "--smooth",
        type=int,
        default=1,
        help="moving-average window in logged points (default 1: raw values)",
    )
    args = parser.parse_args(argv)
    try:
        for a in args.runs:
            label, sep, path = a.partition("=")
            if sep and not label:
                raise PlotError(f"{a!r} has no label before '='; pass {path}, or LABEL={path}")
            if sep and not path:
                raise PlotError(f"{a!r} has no directory after '='; pass LABEL=DIR")
        if len(args.runs) == 1 and "=" not in args.runs[0]:
            written = plot_run(args.runs[0], args.out, args.smooth)
        else:
            if args.out is None:
                raise PlotError("several runs given; pass --out DIR for the comparison plots")
            runs = dict(_parse_run(a) for a in args.runs)
            if len(runs) != len(args.runs):
                raise PlotError("two runs share a label; name them LABEL=DIR")
            written = plot_runs(runs, args.out, args.smooth)
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write plots: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
