"""Runs whose out_dir is a bucket (issue 56), against the GCS emulator: the same per-step
metrics as on disk after a SIGKILL mid-save, a SIGTERM and the endpoint's loss, each
resumed from the bucket; the lock; the errors in one line; a 2-process bucket run."""

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


# A bucket run killed, stopped, cut off and finished (items 3 and 6 of issue 56): a child run
# to step 2, two resumed runs of one step each, an export-only rerun, a finished one's check
# and the mismatch CLI on the export: 44 s on 2 shared cores, where the test it replaced (a
# plain bucket run, then a stop by train.steps and its resume) took 30 s in the same session.
@pytest.mark.slow
def test_bucket_run_killed_stopped_and_cut_off_resumes_equal_to_the_local_run(
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
    # 2. resumed from step 1 (the partial step 2 is never taken as complete), SIGTERMed
    # during step 2: it finishes the step, checkpoints it, and stops with status 143
    real_save, real_sleep, delays = ckpt.save, asyncio.sleep, []

    real_append = storage.append_lines

    def append_then(path, lines):
        if path.endswith("metrics.jsonl") and '"step": 2,' in lines[0]:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives as step 2 is logged
        return real_append(path, lines)

    def save_then(manager, step, *a, **k):
        saved = real_save(manager, step, *a, **k)
        if step == 3:  # 3. the endpoint gone once checkpoint 3 is in the bucket
            procs[-1].kill()
            procs[-1].wait()
        return saved

    monkeypatch.setattr(ckpt, "save", save_then)
    monkeypatch.setattr(storage, "append_lines", append_then)
    capsys.readouterr()
    assert train.main([*argv, "train.steps=3"]) == 128 + signal.SIGTERM
    out, err = capsys.readouterr()
    assert "resumed from step 1" in out and "stopped by SIGTERM after step 2" in err
    assert "took over the stale lock of run " in err  # the killed run's
    monkeypatch.setattr(storage, "append_lines", real_append)
    # 3. resumed from step 2; the endpoint killed after checkpoint 3: the export's upload
    # retries with backoff, then the run stops with one line naming the object, exit 2

    async def recorded(delay, *a, **k):  # gcsfs's backoff between its retries, not waited
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(gcsfs.retry.asyncio, "sleep", recorded)
    assert train.main(argv) == 2
    out, err = capsys.readouterr()
    assert "resumed from step 2" in out
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {run}/summary.json: "), err
    assert "does not answer" in err and "rerun the same command to resume" in err
    assert len(delays) >= 5 and delays[:5] == sorted(delays[:5]), delays  # backing off
    # 4. the endpoint back (the same objects): the same command finishes from checkpoint 3
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
    assert "resumed from step 3" in out and "took over the stale lock" in err
    want = _metrics(tiny_run[0])  # the same config on a local disk, uninterrupted
    assert len(want) == 3
    _assert_same(want, _metrics(run))
    assert json.loads(storage.read_text(f"{run}/summary.json"))["step"] == 3
    assert "model.safetensors" in storage.files(f"{run}/final")
    assert not storage.exists(f"{run}/run.lock")
    assert train.main(argv) == 0  # done: kept
    assert "already holds the results of step 3" in capsys.readouterr().out
    # the bucket's export reads back: python -m ais_jax.mismatch --model gs://.../final
    from ais_jax.run import mismatch

    args = ["--num-prompts", "1", "--samples", "2", "--max-new-tokens", "4"]
    assert mismatch.main(["--model", f"{run}/final", *args]) == 0
    assert f"model {run}/final: 1 prompts x 2 samples" in capsys.readouterr().out
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
