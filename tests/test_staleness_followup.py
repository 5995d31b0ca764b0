"""The pre-registered staleness follow-up (experiments/staleness_followup.py): its run grid and
order, and its analysis on synthetic logs with hand-computed answers."""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _driver():
    spec = importlib.util.spec_from_file_location(
        "staleness_followup", os.path.join(ROOT, "experiments", "staleness_followup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_run(logs, name: str, after: float, split: bool, clip: float) -> None:
    """A minimal logged run: 200 steps with d_bar 0.5, ESS 0.9, alpha 0.25, reward 0.5,
    clip_frac ``clip`` (and stale / quant parts 0.4 / 0.1 when split); held-out sampled accuracy
    0.4 before and at steps 50-150, ``after`` at the end; greedy = sampled + 0.25."""
    d = logs / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"wall_s": 300.0}))
    (d / "summary.json").write_text(json.dumps({
        "eval_before": {"n": 200, "accuracy": 0.65, "sampled_accuracy": 0.4},
        "eval_after": {"n": 200, "accuracy": after + 0.25, "sampled_accuracy": after}}))
    rows = []
    for step in range(1, 201):
        row = {"step": step, "d_bar": 0.5, "ess_ratio": 0.9, "alpha": 0.25, "reward_mean": 0.5,
               "clip_frac": clip}
        if split:
            row.update({"mismatch/quant_d_bar": 0.1, "mismatch/stale_d_bar": 0.4})
        if step % 50 == 0 and step < 200:
            row.update({"eval_accuracy": 0.65, "eval_sampled_accuracy": 0.4})
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_grid_runs_h1_first_on_fresh_seeds_with_valid_overrides():
    mod = _driver()
    assert mod.SEEDS == (23, 24, 25, 26, 27)
    grid = mod.planned()
    assert len(grid) == 35 and set(grid) == {f"followup_{a}_s{s}" for a in mod.ARMS
                                             for s in mod.SEEDS}
    names = list(grid)
    assert names[:4] == ["followup_hi_k4_ais_s23", "followup_hi_k4_naive_s23",
                         "followup_hi_k4_ais_s24", "followup_hi_k4_naive_s24"]
    assert names[10:13] == [f"followup_{a}_s23" for a in ("lo_k4_ais", "lo_k4_none",
                                                          "lo_k0_none")]
    assert names[-1] == "followup_hi_k4_none_s27"
    assert grid["followup_hi_k4_naive_s25"] == (
        "seed=25", "rollout.staleness=4", "log.split_mismatch=true", "ais.mode=none",
        "train.proximal=behaviour")
    # no other study's log uses the seeds (this block's own logs, followup_*, would)
    used = {n.rsplit("_s", 1)[-1] for n in os.listdir(os.path.join(ROOT, "experiments", "logs"))
            if not n.startswith("followup_")}
    assert not used & {str(s) for s in mod.SEEDS}
    from ais_jax.config.load import load_config

    for name, ov in grid.items():
        cfg = load_config(os.path.join(ROOT, mod.CONFIG), list(ov))
        assert cfg.train.steps == mod.STEPS and cfg.eval.every == 50
        assert cfg.rollout.precision == "fp8" and cfg.eval.num_samples == 8
        assert cfg.rollout.staleness == (0 if "_k0_" in name else 4)
        assert cfg.train.learning_rate == (2.5e-5 if "_lo_" in name else 1e-4)
        assert (cfg.train.proximal == "behaviour") == ("naive" in name)
    load_config(os.path.join(ROOT, mod.CONFIG), list(mod.PILOT))  # the pilot's overrides load


def test_dry_run_lists_only_the_missing_runs(tmp_path, capsys):
    mod = _driver()
    _write_run(tmp_path, "followup_hi_k4_ais_s23", 0.5, True, 0.0)
    mod.cmd_run(mod.SEEDS, list(mod.ARMS), str(tmp_path / "scratch"), True, logs=str(tmp_path))
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 34 and out[0].startswith("followup_hi_k4_naive_s23 seed=23 ")
    assert not (tmp_path / "scratch").exists()


def test_analysis_waits_for_all_runs_then_known_answers(tmp_path, capsys):
    """Per seed i (23..27): naive arm and the lo arms 0.5 (lo_k4_none 0.5 - 1/64); hi_k4_ais
    naive + (1..5)/64; lo_k4_ais and lo_k0_none lo_k4_none + (1, -1, 0, 0, 0)/64; null
    hi_k4_ais + (3, -3, 0, 0, 0)/64; hi_k4_none 0.5 - 4/64.  Multiples of 1/64: exact."""
    mod = _driver()
    logs = tmp_path / "logs"
    up, zero, noise = [1, 2, 3, 4, 5], [1, -1, 0, 0, 0], [3, -3, 0, 0, 0]
    for i, seed in enumerate(mod.SEEDS):
        after = {"hi_k4_naive": 0.5, "lo_k4_none": 0.5 - 1 / 64, "hi_k4_none": 0.5 - 4 / 64}
        after["hi_k4_ais"] = 0.5 + up[i] / 64
        after["lo_k4_ais"] = after["lo_k0_none"] = after["lo_k4_none"] + zero[i] / 64
        after["null"] = after["hi_k4_ais"] + noise[i] / 64
        for arm, ov in mod.ARMS.items():
            _write_run(logs, f"followup_{arm}_s{seed}", after[arm],
                       "log.split_mismatch=true" in ov, 0.125 if arm == "hi_k4_naive" else 0.0)
        if i == 0:  # the stopping rule: 7 of 35 runs, no analysis and no report
            text = "\n".join(mod.render(str(logs)))
            assert "7 of 35 runs logged" in text and "Holm p" not in text
            assert mod.cmd_report(str(logs)) == 1
            assert "7 of 35 runs logged" in capsys.readouterr().out
    lines = mod.render(str(logs))
    # H1: d = (1..5)/64: mean 0.0469, 95% interval [+0.016, +0.078], d_z 1.90, t 4.243 (df 4),
    # one-sided p 0.0066, sign-flip 1/32; Holm: 3 x 0.0066 = 0.020
    row1 = next(ln for ln in lines if ln.startswith("| H1: hi_k4_ais - hi_k4_naive > 0"))
    assert row1 == ("| H1: hi_k4_ais - hi_k4_naive > 0 | s23 +0.016, s24 +0.031, s25 +0.047, "
                    "s26 +0.062, s27 +0.078 | +0.047 [+0.016, +0.078] | +1.90 | 4.24 | 0.007 "
                    "| 0.031 | 0.020 | yes |")
    # H2, H3: d = (1, -1, 0, 0, 0)/64: t 0, p 0.5, sign-flip 3/4; Holm max(0.020, 2 x 0.5) = 1
    for h in ("H2: lo_k4_ais - lo_k4_none", "H3: lo_k0_none - lo_k4_none"):
        row = next(ln for ln in lines if ln.startswith(f"| {h} > 0"))
        assert row.endswith("| +0.00 | 0.00 | 0.500 | 0.750 | 1.000 | no |"), row
    # noise floor: mean |null - hi_k4_ais| = 6 / 64 / 5 = 0.019, mean 0
    floor = [ln for ln in lines if ln.startswith(("| sampled | s23 +0.047, s24 -0.047",
                                                  "| greedy | s23 +0.047, s24 -0.047"))]
    assert len(floor) == 2 and all("| 0.019 | +0.000 [" in ln for ln in floor)
    # arms table: clip_frac 0.125 in the naive arm only; stale d_bar 0.4 at k = 4, '-' at k = 0
    naive = next(ln for ln in lines if ln.startswith("| hi_k4_naive | 0.500 ± 0.000 |"))
    assert "| 0.125 ± 0.000 | 0.500 ± 0.000 | 0.900 ± 0.000 | 0.400 ± 0.000 | 0.100" in naive
    k0 = next(ln for ln in lines if ln.startswith("| lo_k0_none | "))
    assert "| 0.000 ± 0.000 | 0.500 ± 0.000 | 0.900 ± 0.000 | - | - |" in k0
    # mechanism windows (10 of 20 steps)
    assert "| hi_k4_naive | clip_frac | " + " -> ".join(["0.1250"] * 10) + " |" in lines
    assert not any(ln.startswith("| lo_k0_none | mismatch/") for ln in lines)
    # exploratory: hi_k4_naive - hi_k4_none = +4/64 at every seed
    assert any(ln.startswith("| hi_k4_naive - hi_k4_none | sampled | s23 +0.062") for ln in lines)
    assert mod.cmd_report(str(logs)) == 0
    assert "### Confirmatory" in capsys.readouterr().out
