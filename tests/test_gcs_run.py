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


@pytest.mark.slow  # one tiny run and a finished one's check (~20 s on 2 cores)
def test_bucket_run_equals_the_local_run(gcs_bucket, tmp_path, monkeypatch, capsys, tiny_run):
    monkeypatch.chdir(tmp_path)
    remote = f"{gcs_bucket}/run"
    assert train.main([f"out_dir={remote}", *TINY_RUN, *TINY_3_STEPS]) == 0
    assert train.main([f"out_dir={remote}", *TINY_RUN, *TINY_3_STEPS]) == 0  # done: kept
    assert "already holds the results of step 3" in capsys.readouterr().out
    want = _metrics(tiny_run[0])  # the same config on a local disk
    assert len(want) == 3
    _assert_same(want, _metrics(remote))
    assert json.loads(storage.read_text(f"{remote}/summary.json"))["step"] == 3
    assert "model.safetensors" in storage.files(f"{remote}/final")
    assert not storage.exists(f"{remote}/run.lock")
    # the bucket's export reads back: python -m ais_jax.mismatch --model gs://.../final
    from ais_jax.run import mismatch

    args = ["--num-prompts", "1", "--samples", "2", "--max-new-tokens", "4"]
    assert mismatch.main(["--model", f"{remote}/final", *args]) == 0
    assert f"model {remote}/final: 1 prompts x 2 samples" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []  # no local folder named "gs:"


# The CLI, SIGKILLed by itself when orbax is about to write the commit marker of checkpoint
# 2 (every object of the step uploaded but the marker): a save cut short by a kill -9.
_KILLED_AT_COMMIT = """
import os, signal, sys
from orbax.checkpoint._src.path import async_path
real = async_path.write_text
async def write_text(path, text):
    if path.name == "commit_success.txt" and "/checkpoints/2" in str(path):
        os.kill(os.getpid(), signal.SIGKILL)
    return await real(path, text)
async_path.write_text = write_text
from ais_jax.run import cli
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.fixture
def disk_emulator(gcs_emulator, tmp_path, monkeypatch):
    """A private emulator keeping its objects in a folder, so that it can be killed and
    started again on them: ``(procs, start, url)``, ``start()`` starting it again on the
    same port (its process appended to ``procs``)."""
    import gcsfs
    from _gcs import ENV, free_port, start_emulator

    for k in ENV:  # restored to the session emulator's afterwards
        monkeypatch.setenv(k, os.environ[k])
    port, data, procs = free_port(), str(tmp_path / "bucket-data"), []

    def start():
        gcsfs.GCSFileSystem.clear_instance_cache()
        procs.append(start_emulator(port, data)[0])

    start()
    yield procs, start, f"http://127.0.0.1:{port}"
    for p in procs:
        p.kill()
        p.wait()
    gcsfs.GCSFileSystem.clear_instance_cache()


# Three tiny runs, one in a child process: ~27-33 s on 2 shared cores (the test it replaced,
# two runs to a stop and a resume, 32 s; the bucket run's test beside it, ~20 s)
@pytest.mark.slow
def test_bucket_run_killed_then_cut_off_resumes_equal_to_the_local_run(
    disk_emulator, tmp_path, monkeypatch, capsys, tiny_run
):
    import asyncio
    import signal
    import subprocess
    import sys

    import gcsfs
    from _gcs import make_bucket
    from _tiny import child_env

    from ais_jax.run import checkpoint as ckpt

    procs, start, url = disk_emulator
    monkeypatch.chdir(tmp_path)
    run = make_bucket(url, "ais-killed") + "/run"
    argv = [f"out_dir={run}", *TINY_RUN, *TINY_3_STEPS]
    # 1. kill -9 during the save of step 2: the step uploaded but for its commit marker
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_AT_COMMIT, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert storage.files(f"{run}/checkpoints/2")  # the partial save is in the bucket
    assert not storage.exists(f"{run}/checkpoints/2/commit_success.txt")
    # 2. resumed from step 1 (the partial step 2 is never taken as complete); the endpoint
    # is killed once checkpoint 2 is in the bucket: the next upload (step 3's metrics, before
    # its checkpoint) retries with backoff, then the run stops with one line naming the
    # object, exit 2
    real_save, real_sleep, delays = ckpt.save, asyncio.sleep, []

    def save_then_cut_off(manager, step, *a, **k):
        saved = real_save(manager, step, *a, **k)
        if step == 2:
            procs[-1].kill()
            procs[-1].wait()
        return saved

    async def recorded(delay, *a, **k):  # gcsfs's backoff between its retries, not waited
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(ckpt, "save", save_then_cut_off)
    monkeypatch.setattr(gcsfs.retry.asyncio, "sleep", recorded)
    capsys.readouterr()
    assert train.main(argv) == 2
    out, err = capsys.readouterr()
    assert "resumed from step 1" in out
    stale, err = err.strip().splitlines()  # the killed run's lock: taken over, one warning
    assert stale.startswith("warning: took over the stale lock of run "), stale
    assert err.startswith(f"error: {run}/metrics.jsonl: "), err
    assert "does not answer" in err and "rerun the same command to resume" in err
    assert len(delays) >= 5 and delays[:5] == sorted(delays[:5]), delays  # backing off
    # 3. the endpoint back (the same objects): the same command resumes from checkpoint 2
    monkeypatch.setattr(ckpt, "save", real_save)
    start()
    # The lock stayed (the endpoint was gone), naming this process: as the CLI's process had
    # exited, the rerun takes it over (the stale-lock rule)
    lock = json.loads(storage.read_text(f"{run}/run.lock"))
    assert lock["pid"] == os.getpid()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    storage.write_text(f"{run}/run.lock", json.dumps({**lock, "pid": dead.pid}))
    assert train.main(argv) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert "resumed from step 2" in out and "took over the stale lock" in err
    _assert_same(_metrics(tiny_run[0]), _metrics(run))
    assert json.loads(storage.read_text(f"{run}/summary.json"))["step"] == 3
    assert "model.safetensors" in storage.files(f"{run}/final")
    assert os.listdir(tmp_path) == ["bucket-data"]  # the emulator's; no folder named "gs:"


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
