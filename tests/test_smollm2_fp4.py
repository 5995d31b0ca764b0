"""The pre-registered SmolLM2 FP4 block (experiments/smollm2_fp4.py): its run grid and its
analysis on synthetic logs with hand-computed answers."""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _driver():
    spec = importlib.util.spec_from_file_location(
        "smollm2_fp4", os.path.join(ROOT, "experiments", "smollm2_fp4.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_run(logs, name: str, after: float, greedy: float, ess_last: float) -> None:
    """A minimal logged run: 60 steps, token ESS 0.9 over steps 1-50 and ``ess_last`` over
    51-60; held-out sampled accuracy 0.4 before, 0.4 at steps 10-50, ``after`` at the end."""
    d = logs / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"wall_s": 100.0}))
    ev = {"n": 40, "pass@4": 0.5}
    (d / "summary.json").write_text(json.dumps({
        "eval_before": {**ev, "accuracy": 0.6, "sampled_accuracy": 0.4},
        "eval_after": {**ev, "accuracy": greedy, "sampled_accuracy": after}}))
    rows = []
    for step in range(1, 61):
        row = {"step": step, "d_bar": 0.5, "ess_ratio": 0.9 if step <= 50 else ess_last,
               "seq_log_ratio_std": 1.0, "alpha": 0.25, "alpha_ess": 0.5, "alpha_mis": 1.0,
               "alpha_var": 0.5, "reward_mean": 0.5}
        if step % 10 == 0 and step < 60:
            row.update({"eval_accuracy": 0.6, "eval_sampled_accuracy": 0.4})
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_grid_is_seed_major_fresh_seeds_and_valid_overrides():
    mod = _driver()
    assert mod.SEEDS == (20, 21, 22)
    grid = mod.planned()
    assert len(grid) == 15
    assert list(grid)[:5] == [f"fp4_{a}_s20" for a in ("none", "bf16", "ais", "null", "tis")]
    assert grid["fp4_ais_s21"] == ("seed=21", *mod.FP4, "ais.mode=ais")
    assert grid["fp4_null_s22"] == ("seed=22", "rollout.precision=bf16", "ais.mode=none",
                                    "train.rng_stream=1")
    assert list(mod.planned([21], ["tis", "none"])) == ["fp4_none_s21", "fp4_tis_s21"]
    # no earlier study logged a run with these seeds
    # no other study's log uses the seeds (this study's own logs, fp4_*, do)
    used = {n.rsplit("_s", 1)[-1] for n in os.listdir(os.path.join(ROOT, "experiments", "logs"))
            if not n.startswith("fp4_")}
    assert not used & {"20", "21", "22"}
    from ais_jax.config.load import load_config

    for ov in grid.values():
        cfg = load_config(os.path.join(ROOT, mod.CONFIG), list(ov))
        assert cfg.train.steps == mod.STEPS and cfg.eval.every == 10
    fp4 = load_config(os.path.join(ROOT, mod.CONFIG), list(grid["fp4_none_s20"])).rollout
    assert (fp4.precision, fp4.fp8_format, fp4.lm_head_fp8) == ("fp8", "nvfp4", True)


def test_analysis_waits_for_all_runs_then_known_answers(tmp_path, capsys):
    """Per seed k (20, 21, 22): none 0.5; bf16 none + (2, 3, 4)/64; ais none + (1, -1, 0)/64;
    null bf16 + (2, -2, 0)/64; tis none + (1, 0, -1)/64.  Greedy = sampled + 0.25.  Every value
    is a multiple of 1/64, so the differences are exact in binary."""
    mod = _driver()
    logs = tmp_path / "logs"
    h1, h2, noise = [2, 3, 4], [1, -1, 0], [2, -2, 0]
    for k, seed in enumerate(mod.SEEDS):
        after = {"none": 0.5, "tis": 0.5 + (1 - k) / 64, "bf16": 0.5 + h1[k] / 64,
                 "ais": 0.5 + h2[k] / 64}
        after["null"] = after["bf16"] + noise[k] / 64
        for arm in mod.ARMS:
            # token ESS over steps 51-60: 0.8, 0.7, 0.6 in the `none` runs; 0.9 elsewhere
            ess_last = 0.8 - 0.1 * k if arm == "none" else 0.9
            _write_run(logs, f"fp4_{arm}_s{seed}", after[arm], after[arm] + 0.25, ess_last)
        if k == 0:  # the stopping rule: 5 of 15 runs, no analysis and no report
            text = "\n".join(mod.render(str(logs)))
            assert "5 of 15 runs logged" in text and "Holm p" not in text
            assert mod.cmd_report(str(logs)) == 1
            assert "5 of 15 runs logged" in capsys.readouterr().out
    lines = mod.render(str(logs))
    text = "\n".join(lines)
    assert "of 15 runs logged" not in text
    # H1: d = (2, 3, 4)/64, mean 3/64 = 0.0469, sd 1/64, t = 3 sqrt(3) = 5.196, d_z = 3,
    # df 2: one-sided p = (1 - t / sqrt(t^2 + 2)) / 2 = (1 - 5.196 / 5.385) / 2 = 0.0175;
    # 95% interval 3/64 -/+ 4.303 / (64 sqrt 3) = 0.0469 -/+ 0.0388 = [+0.008, +0.086];
    # all d > 0: sign-flip p = 1/8; Holm: 2 x 0.0175 = 0.035 < 0.05, rejected.
    row1 = next(ln for ln in lines if ln.startswith("| H1: bf16 - none > 0"))
    assert row1 == ("| H1: bf16 - none > 0 | s20 +0.031, s21 +0.047, s22 +0.062 | "
                    "+0.047 [+0.008, +0.086] | +3.00 | 5.20 | 0.018 | 0.125 | 0.035 | yes |")
    # H2: d = (1, -1, 0)/64: mean 0, t 0, p 0.5, interval 0 -/+ 0.039; sign-flip: the sums
    # over sign patterns are 2, 0, 0, -2 (twice each): P(sum >= 0) = 6/8 = 0.75; Holm 0.5.
    row2 = next(ln for ln in lines if ln.startswith("| H2: ais - none > 0"))
    assert row2.endswith("| +0.000 [-0.039, +0.039] | +0.00 | 0.00 | 0.500 | 0.750 | 0.500 | "
                         "no |")
    # noise floor: mean |null - bf16| = 4 / 64 / 3 = 0.021, mean 0 (sampled and greedy alike)
    floor = [ln for ln in lines if ln.startswith(("| sampled | s20 +0.031, s21 -0.031",
                                                  "| greedy | s20 +0.031, s21 -0.031"))]
    assert len(floor) == 2 and all("| 0.021 | +0.000 [" in ln for ln in floor)
    # Fig. 4 statistic of the `none` runs: 0.8 - 0.9, 0.7 - 0.9, 0.6 - 0.9; mean -0.2
    assert "| fp4_none_s21 | 0.9000 | 0.7000 | -0.2000 |" in lines
    assert "| mean over seeds | | | -0.2000 |" in lines
    # windows of token ESS, mean over seeds, in the `none` arm: 0.9 five times, then 0.7
    assert ("| none | token ESS ratio | 0.9000 -> 0.9000 -> 0.9000 -> 0.9000 -> 0.9000 -> "
            "0.7000 |") in lines
    assert any(ln.startswith("| ais | alpha_var | 0.500") for ln in lines)
    assert not any(ln.startswith("| none | alpha") for ln in lines)
    # greedy curve of bf16: 0.6 before and at steps 10-50, then the mean final 0.5 + 3/64 + 0.25
    assert "| bf16 | 0.600 | 0.600 | 0.600 | 0.600 | 0.600 | 0.600 | 0.797 |" in lines
    assert "| tis - none | sampled | s20 +0.016, s21 +0.000, s22 -0.016 |" in text
    assert mod.cmd_report(str(logs)) == 0
    assert "### Confirmatory" in capsys.readouterr().out
