"""Tracker backends (``log.backends``) and the completions table (``log.completions_every``)."""

from __future__ import annotations

import glob
import json
import math
import os

import numpy as np
import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.config.schema import DEFAULT_CONFIG_PATH
from ais_jax.method import corrections
from ais_jax.run import cli as train
from ais_jax.run import trackers

TINY = [*TINY_RUN, "train.learning_rate=0.003"]


def _jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _cfg(out, *extra):
    return load_config(DEFAULT_CONFIG_PATH, [f"out_dir={out}", *TINY, "train.steps=2",
                                             "checkpoint.every=0", *extra])


def test_ratio_stats_and_rows():
    lo = np.array([[-1.0, -2.0, 0.0], [-1.0, -np.inf, 0.0]])
    lp = np.array([[-1.5, -1.0, -9.0], [-1.0, -1.0, 0.0]])
    m = np.array([[1, 1, 0], [1, 1, 0]], np.float32)
    st = corrections.ratio_stats((lo, lo), lp, m)
    np.testing.assert_allclose(st["log_ratio_abs_mean"][0], 0.75)
    np.testing.assert_allclose(st["log_ratio_abs_max"][0], 1.0)
    np.testing.assert_allclose(st["log_ratio_sum"][0], -0.5)
    rows = trackers.completion_rows(3, ["p0", "p1"], ["c0", "c1"], np.array([1.0, 0.0]), st,
                                    limit=5)
    assert [r["row"] for r in rows] == [0, 1] and rows[1]["log_ratio_sum"] is None
    assert set(rows[0]) == set(trackers.COLUMNS)


def test_completions_table(tmp_path):
    cfg = _cfg(tmp_path, "log.completions_every=1", "log.completions_rows=6")
    result = train.run(cfg)
    rows = _jsonl(os.path.join(tmp_path, "completions.jsonl"))
    assert [r["step"] for r in rows] == [1] * 6 + [2] * 6
    for r in rows:
        assert isinstance(r["prompt"], str) and r["prompt"]
        assert isinstance(r["completion"], str)
        assert r["tokens"] >= 1
        for k in ("reward", "log_ratio_abs_mean", "log_ratio_abs_max", "log_ratio_sum"):
            assert isinstance(r[k], float) and math.isfinite(r[k]), (k, r)
        assert r["log_ratio_abs_max"] >= r["log_ratio_abs_mean"] >= 0.0
    assert any(r["log_ratio_abs_max"] > 0 for r in rows)  # FP8 rollout: a real mismatch
    # The table needed logp_old on the host: the score program compiled once.
    assert result.compiles["score"] == 1


def test_wandb_offline_same_metric_names(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    wdir = tmp_path / "wandb_dir"
    wdir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wdir))
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    logged = []
    real_init = wandb.init

    def init(*a, **kw):  # spy on the run's log calls (the data still goes to the run)
        run = real_init(*a, **kw)
        real_log = run.log

        def log(data, *la, **lkw):
            logged.append(dict(data))
            return real_log(data, *la, **lkw)

        run.log = log
        return run

    monkeypatch.setattr(wandb, "init", init)
    train.run(_cfg(out, "log.backends=jsonl,wandb", "log.completions_every=2"))
    metrics = _jsonl(os.path.join(out, "metrics.jsonl"))
    assert "completions" in logged[1]  # the step-2 completions table, with the metrics
    assert [set(d) - {"completions"} for d in logged] == [set(m) for m in metrics]
    runs = glob.glob(str(wdir / "wandb" / "offline-run-*"))
    assert len(runs) == 1
    (data,) = glob.glob(os.path.join(runs[0], "*.wandb"))
    with open(data, "rb") as f:  # the run's records (protobuf) name every metric
        raw = f.read()
    for key in metrics[-1]:
        assert key.encode() in raw, key
    with open(os.path.join(out, "wandb_id")) as f:
        assert f.read().strip() in runs[0]


def test_unknown_backend_exits_2_one_line(tmp_path, capsys):
    code = train.main([f"out_dir={tmp_path}", *TINY, "log.backends=jsonl,mlflow"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "unknown backend 'mlflow'" in err


def test_backends_parse():
    cfg = load_config(DEFAULT_CONFIG_PATH, ["log.backends= wandb, jsonl ,wandb",
                                            "log.tensorboard=false"])
    assert trackers.parse_backends(cfg.log) == ("wandb", "jsonl")
    assert trackers.parse_backends(load_config(DEFAULT_CONFIG_PATH).log) == (
        "jsonl", "tensorboard")
