"""`ais_jax.core.storage` and the run's bucket pieces against the in-memory GCS emulator
(issue 56): objects, the run lock, checkpoint integrity, the one-line errors.  No training:
each test takes well under a second after the emulator's start."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from ais_jax.config.load import load_config
from ais_jax.core import storage
from ais_jax.core.errors import CheckpointError, StorageError, UsageError
from ais_jax.run import checkpoint as ckpt
from ais_jax.run import integrity, results, runguard

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_objects_read_write_list_and_ranges(gcs_bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = f"{gcs_bucket}/run"
    results.make_out_dir(run)
    assert storage.join(run, "a", "b.txt") == f"{run}/a/b.txt"
    assert storage.join(str(tmp_path), "a") == os.path.join(str(tmp_path), "a")
    storage.write_text(f"{run}/a/b.txt", "hello")
    assert storage.read_text(f"{run}/a/b.txt") == "hello"
    assert storage.read_bytes(f"{run}/a/b.txt", 1, 3) == b"el"  # a ranged read
    assert storage.size(f"{run}/a/b.txt") == 5
    assert storage.files(run) == ["a/b.txt"] and storage.isdir(f"{run}/a")
    storage.move(f"{run}/a", f"{run}/c")
    assert storage.files(run) == ["c/b.txt"]
    with pytest.raises(FileNotFoundError):
        storage.read_text(f"{run}/missing")
    # appends stay in memory until flushed as one whole object
    storage.append_lines(f"{run}/m.jsonl", ["1\n"])
    storage.append_lines(f"{run}/m.jsonl", ["2\n"])
    assert not storage.exists(f"{run}/m.jsonl")
    storage.flush_appends()
    assert storage.read_text(f"{run}/m.jsonl") == "1\n2\n"
    storage.forget_appends()
    # create-if-absent: GCS's ifGenerationMatch=0 precondition (the run lock's)
    assert storage.write_text(f"{run}/lock", "one", create_only=True)
    assert not storage.write_text(f"{run}/lock", "two", create_only=True)
    assert storage.read_text(f"{run}/lock") == "one"
    assert os.listdir(tmp_path) == []  # nothing local, no folder named "gs:"


def test_metrics_truncated_on_resume_in_a_bucket(gcs_bucket):
    path = f"{gcs_bucket}/run/metrics.jsonl"
    storage.write_text(
        path, "".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4'
    )  # a torn last line
    kept = runguard.truncate_metrics(path, 2)
    assert [r["step"] for r in kept] == [1, 2]
    runguard.append_record(path, {"step": 3, "x": float("nan")})
    storage.flush_appends()
    storage.forget_appends()
    assert storage.read_text(path) == '{"step": 1}\n{"step": 2}\n{"step": 3, "x": null}\n'


def test_lock_in_a_bucket_is_exclusive_and_stale_rule_as_on_disk(gcs_bucket, capsys):
    run = f"{gcs_bucket}/run"
    with runguard.RunLock(run), pytest.raises(UsageError, match="in use by run") as e:
        runguard.RunLock(run).acquire()
    assert len(str(e.value).splitlines()) == 1 and f"lock {run}/run.lock" in str(e.value)
    assert not storage.exists(f"{run}/run.lock")  # released
    lock = {
        "pid": _dead_pid(),
        "host": socket.gethostname(),
        "since": "2026-01-01T00:00:00",
        "start": None,
    }
    storage.write_text(f"{run}/run.lock", json.dumps(lock))
    with runguard.RunLock(run):
        assert "took over the stale lock" in capsys.readouterr().err
    storage.write_text(f"{run}/run.lock", json.dumps({**lock, "host": "other-host"}))
    with pytest.raises(UsageError, match="@other-host"):
        runguard.RunLock(run).acquire()  # another host's lock is never taken over


def test_second_run_on_one_bucket_out_dir_exits_2(gcs_bucket, tmp_path, monkeypatch, capsys):
    from _tiny import TINY_RUN

    from ais_jax.run import cli

    monkeypatch.chdir(tmp_path)
    run = f"{gcs_bucket}/run"
    with runguard.RunLock(run):  # a live run holds it
        assert cli.main([f"out_dir={run}", *TINY_RUN, "train.steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is in use by run" in err, err
    assert storage.files(run) == []  # nothing written, the lock released
    assert os.listdir(tmp_path) == []


def _tree(x):
    return {"w": jnp.full((4,), x, jnp.float32), "b": jnp.arange(3, dtype=jnp.bfloat16)}


def test_checkpoints_in_a_bucket_verified_and_partial_saves_not_listed(gcs_bucket):
    run = f"{gcs_bucket}/run"
    m = ckpt.open_manager(run, keep=3)
    assert ckpt.save(m, 1, _tree(1.0), {"a": 1}) and ckpt.save(m, 2, _tree(2.0))
    step2 = f"{run}/checkpoints/2"
    assert integrity.CHECKSUMS in storage.files(step2)
    assert ckpt.read_metadata(m, 1) == {"a": 1}
    got = ckpt.restore(m, 2, _tree(0.0))
    np.testing.assert_array_equal(np.asarray(got["w"]), np.full(4, 2.0, np.float32))
    # a changed object fails its checksum; the run then falls back to step 1
    victim = next(f for f in storage.files(step2) if "/d/" in f)
    data = bytearray(storage.read_bytes(f"{step2}/{victim}"))
    data[-1] ^= 0xFF
    storage.write_bytes(f"{step2}/{victim}", bytes(data))
    with pytest.raises(CheckpointError, match=f"the bytes of {victim} differ"):
        integrity.verify_checksums(step2)
    # an upload cut short (no commit marker yet) is never listed as a checkpoint
    storage.remove(f"{step2}/commit_success.txt")
    assert ckpt.all_steps(m) == [1]
    ckpt.close(m)


def test_missing_bucket_and_missing_extra_are_one_line(gcs_emulator, tmp_path, monkeypatch, capsys):
    from _tiny import TINY_RUN

    from ais_jax.run import cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError, match="bucket no-such-bucket-56 does not exist"):
        results.make_out_dir("gs://no-such-bucket-56/run")
    assert cli.main(["out_dir=gs://no-such-bucket-56/run", *TINY_RUN, "train.steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err, err
    with pytest.raises(UsageError, match="not a valid bucket name"):
        storage.check_served("gs://B/run")
    real = storage.importlib.util.find_spec
    monkeypatch.setattr(
        storage.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gcsfs" else real(name, *a),
    )
    with pytest.raises(UsageError, match=r"pip install 'ais_jax\[gcs\]'"):
        load_config(None, ["out_dir=gs://bucket/run"])
    assert os.listdir(tmp_path) == []


def test_plots_read_a_bucket_run(gcs_bucket, tmp_path, monkeypatch, capsys):
    from ais_jax.run import plots

    monkeypatch.chdir(tmp_path)
    rows = [{"step": s, "reward_mean": 0.1 * s, "alpha": 1.0} for s in (1, 2, 3)]
    storage.write_text(
        f"{gcs_bucket}/run/metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows)
    )
    series = plots.read_metrics(f"{gcs_bucket}/run/metrics.jsonl")
    np.testing.assert_allclose(series["reward_mean"][1], [0.1, 0.2, 0.3])
    assert plots.main([f"{gcs_bucket}/run"]) == 0
    assert os.path.isfile(tmp_path / "plots" / "run" / "reward.png")  # local PNGs
    assert plots.main([f"{gcs_bucket}/nothing"]) == 2
    assert "not found" in capsys.readouterr().err


def test_endpoint_gone_is_one_line_naming_the_object(gcs_emulator, monkeypatch):
    import asyncio

    import gcsfs
    from _gcs import make_bucket, start_emulator

    real_sleep = asyncio.sleep

    async def no_wait(delay, *a, **k):  # gcsfs's backoff between its retries, skipped
        await real_sleep(0)

    monkeypatch.setattr(gcsfs.retry.asyncio, "sleep", no_wait)
    for k in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
        monkeypatch.setenv(k, os.environ[k])  # restored after the private emulator
    gcsfs.GCSFileSystem.clear_instance_cache()
    proc, url = start_emulator()
    try:
        run = make_bucket(url, "ais-gone") + "/run"
        storage.write_text(f"{run}/summary.json", "{}")
        proc.kill()
        proc.wait()
        with pytest.raises(StorageError) as e:
            storage.write_text(f"{run}/metrics.jsonl", "{}\n")
        line = str(e.value)
        assert len(line.splitlines()) == 1 and line.startswith(f"{run}/metrics.jsonl: ")
        assert "does not answer" in line
    finally:
        proc.kill()
        gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.mark.slow  # a run refused twice and two refused saves (~5 s on 2 shared cores)
def test_denied_and_no_credentials_end_to_end_one_line_checkpoint_kept(
    gcs_emulator, gcs_bucket, tmp_path, monkeypatch, capsys
):
    from _gcs import refuse
    from _tiny import TINY_RUN

    from ais_jax.run import cli

    monkeypatch.chdir(tmp_path)
    run = f"{gcs_bucket}/run"
    m = ckpt.open_manager(run, keep=3)
    assert ckpt.save(m, 1, _tree(1.0))
    ckpt.close(m)
    argv = [f"out_dir={run}", *TINY_RUN, "train.steps=1"]
    says = {403: "permission denied; grant", 401: "no usable credentials; run `gcloud auth"}
    try:
        for code, text in says.items():  # the bucket refuses as GCS does (tests/_gcs_server.py)
            refuse(gcs_emulator, gcs_bucket, code)
            assert cli.main(argv) == 2  # refused before any work
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and err.startswith(f"error: {run}: "), err
            assert text in err, err
            refuse(gcs_emulator, gcs_bucket, code, writes_only=True)  # revoked mid-run
            m = ckpt.open_manager(run, keep=3)
            with pytest.raises(StorageError) as e, ckpt.closed_on_error(m):  # as a run does
                ckpt.save(m, 2, _tree(2.0))
            assert len(str(e.value).splitlines()) == 1, str(e.value)
            assert str(e.value).startswith(f"{run}/checkpoints/2: ") and text in str(e.value)
    finally:
        refuse(gcs_emulator, gcs_bucket, None)
    m = ckpt.open_manager(run, keep=3)
    assert ckpt.all_steps(m) == [1]  # the last good checkpoint: intact, restorable
    integrity.verify_checksums(f"{run}/checkpoints/1")
    got = ckpt.restore(m, 1, _tree(0.0))
    np.testing.assert_array_equal(np.asarray(got["w"]), np.full(4, 1.0, np.float32))
    ckpt.close(m)
    assert os.listdir(tmp_path) == []


# The CLI, its run replaced by two checkpoint saves into a bucket; the endpoint is killed as
# the second starts (orbax's TensorStore writes in flight, retrying with their own backoff).
_CUT_OFF_MID_SAVE = """
import asyncio, os, signal, sys
import gcsfs, jax.numpy as jnp, orbax.checkpoint as ocp
from ais_jax.run import checkpoint as ckpt, cli
real_sleep, real_save = asyncio.sleep, ocp.CheckpointManager.save
async def no_wait(delay, *a, **k):  # gcsfs's backoff, not waited (its tries are made)
    await real_sleep(0)
gcsfs.retry.asyncio.sleep = no_wait
def save(self, step, *a, **k):
    if step == 2:
        os.kill(int(os.environ["EMULATOR_PID"]), signal.SIGKILL)
    return real_save(self, step, *a, **k)
ocp.CheckpointManager.save = save
def run(cfg, overwrite=False):
    m = ckpt.open_manager(cfg.out_dir, keep=3)
    for step in (1, 2):
        ckpt.save(m, step, {"w": jnp.full((4,), float(step))})
cli.run = run
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow  # a child process: ~6 s on 2 cores (without the exit: minutes)
def test_endpoint_gone_mid_save_ends_the_cli_with_one_line(gcs_emulator, tmp_path, monkeypatch):
    from _gcs import make_bucket, start_emulator
    from _tiny import child_env

    for k in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
        monkeypatch.setenv(k, os.environ[k])  # restored after the private emulator
    proc, url = start_emulator()
    try:
        run = make_bucket(url, "ais-cut") + "/run"
        child = subprocess.run(
            [sys.executable, "-c", _CUT_OFF_MID_SAVE, f"out_dir={run}"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**child_env(), "EMULATOR_PID": str(proc.pid)},
            cwd=tmp_path,
        )
    finally:
        proc.kill()
        proc.wait()
    assert child.returncode == 2, child.stderr[-3000:]
    err = [line for line in child.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and err[0].startswith(f"error: {run}/checkpoints"), child.stderr[-3000:]
    assert "does not answer" in err[0]
    assert os.listdir(tmp_path) == []


def test_bucket_sources_pass_the_config_checks_other_schemes_do_not(gcs_emulator):
    cfg = load_config(None, ["model.source=gs://bucket/Qwen3-0.6B", "out_dir=gs://bucket/run"])
    assert cfg.model.source == "gs://bucket/Qwen3-0.6B"  # no local existence check
    with pytest.raises(UsageError, match=r"model.source s3://b/m: the scheme s3:// is not served"):
        load_config(None, ["model.source=s3://b/m"])


@pytest.mark.parametrize(
    "error, says",
    [
        (OSError("Forbidden: ais/run/x\nno access"), "permission denied"),
        (RuntimeError("401 Unauthorized: invalid credentials"), "no usable credentials"),
        (TimeoutError("timed out"), "does not answer"),
        # a port or size holding 403 / 401 is no HTTP status (the emulator's random port
        # 40317 once made a lost endpoint read as "permission denied")
        (OSError("Cannot connect to host 127.0.0.1:40317 ssl:default [Connect call failed]"),
         "does not answer"),
        (OSError("Cannot connect to host 127.0.0.1:34011 [Connection refused]"), "does not answer"),
        (OSError("HTTP 403: ais/run/x"), "permission denied"),
        (OSError("Timeout after 4013 bytes"), "does not answer"),
    ],
)
def test_store_failures_are_one_line_with_their_fix(error, says):
    e = storage.remote_error(error, "gs://b/run/x")
    assert len(str(e).splitlines()) == 1 and says in str(e)
    assert str(e).startswith("gs://b/run/x: ")
    wrapped = RuntimeError("orbax failed")
    wrapped.__cause__ = error if isinstance(error, OSError) else OSError(str(error))
    assert storage.remote_failure(wrapped, "gs://b/run") is not None
    assert storage.remote_failure(ValueError("a bug"), "gs://b/run") is None
    assert storage.remote_failure(wrapped, "runs/local") is None


def test_profile_trace_of_a_bucket_run_stays_local():
    import dataclasses

    from ais_jax.run import runtime

    cfg = load_config(None, ["out_dir=gs://bucket/runs/r1"])
    assert runtime.with_profile_flag(cfg).runtime.profile_dir == os.path.join("profile", "r1")
    rt = dataclasses.replace(cfg.runtime, profile_dir="gs://bucket/prof")
    with pytest.raises(UsageError, match="profiler writes local files"):
        runtime.check_profile_dir(rt)
