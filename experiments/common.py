"""What the study drivers share: run one arm, load its logs, summarize and draw them.

`run_one` trains one config + overrides as a subprocess and copies its raw logs (with
``run.json``: command, code commit, CPU model, wall time, load) to ``experiments/logs/NAME/``;
`load` reads them back; `run_stats`, `paired_table`, `figure` summarize them; `warm_export`
runs one seed's warm start once and exports it for the arms to start from.  The drivers
(``compare.py``, ``long_arms.py``, ``lora_arms.py``, ``llada_arms.py``,
``smollm2_mechanism.py``, ...) import this module; it imports none of
them (tests/test_layers.py checks experiments/ and benchmarks/ for import circles).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository's ais_jax, also when it is not installed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiments/stats.py
from ais_jax.run.plots import moving_average  # noqa: E402

CONFIG = "configs/tiny_arithmetic.yaml"  # run_one's default config: the embedded default
LOGS = os.path.join(ROOT, "experiments", "logs")
COMMON = ("checkpoint.every=0", "log.progress=false", "log.tensorboard=false")
REWARD_THRESHOLD = 0.7  # "steps to threshold": first step the 10-step mean reward reaches it
WINDOW = 10  # the moving-average window of the curves and of "steps to threshold"


def run_one(name: str, overrides: Sequence[str], scratch: str, config: str = CONFIG) -> None:
    """Train ``config`` + COMMON + ``overrides`` in ``scratch/name``; copy the raw logs (and
    ``run.json``: command, code commit, CPU model, wall time, load averages) to
    ``experiments/logs/name``."""
    out_dir = os.path.join(scratch, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "ais_jax.train", "--config", config, f"out_dir={out_dir}",
           *COMMON, *overrides]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"run {name} failed with status {proc.returncode}")
    dest = os.path.join(LOGS, name)
    os.makedirs(dest, exist_ok=True)
    for f in ("metrics.jsonl", "summary.json"):
        shutil.copy(os.path.join(out_dir, f), os.path.join(dest, f))
    shown = ["python", "-m", "ais_jax.train", "--config", config, *COMMON, *overrides]
    with open(os.path.join(dest, "run.json"), "w") as f:
        json.dump({"command": " ".join(shown), "commit": code_commit(), "cpu": cpu_model(),
                   "wall_s": round(wall, 1),
                   "load_avg_start": [round(x, 2) for x in load0],
                   "load_avg_end": [round(x, 2) for x in os.getloadavg()]}, f, indent=1)
        f.write("\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    print(f"{name}: {wall:.0f} s", flush=True)


def cpu_model() -> str:
    """This machine's CPU model (`scripts/golden_run.py`'s ``environment()["cpu"]``): XLA's CPU
    code, and so a sampled run's trajectory, differs between models."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "golden_run", os.path.join(ROOT, "scripts", "golden_run.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.environment()["cpu"]


def code_commit() -> str | None:
    """The commit the run's code is at (``git rev-parse HEAD`` in the repository, with
    ``+dirty`` when tracked files under ``ais_jax/`` differ from it); None outside a git
    checkout.  Recorded in each run.json, so a study run over several sessions shows that every
    run trained with the same code."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "ais_jax").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def past(until: str) -> bool:
    """Whether the local time is past ``until`` (an ISO date-time such as ``2026-12-02T07:30``;
    empty: never): the drivers start no new run after it, so a session's end never kills one."""
    import datetime

    if not until:
        return False
    try:
        limit = datetime.datetime.fromisoformat(until)
    except ValueError:
        raise SystemExit(f"--until {until!r} is not an ISO date-time; write e.g. "
                         "2026-12-02T07:30") from None
    if datetime.datetime.now() > limit:
        print(f"past --until {until}: no new run started", flush=True)
        return True
    return False


def warm_export(config: str, seed: int, dest: str, log_name: str, command: str,
                overrides: Sequence[str] = ()) -> bool:
    """Warm-start ``config`` at ``seed`` and export it to ``dest``, unless already there.

    Args:
      config: the config's path relative to the repository root.
      seed: the run's seed.
      dest: the export directory (``<dest>.run`` is the scratch output, removed after).
      log_name: the log directory's name under experiments/logs.
      command: the command line recorded in warm.json.
      overrides: extra config overrides.

    Returns:
      True when it ran, False when ``dest`` already held an export.
    """
    from ais_jax.config.load import load_config
    from ais_jax.models.pretrained import save_pretrained
    from ais_jax.training.build import build_run
    from ais_jax.training.warmstart import WarmStartLog, warm_start

    if os.path.exists(os.path.join(dest, "config.json")):
        return False
    t0 = time.perf_counter()
    cfg = load_config(os.path.join(ROOT, config), [f"seed={seed}", f"out_dir={dest}.run",
                                                   *overrides])
    run = build_run(cfg)
    log = WarmStartLog()
    params = warm_start(run, run.state.params, log=log)
    save_pretrained(params, run.model_cfg, dest)
    run.codec.tokenizer.save(dest)
    wall = time.perf_counter() - t0
    shutil.rmtree(f"{dest}.run", ignore_errors=True)
    logdir = os.path.join(LOGS, log_name)
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "warm.json"), "w") as f:
        json.dump({"command": command, "config": config, "wall_s": round(wall, 1),
                   "warm_start": log.as_dict()}, f, indent=1)
        f.write("\n")
    print(f"warm start seed {seed}: {wall:.0f} s -> {dest}", flush=True)
    return True


# ---------------------------------------------------------- pre-registered grids


def grid(prefix: str, seeds: Sequence[int], table: dict[str, Sequence[str]],
         arms: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """A block's run names -> overrides, seed-major: ``<prefix>_<arm>_s<seed>`` for each seed,
    the arms of ``table`` that are in ``arms`` in ``table``'s order, then the next seed."""
    return {f"{prefix}_{arm}_s{seed}": (f"seed={seed}", *table[arm])
            for seed in seeds for arm in table if arm in arms}


def run_missing(plan: dict[str, Sequence[str]], scratch: str, config: str, dry_run: bool,
                until: str = "", logs: str = LOGS) -> None:
    """Train every run of ``plan`` without a log in ``logs``, one at a time, in order;
    ``dry_run`` prints them instead; ``until``: start none past this ISO date-time (`past`),
    so a session's end never cuts one off."""
    for name, ov in plan.items():
        if os.path.exists(os.path.join(logs, name, "run.json")):
            continue
        if dry_run:
            print(name, " ".join(ov))
        elif past(until):
            return
        else:
            run_one(name, ov, scratch, config)


def loaded_runs(names: Sequence[str], logs: str = LOGS) -> dict[str, dict]:
    """Every logged run among ``names``: name -> `load`'s dict (runs without a log left out)."""
    return {n: r for n in names if (r := load(n, logs)) is not None}


def seed_diffs(have: dict[str, dict], prefix: str, arm: str, base: str, key: str,
               seeds: Sequence[int]) -> list[float]:
    """Per-seed ``arm - base`` of the held-out metric ``key`` after GRPO (``summary.json``'s
    ``eval_after``), seeds in order; runs are named ``<prefix>_<arm>_s<seed>``."""
    def after(a: str, s: int) -> float:
        return float(have[f"{prefix}_{a}_s{s}"]["summary"]["eval_after"][key])

    return [after(arm, s) - after(base, s) for s in seeds]


# ----------------------------------------------------------------------- logs


def load(name: str, logs: str = LOGS) -> dict | None:
    """A logged run ``logs/<name>`` as ``{"rows", "summary", "meta"}``; None without run.json."""
    d = os.path.join(logs, name)
    if not os.path.exists(os.path.join(d, "run.json")):
        return None
    with open(os.path.join(d, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(d, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(d, "run.json")) as f:
        meta = json.load(f)
    return {"rows": rows, "summary": summary, "meta": meta}


def series(run: dict, key: str) -> np.ndarray:
    return np.array([r[key] for r in run["rows"]], dtype=np.float64)


def steps_to(run: dict, threshold: float) -> int | None:
    r = series(run, "reward_mean")
    for i in range(WINDOW - 1, len(r)):
        if np.mean(r[i - WINDOW + 1:i + 1]) >= threshold:
            return int(run["rows"][i]["step"])
    return None


def signed(x: float, digits: int = 3) -> str:
    return f"{x:+.{digits}f}" if np.isfinite(x) else ("+inf" if x > 0 else "-inf")


def mean_sd(xs: Sequence[float], digits: int = 3) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def paired_table(rows: Sequence[tuple[str, str, Sequence[int], Sequence[float]]],
                 family: str) -> list[str]:
    """Markdown table of paired per-seed differences, one row per (comparison, metric).

    Each row of ``rows`` is (comparison, metric, seeds, per-seed differences). Columns: the
    per-seed differences, n, the mean with its 95% paired t-interval (t distribution, n - 1
    df), the standardized effect d_z (mean / sd), the two-sided paired t-test p-value, the
    exact two-sided sign-flip permutation p-value (all 2^n sign assignments) and the
    t-test p-value after Holm's correction over every row of the table (the family,
    described by ``family``).  experiments/stats.py computes all of them.
    """
    from stats import holm, paired_t, sign_flip_p

    tests = {i: paired_t(d) for i, (_, _, _, d) in enumerate(rows)}
    adj = holm({str(i): t.p for i, t in tests.items()})
    lines = ["| comparison | metric | per seed | n | mean [95% t-interval] | d_z | t-test p | "
             f"sign-flip p | Holm p ({family}) |", "|---|---|---|---|---|---|---|---|---|"]
    for i, (label, metric, seeds, d) in enumerate(rows):
        t = tests[i]
        per = ", ".join(f"s{s} {x:+.3f}" for s, x in zip(seeds, d, strict=True))
        lines.append(
            f"| {label} | {metric} | {per} | {t.n} | {signed(t.mean)} [{signed(t.ci[0])}, "
            f"{signed(t.ci[1])}] | {signed(t.effect, 2)} | {t.p:.3f} | {sign_flip_p(d):.4g} | "
            f"{adj[str(i)][0]:.3f} |")
    return lines


def run_stats(run: dict) -> dict[str, float | None]:
    s = run["summary"]
    n = len(run["rows"])
    k = max(1, min(20, n // 5))
    return {
        "greedy_before": s["eval_before"]["accuracy"],
        "greedy_after": s["eval_after"]["accuracy"],
        "sampled_before": s["eval_before"].get("sampled_accuracy"),
        "sampled_after": s["eval_after"].get("sampled_accuracy"),
        "delta_greedy": s["eval_after"]["accuracy"] - s["eval_before"]["accuracy"],
        "delta_sampled": (s["eval_after"]["sampled_accuracy"] - s["eval_before"]["sampled_accuracy"]
                          if "sampled_accuracy" in s["eval_before"] else None),
        "reward_first": float(np.mean(series(run, "reward_mean")[:k])),
        "reward_last": float(np.mean(series(run, "reward_mean")[-k:])),
        "steps_to": steps_to(run, REWARD_THRESHOLD),
        "d_bar": float(np.mean(series(run, "d_bar"))),
        "ess_early": float(np.mean(series(run, "ess_ratio")[:k])),
        "ess_late": float(np.mean(series(run, "ess_ratio")[-k:])),
        "alpha": float(np.mean(series(run, "alpha"))),
        "skipped": float(series(run, "skipped").sum()),
        "wall_s": run["meta"]["wall_s"],
        "steps": n,
    }


# -------------------------------------------------------------------- figures


def smooth(x: np.ndarray) -> np.ndarray:
    return moving_average(x, WINDOW)


def single_axes_png(path: str, title: str, ylabel: str, draw: Callable[[Any], None]) -> None:
    """One Agg figure with one axes: ``draw(ax)`` adds the curves, then title, grid, legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    draw(ax)
    ax.set_title(title)
    ax.set_xlabel("RL step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})


def aligned(rs: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Steps ``[n]`` and smoothed values ``[runs, n]`` of ``key``, cut to the shortest run."""
    n = min(len(r["rows"]) for r in rs)
    steps = np.array([r["step"] for r in rs[0]["rows"][:n]])
    return steps, np.stack([smooth(series(r, key)[:n]) for r in rs])


def figure(path: str, title: str, ylabel: str, curves: dict[str, list[dict]], key: str) -> bool:
    """Draw the seed-mean curve (band: seed range) of each group; False when nothing to draw."""
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return False

    def draw(ax: Any) -> None:
        for label, rs in curves.items():
            steps, ys = aligned(rs, key)
            (line,) = ax.plot(steps, ys.mean(0), label=f"{label} (n={len(rs)})", linewidth=1.4)
            if len(rs) > 1:
                ax.fill_between(steps, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.15)

    single_axes_png(path, title, ylabel, draw)
    return True


def alpha_figure(path: str, title: str, rs: list[dict]) -> None:
    """Seed-mean alpha (dashed) and its three parts over training."""
    def draw(ax: Any) -> None:
        for key in ("alpha", "alpha_ess", "alpha_mis", "alpha_var"):
            steps, ys = aligned(rs, key)
            ax.plot(steps, ys.mean(0), label=key, linewidth=2.2 if key == "alpha" else 1.2,
                    linestyle="--" if key == "alpha" else "-")

    single_axes_png(path, title, "value (10-step mean)", draw)
