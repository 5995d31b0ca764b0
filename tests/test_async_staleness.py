"""The pre-registered asynchronous-rollout block (experiments/async_staleness.py): its run grid
and its analysis on synthetic logs with hand-computed answers."""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _driver():
    spec = importlib.util.spec_from_file_location(
        "async_staleness", os.path.join(ROOT, "experiments", "async_staleness.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_run(logs, name: str, after: float, k: int, split: bool) -> None:
    """A minimal logged run: 200 steps with d_bar 0.1 (k + 1), ESS 0.9, alpha 0.25, reward 0.5
    (and mismatch parts 0.1 / 0.1 k when split); held-out sampled accuracy 0.4 before and at
    steps 50-150, ``after`` at the end; greedy = sampled + 0.25."""
    d = logs / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"wall_s": 300.0}))
    (d / "summary.json").write_text(json.dumps({
        "eval_before": {"n": 200, "accuracy": 0.65, "sampled_accuracy": 0.4},
        "eval_after": {"n": 200, "accuracy": after + 0.25, "sampled_accuracy": after}}))
    rows = []
    for step in range(1, 201):
        row = {"step": step, "d_bar": 0.1 * (k + 1), "ess_ratio": 0.9, "alpha": 0.25,
               "reward_mean": 0.5}
        if split:
            row.update({"mismatch/quant_d_bar": 0.1, "mismatch/stale_d_bar": 0.1 * k,
                        "mismatch/quant_ess": 0.95, "mismatch/stale_ess": 0.9})
        if step % 50 == 0 and step < 200:
            row.update({"eval_accuracy": 0.65, "eval_sampled_accuracy": 0.4})
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_grid_is_seed_major_fresh_seeds_and_valid_overrides():
    mod = _driver()
    assert mod.SEEDS == (10, 11, 12, 13, 14)
    grid = mod.planned()
    assert len(grid) == 50
    assert list(grid)[:10] == [f"async_{a}_s10" for a in (
        "k0_none", "k0_tis", "k0_ais", "k1_none", "k1_tis", "k1_ais", "k4_none", "k4_tis",
        "k4_ais", "null")]
    assert grid["async_k4_ais_s12"] == ("seed=12", "rollout.staleness=4", "ais.mode=ais",
                                        "log.split_mismatch=true")
    assert grid["async_null_s14"] == ("seed=14", "rollout.staleness=0", "ais.mode=ais",
                                      "train.rng_stream=1")
    # no other study's log uses the seeds (this block's own logs, async_*, would)
    used = {n.rsplit("_s", 1)[-1] for n in os.listdir(os.path.join(ROOT, "experiments", "logs"))
            if not n.startswith("async_")}
    assert not used & {"10", "11", "12", "13", "14"}
    from ais_jax.config.load import load_config

    for ov in grid.values():
        cfg = load_config(os.path.join(ROOT, mod.CONFIG), list(ov))
        assert cfg.train.steps == mod.STEPS and cfg.eval.every == 50
        assert cfg.rollout.precision == "fp8" and cfg.eval.num_samples == 8
    load_config(os.path.join(ROOT, mod.CONFIG), list(mod.PILOT))  # the pilot's overrides load


def test_analysis_waits_for_all_runs_then_known_answers(tmp_path, capsys):
    """Per seed i (10..14): k0 arms 0.5; k1_none 0.5 - 1/64, k4_none 0.5 - 4/64; k4_ais
    k4_none + (1..5)/64; k4_tis, k1_ais and k1_tis their `none` + (1, -1, 0, 0, 0)/64; null
    k0_ais + (3, -3, 0, 0, 0)/64.  Every value is a multiple of 1/64 (exact in binary)."""
    mod = _driver()
    logs = tmp_path / "logs"
    up, zero, noise = [1, 2, 3, 4, 5], [1, -1, 0, 0, 0], [3, -3, 0, 0, 0]
    for i, seed in enumerate(mod.SEEDS):
        after = {"k0_none": 0.5, "k0_tis": 0.5, "k0_ais": 0.5, "k1_none": 0.5 - 1 / 64,
                 "k4_none": 0.5 - 4 / 64}
        after["k4_ais"] = after["k4_none"] + up[i] / 64
        after["k4_tis"] = after["k4_none"] + zero[i] / 64
        after["k1_ais"] = after["k1_tis"] = after["k1_none"] + zero[i] / 64
        after["null"] = after["k0_ais"] + noise[i] / 64
        for arm, ov in mod.ARMS.items():
            k = int(arm[1]) if arm.startswith("k") else 0
            _write_run(logs, f"async_{arm}_s{seed}", after[arm], k,
                       "log.split_mismatch=true" in ov)
        if i == 0:  # the stopping rule: 10 of 50 runs, no analysis and no report
            text = "\n".join(mod.render(str(logs)))
            assert "10 of 50 runs logged" in text and "Holm p" not in text
            assert mod.cmd_report(str(logs)) == 1
            assert "10 of 50 runs logged" in capsys.readouterr().out
    lines = mod.render(str(logs))
    # H1: d = (1..5)/64, mean 3/64 = 0.0469, sd sqrt(2.5)/64 = 0.0247, d_z = sqrt(3.6) = 1.90,
    # t = 3 sqrt 2 = 4.243, df 4: one-sided p = 1/2 - (3/4) u (1 - u^2 / 3), u = t / sqrt(4 +
    # t^2) = 0.9045: p = 0.0066; 95% interval 0.0469 -/+ 2.776 x 0.0247 / sqrt 5 = -/+ 0.0307
    # = [+0.016, +0.078]; all d > 0: sign-flip p = 1/32 = 0.031; Holm: 4 x 0.0066 = 0.026.
    row1 = next(ln for ln in lines if ln.startswith("| H1: k4_ais - k4_none > 0"))
    assert row1 == ("| H1: k4_ais - k4_none > 0 | s10 +0.016, s11 +0.031, s12 +0.047, "
                    "s13 +0.062, s14 +0.078 | +0.047 [+0.016, +0.078] | +1.90 | 4.24 | 0.007 "
                    "| 0.031 | 0.026 | yes |")
    # H2-H4: d = (1, -1, 0, 0, 0)/64: mean 0, t 0, p 0.5; sign-flip P(sum >= 0) = 3/4; Holm
    # p = max(0.026, min(1, 3 x 0.5)) = 1 for the three.
    for h in ("H2: k4_tis - k4_none", "H3: k1_ais - k1_none", "H4: k1_tis - k1_none"):
        row = next(ln for ln in lines if ln.startswith(f"| {h} > 0"))
        assert row.endswith("| +0.00 | 0.00 | 0.500 | 0.750 | 1.000 | no |"), row
    # noise floor: mean |null - k0_ais| = 6 / 64 / 5 = 0.019, mean 0
    floor = [ln for ln in lines if ln.startswith(("| sampled | s10 +0.047, s11 -0.047",
                                                  "| greedy | s10 +0.047, s11 -0.047"))]
    assert len(floor) == 2 and all("| 0.019 | +0.000 [" in ln for ln in floor)
    # the cost of staleness: -4/64 = -0.0625 at every seed (k = 4), -1/64 (k = 1)
    assert ("| k4_none - k0_none | sampled | s10 -0.062, s11 -0.062, s12 -0.062, s13 -0.062, "
            "s14 -0.062 | -0.062 |") in lines
    assert any(ln.startswith("| k1_none - k0_none | greedy | s10 -0.016") for ln in lines)
    # mechanism windows (10 of 20 steps): d_bar 0.5 at k = 4, the stale part 0.4; no split
    # and no alpha rows where they do not apply
    assert "| k4_none | d_bar | " + " -> ".join(["0.5000"] * 10) + " |" in lines
    assert "| k4_tis | mismatch/stale_d_bar | " + " -> ".join(["0.4000"] * 10) + " |" in lines
    assert not any(ln.startswith(("| k0_ais | mismatch/", "| k1_none | alpha ")) for ln in lines)
    assert any(ln.startswith("| k1_ais | alpha | 0.250") for ln in lines)
    # sampled curve of k4_ais: 0.4 before and at steps 50-150, then 0.5 - 4/64 + 3/64
    assert "| k4_ais | 0.400 | 0.400 | 0.400 | 0.400 | 0.484 |" in lines
    assert mod.cmd_report(str(logs)) == 0
    assert "### Confirmatory" in capsys.readouterr().out
