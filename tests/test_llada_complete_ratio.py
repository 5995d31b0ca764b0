"""The pre-registered complete-ratio block of the LLaDA setting
(experiments/llada_complete_ratio.py, issue 42 item 5): its run grid, its run command's
stopping points, and its analysis on synthetic logs with hand-computed answers (and scipy's),
down to its row in the pre-registered studies' table (experiments/prereg_index.py)."""

import importlib.util
import json
import os
import re
import sys

import pytest
from scipy import stats as sps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = os.path.join(ROOT, "experiments")
ARMS = ("none", "null", "ais_traj", "ais_est")
SEEDS = (15, 16, 17, 18, 19)
# per seed i = 0..4 (seeds 15..19), in 64ths of held-out sampled accuracy after GRPO:
H1 = (1, 2, 3, 4, 5)  # ais_traj - none
H2 = (2, 1, 3, -1, 5)  # ais_traj - ais_est
NOISE = (2, -2, 2, -2, 0)  # null - none


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXPERIMENTS, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mod():
    return _module("llada_complete_ratio")


def _write_run(logs, name: str, after: float, traj: bool, wall: float) -> None:
    """A minimal logged run: rows at steps 1, 50, 100, 150 (d_bar 0.08, token ESS 0.95, alpha
    0.5; with ``traj`` also the trajectory diagnostics, select_share 0.25 and 0.75 in turn);
    held-out sampled accuracy 0.2 before and at step 50, ``after`` at step 100 and after
    GRPO; greedy = sampled + 0.25; pass@4 0.4."""
    d = logs / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"wall_s": wall}))
    (d / "summary.json").write_text(json.dumps({
        "eval_before": {"n": 512, "pass@4": 0.4, "accuracy": 0.45, "sampled_accuracy": 0.2},
        "eval_after": {"n": 512, "pass@4": 0.4, "accuracy": after + 0.25,
                       "sampled_accuracy": after}}))
    rows = []
    for j, step in enumerate((1, 50, 100, 150)):
        row = {"step": step, "d_bar": 0.08, "ess_ratio": 0.95, "alpha": 0.5}
        if traj:
            row.update({"traj/d_bar": 0.04, "traj/token_ess": 0.99, "est/d_bar": 0.1,
                        "traj/select_share": 0.25 if j % 2 else 0.75,
                        "traj/select_seq_logratio_abs": 0.02})
        if step in (50, 100):
            acc = 0.2 if step == 50 else after
            row.update({"eval_accuracy": acc + 0.25, "eval_sampled_accuracy": acc})
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _after(i: int) -> dict[str, float]:
    """Held-out sampled accuracy after GRPO of each arm at seed index ``i`` (multiples of 1/64,
    so every difference is exact in binary)."""
    traj = 0.25 + H1[i] / 64
    return {"none": 0.25, "null": 0.25 + NOISE[i] / 64, "ais_traj": traj,
            "ais_est": traj - H2[i] / 64}


def test_grid_fresh_seeds_and_the_earlier_studys_setting(mod):
    assert mod.SEEDS == SEEDS and tuple(mod.ARMS) == ARMS
    grid = mod.planned()
    assert len(grid) == 20
    assert list(grid)[:4] == [f"complete_{a}_s15" for a in ARMS]
    assert list(grid)[-1] == "complete_ais_est_s19"
    assert grid["complete_null_s16"] == ("seed=16", "eval.every=50", "rollout.precision=fp8",
                                         "ais.mode=none", "train.rng_stream=1")
    assert grid["complete_ais_traj_s17"] == ("seed=17", "eval.every=50",
                                             "rollout.precision=fp8", "ais.mode=ais",
                                             "diffusion.ratio=trajectory")
    assert list(mod.planned([18], ["ais_est", "none"])) == ["complete_none_s18",
                                                            "complete_ais_est_s18"]
    # each arm's overrides are the earlier ratio study's for the same arm: only the code's
    # trajectory ratio (now with the selection term) and the seeds differ
    old = _module("llada_ratio")
    for arm, ov in mod.ARMS.items():
        assert ov == (*old.COMMON_OVERRIDES, *old.ARM_OVERRIDES[arm]), arm
    # no other study's log uses the seeds (this block's own logs, complete_*, would)
    used = {n.rsplit("_s", 1)[-1] for n in os.listdir(os.path.join(EXPERIMENTS, "logs"))
            if not n.startswith("complete_")}
    assert not used & {str(s) for s in SEEDS}
    from ais_jax.config.load import load_config

    for name, ov in grid.items():
        cfg = load_config(os.path.join(ROOT, mod.CONFIG), list(ov))
        assert cfg.train.steps == mod.STEPS == 150 and cfg.eval.every == 50
        assert (cfg.rollout.precision, cfg.rollout.fp8_format) == ("fp8", "e4m3")
        assert (cfg.diffusion.remasking, cfg.diffusion.surrogate) == ("low_confidence",
                                                                      "estimator")
        arm = name.split("_s")[0].removeprefix("complete_")
        assert cfg.ais.mode == ("none" if arm in ("none", "null") else "ais")
        assert cfg.diffusion.ratio == ("trajectory" if arm == "ais_traj" else "estimator")
        assert cfg.train.rng_stream == (1 if arm == "null" else 0)


def test_run_prints_a_dry_run_and_stops_before_its_deadline(mod, tmp_path, capsys):
    logs, base = tmp_path / "logs", tmp_path / "warm"
    _write_run(logs, "complete_none_s15", 0.25, False, 100.0)
    mod.cmd_run([15], ["none", "ais_traj"], str(base), str(tmp_path / "scratch"), True,
                logs=str(logs), records=str(tmp_path / "records"))
    out = capsys.readouterr().out.splitlines()
    assert out == [f"complete_ais_traj_s15 model.source={base}/llada_warm_s15 model.kind=auto "
                   "sft.steps=0 seed=15 eval.every=50 rollout.precision=fp8 ais.mode=ais "
                   "diffusion.ratio=trajectory"]
    # past --until: no warm start, no run, nothing written
    mod.cmd_run([15, 16], list(ARMS), str(base), str(tmp_path / "scratch"), False,
                "2000-01-01T00:00", str(logs), str(tmp_path / "records"))
    assert "no new run started" in capsys.readouterr().out
    assert not base.exists() and not (tmp_path / "records").exists()
    assert sorted(p.name for p in logs.iterdir()) == ["complete_none_s15"]


def test_run_refuses_seeds_outside_the_preregistration(mod, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as e:
        mod.main(["run", "--seeds", "5", "--dry-run"])
    assert e.value.code == 2


def test_analysis_waits_for_all_20_runs_then_known_answers(mod, tmp_path, capsys):
    logs, notes = tmp_path / "logs", tmp_path / "notes.md"
    notes.write_text("## Reading\n\nhand-written\n")
    for i, seed in enumerate(SEEDS):
        for arm in ARMS:
            if (i, arm) == (4, "ais_est"):
                continue  # the last run comes after the stopping-rule checks below
            _write_run(logs, f"complete_{arm}_s{seed}", _after(i)[arm], arm == "ais_traj",
                       300.0 + 10 * i if arm == "ais_traj" else 100.0)
        if i == 0:  # 4 of 20: no analysis, no reading, no report
            text = "\n".join(mod.render(str(logs), str(notes)))
            assert "4 of 20 runs logged" in text
            assert "Holm p" not in text and "hand-written" not in text
            assert mod.cmd_report(str(logs), str(notes)) == 1
            assert "4 of 20 runs logged" in capsys.readouterr().out
    assert "19 of 20 runs logged" in "\n".join(mod.render(str(logs), str(notes)))
    _write_run(logs, "complete_ais_est_s19", _after(4)["ais_est"], False, 100.0)
    lines = mod.render(str(logs), str(notes))
    text = "\n".join(lines)
    assert "of 20 runs logged" not in text
    assert lines[-4:] == ["## Reading", "", "hand-written", ""]  # the reading, after the numbers
    # H1: d = (1..5)/64, mean 3/64 = 0.0469, sd sqrt(2.5)/64, t = 3 / sqrt(0.5) = 4.243,
    # d_z = 3 / sqrt(2.5) = 1.90, df 4: one-sided p = 1/2 - (3/4) u (1 - u^2/3) with
    # u = t / sqrt(4 + t^2) = 0.9045: 0.00662; 95% interval 3/64 -/+ 2.776 sqrt(0.5)/64 =
    # [+0.016, +0.078]; every d > 0: sign-flip p = 1/32 = 0.031.
    # H2: d = (2, 1, 3, -1, 5)/64, mean 2/64 = 0.031, deviations (0, -1, 1, -3, 3)/64, sd
    # sqrt(5)/64, t = 2 / (sqrt(5) / sqrt(5)) = 2.00, d_z = 2 / sqrt(5) = 0.89; u = 2 / sqrt(8):
    # p = 1/2 - (3/4)(0.7071)(5/6) = 0.0581; interval 2/64 -/+ 2.776/64 = [-0.012, +0.075];
    # sign-flip: the |d| sum to 12, a sign pattern's sum is 12 - 2 x (the flipped |d|), so it
    # is >= 10 when the flipped |d| sum to <= 1 ({}, {1}, {1'}): 3/32 = 0.094.
    # Holm: H1 2 x 0.00662 = 0.013 (rejected), H2 max(0.013, 0.0581) = 0.058 (not rejected).
    p1 = sps.ttest_1samp([x / 64 for x in H1], 0.0, alternative="greater").pvalue
    p2 = sps.ttest_1samp([x / 64 for x in H2], 0.0, alternative="greater").pvalue
    assert (round(p1, 5), round(p2, 4)) == (0.00662, 0.0581)
    row1 = next(ln for ln in lines if ln.startswith("| H1: ais_traj - none > 0"))
    assert row1 == ("| H1: ais_traj - none > 0 | s15 +0.016, s16 +0.031, s17 +0.047, "
                    "s18 +0.062, s19 +0.078 | +0.047 [+0.016, +0.078] | +1.90 | 4.24 | "
                    f"{p1:.3f} | 0.031 | {2 * p1:.3f} | yes |")
    row2 = next(ln for ln in lines if ln.startswith("| H2: ais_traj - ais_est > 0"))
    assert row2 == ("| H2: ais_traj - ais_est > 0 | s15 +0.031, s16 +0.016, s17 +0.047, "
                    "s18 -0.016, s19 +0.078 | +0.031 [-0.012, +0.075] | +0.89 | 2.00 | "
                    f"{p2:.3f} | 0.094 | {max(2 * p1, p2):.3f} | no |")
    # noise floor: mean |null - none| = 8/64/5 = 0.025, mean 0 (sampled and greedy alike)
    floor = [ln for ln in lines if ln.startswith(("| sampled | s15 +0.031, s16 -0.031",
                                                  "| greedy | s15 +0.031, s16 -0.031"))]
    assert len(floor) == 2 and all("| 0.025 | +0.000 [" in ln for ln in floor)
    # arms table: the diagnostics only ais_traj logs (select_share: mean of 0.75, 0.25, 0.75,
    # 0.25), "-" elsewhere; alpha 0.5 as logged; wall time the mean of 300..340
    traj = next(ln for ln in lines if ln.startswith("| ais_traj | 0.297 ± 0.025"))
    assert traj == ("| ais_traj | 0.297 ± 0.025 | 0.547 ± 0.025 | 0.400 ± 0.000 | "
                    "0.200 ± 0.000 | 0.080 ± 0.000 | 0.950 ± 0.000 | 0.040 ± 0.000 | "
                    "0.990 ± 0.000 | 0.100 ± 0.000 | 0.500 ± 0.000 | 0.020 ± 0.000 | "
                    "0.500 ± 0.000 | 320 |")
    est = next(ln for ln in lines if ln.startswith("| ais_est | "))
    assert est.endswith("| 0.080 ± 0.000 | 0.950 ± 0.000 | - | - | - | - | - | "
                        "0.500 ± 0.000 | 100 |")
    # curves: 0.2 before and at step 50, the final accuracy at step 100 and after
    assert "| ais_traj | 0.200 | 0.200 | 0.297 | 0.297 |" in lines
    # exploratory: greedy for H1 / H2 (= sampled here), ais_est - none = H1 - H2
    assert ("| H1 ais_traj - none | greedy | s15 +0.016, s16 +0.031, s17 +0.047, s18 +0.062, "
            "s19 +0.078 |") in text
    assert ("| ais_est - none | sampled | s15 -0.016, s16 +0.016, s17 +0.000, s18 +0.078, "
            "s19 +0.000 |") in text
    assert mod.cmd_report(str(logs), str(notes)) == 0
    assert "### Confirmatory" in capsys.readouterr().out


def test_the_preregistered_studies_table_row(mod, tmp_path):
    """The block's row of experiments/prereg_index.py: listed, linked to its section, one
    'n of 20' row until all runs exist, then H1 / H2 with the Holm p-values above."""
    sys.path.insert(0, EXPERIMENTS)
    try:
        import prereg_index
    finally:
        sys.path.remove(EXPERIMENTS)
    study = next(s for s in prereg_index.STUDIES if s.module == "llada_complete_ratio")
    heading = mod.render(str(tmp_path / "none"))[0]
    slug = re.sub(r"[^a-z0-9 -]", "", heading.removeprefix("## ").lower()).replace(" ", "-")
    assert study.link == f"results_llada.md#{slug}"
    table = prereg_index.index_table()
    assert sum(r.startswith(f"| [{study.title}]({study.link}) |") for r in table) in (1, 2)
    hyps = [(f"{h}: {a} - {b} > 0", []) for h, a, b in mod.HYPOTHESES]
    assert prereg_index.study_rows(study.title, "#c", 0, 20, hyps) == [
        f"| [{study.title}](#c) | 2 pre-registered | - | - | 0 of 20 runs logged: "
        "not analysed yet |"]
    logs = tmp_path / "logs"
    for i, seed in enumerate(SEEDS):
        for arm in ARMS:
            _write_run(logs, f"complete_{arm}_s{seed}", _after(i)[arm], False, 100.0)
    have = mod.loaded(str(logs))
    rows = prereg_index.study_rows(study.title, "#c", len(have), 20, mod.confirmatory(have))
    assert [r.split(" | ")[1:] for r in rows] == [
        ["H1: ais_traj - none > 0", "+0.047 [+0.016, +0.078]", "0.013",
         "supported at 0.05 |"],
        ["H2: ais_traj - ais_est > 0", "+0.031 [-0.012, +0.075]", "0.058",
         "not supported at 0.05 |"]]
