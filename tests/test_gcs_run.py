"""Runs whose out_dir is a bucket (issue 56), against the in-memory GCS emulator: the same
per-step metrics as on disk, resume from the bucket, the lock, the errors in one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from _tiny import TINY_3_STEPS, TINY_RUN

from ais_jax.core import storage
from ais_jax.run import cli as train
from ais_jax.training.flops import TIMING_KEYS

TINY = [
    *TINY_RUN,
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "task.eval_size=4",
    "sft.target_accuracy=0",
    "checkpoint.every=1",
    "train.learning_rate=0.003",
]
TIMING = {"step_time_s", *TIMING_KEYS}
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _metrics(out):
    text = storage.read_text(storage.join(str(out), "metrics.jsonl"))
    return [
        {k: v for k, v in json.loads(line).items() if k not in TIMING} for line in text.splitlines()
    ]


def _assert_same(a, b):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert set(ra) == set(rb)
        for k in ra:
            np.testing.assert_allclose(
                rb[k], ra[k], rtol=1e-6, atol=1e-6, err_msg=f"step {ra['step']} {k}"
            )


@pytest.mark.slow  # three tiny runs (~45 s on 2 cores; the local one is the shared tiny_run)
def test_bucket_run_and_resume_equal_the_local_run(
    gcs_bucket, tmp_path, monkeypatch, capsys, tiny_run
):
    monkeypatch.chdir(tmp_path)
    remote, resumed = f"{gcs_bucket}/run", f"{gcs_bucket}/resumed"
    assert train.main([f"out_dir={remote}", *TINY_RUN, *TINY_3_STEPS]) == 0
    assert train.main([f"out_dir={resumed}", *TINY_RUN, *TINY_3_STEPS, "train.steps=2"]) == 0
    assert train.main([f"out_dir={resumed}", *TINY_RUN, *TINY_3_STEPS]) == 0
    assert "resumed from step 2" in capsys.readouterr().out
    assert train.main([f"out_dir={remote}", *TINY_RUN, *TINY_3_STEPS]) == 0  # done: kept
    assert "already holds the results of step 3" in capsys.readouterr().out
    want = _metrics(tiny_run[0])  # the same config on a local disk
    assert len(want) == 3
    _assert_same(want, _metrics(remote))
    _assert_same(want, _metrics(resumed))
    for out in (remote, resumed):
        assert json.loads(storage.read_text(f"{out}/summary.json"))["step"] == 3
        assert "model.safetensors" in storage.files(f"{out}/final")
        assert not storage.exists(f"{out}/run.lock")
    # the bucket's export reads back: python -m ais_jax.mismatch --model gs://.../final
    from ais_jax.run import mismatch

    args = ["--num-prompts", "1", "--samples", "2", "--max-new-tokens", "4"]
    assert mismatch.main(["--model", f"{remote}/final", *args]) == 0
    assert f"model {remote}/final: 1 prompts x 2 samples" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []  # no local folder named "gs:"


@pytest.mark.slow  # two 2-process runs (~1 min on 2 cores)
def test_two_process_run_in_a_bucket_works_and_resumes(gcs_bucket, tmp_path, monkeypatch):
    from test_multihost import _pair

    monkeypatch.chdir(tmp_path)
    run = f"{gcs_bucket}/pair"
    for steps in (1, 2):  # the second run resumes from the bucket's step-1 checkpoint
        out, _ = _pair(
            [run, run],
            *TINY,
            "rollout.prompts_per_step=4",
            "mesh.fsdp=4",
            f"train.steps={steps}",
            timeout=300,
        )
        assert [rc for rc, _, _ in out] == [0, 0], [err[-3000:] for _, _, err in out]
    assert "resumed from step 1" in out[0][1]
    assert [r["step"] for r in _metrics(run)] == [1, 2]
    assert json.loads(storage.read_text(f"{run}/summary.json"))["step"] == 2
    assert "model.safetensors" in storage.files(f"{run}/final")
    assert not [f for f in storage.files(run) if "shared" in f or f == "run.lock"]
    assert os.listdir(tmp_path) == []
