"""Nothing reported done that is not: stale results, full disks, corrupt checkpoints, results
without a checkpoint, and the phases a signal can hit (`ais_jax.run.results`,
`ais_jax.run.integrity`, `ais_jax.run.signals`).

Tiny runs in-process through `train.main` (the CLI's exit status and stderr), except where a
real signal or a real full disk is needed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from _tiny import TINY_RUN, copy_run

from ais_jax.core.errors import StorageError, storage_error
from ais_jax.run import cli as train
from ais_jax.run import results, runguard, signals

TINY = [*TINY_RUN, "train.learning_rate=0.003"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _main(out, *extra, capsys=None, argv=()):
    code = train.main([*argv, f"out_dir={out}", *TINY, *extra])
    cap = capsys.readouterr() if capsys is not None else None
    return code, cap


def _summary(out):
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def _one_error_line(cap):
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), cap.err
    return lines[0]


# ------------------------------------------------------------------ 1. stale results


@pytest.mark.slow  # ~15 s in the full suite on 2 busy cores
def test_rerun_finishes_an_export_that_failed_instead_of_reporting_old_results(
        tmp_path, capsys, monkeypatch, tiny_run):
    """Finding 1: a run extended to step 4 whose final export failed (checkpoint 4 saved,
    summary of step 3) is finished by the rerun, not reported as done."""
    base = ("checkpoint.every=1",)
    tmp_path = copy_run(tiny_run[0], tmp_path / "run")  # 3 steps, checkpoint.every=1
    assert _summary(tmp_path)["step"] == 3
    with open(os.path.join(tmp_path, "final", "model.safetensors"), "rb") as f:
        final_3 = f.read()

    from ais_jax.models import pretrained

    real = pretrained.save_pretrained

    def half_then_full_disk(params, cfg, directory):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "model.safetensors"), "wb") as f:
            f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", directory)

    monkeypatch.setattr(pretrained, "save_pretrained", half_then_full_disk)
    code, cap = _main(tmp_path, *base, "train.steps=4", capsys=capsys)
    assert code == 2 and "No space left on device" in _one_error_line(cap)
    # The half export never replaced the complete one; the summary still says step 3.
    with open(os.path.join(tmp_path, "final", "model.safetensors"), "rb") as f:
        assert f.read() == final_3
    assert _summary(tmp_path)["step"] == 3
    monkeypatch.setattr(pretrained, "save_pretrained", real)
    code, cap = _main(tmp_path, *base, "train.steps=4", capsys=capsys)
    assert code == 0, cap.err
    assert "already holds" not in cap.out and "resumed from step 4" in cap.out
    assert _summary(tmp_path)["step"] == 4
    assert not os.path.exists(os.path.join(tmp_path, "final.tmp"))
    assert os.path.exists(os.path.join(tmp_path, "final", "config.json"))
    # Now it is done: the next rerun keeps the results.
    code, cap = _main(tmp_path, *base, "train.steps=4", capsys=capsys)
    assert code == 0 and "already holds the results of step 4" in cap.out


def test_finished_reads_the_step_of_the_results(tmp_path):
    assert not results.finished(str(tmp_path), 1)
    os.makedirs(tmp_path / "final")
    results.write_json_atomic(str(tmp_path / "summary.json"), {"step": 2, "x": float("inf")})
    assert results.finished(str(tmp_path), 2) and not results.finished(str(tmp_path), 3)
    assert _summary(tmp_path)["x"] is None  # valid JSON: no Infinity
    (tmp_path / "summary.json").write_text('{"steps": 2}')  # a summary of an older version
    assert results.finished(str(tmp_path), 2) and not results.finished(str(tmp_path), 3)


# ------------------------------------------------------------------ 2. storage errors


def test_orbax_resource_exhausted_is_one_line(tmp_path, capsys, monkeypatch):
    """Finding 2 by injection: orbax raises ValueError('RESOURCE_EXHAUSTED ... No space left
    on device') while saving; the CLI prints one line naming the checkpoint and exits 2."""
    import orbax.checkpoint as ocp

    def full(self, step, *a, **k):
        raise ValueError("RESOURCE_EXHAUSTED: Error writing local file \"x/_sharding\": "
                         "Failed to write 11606 bytes to file 4: No space left on device "
                         "[os_error_code='28']")

    monkeypatch.setattr(ocp.CheckpointManager, "save", full)
    code, cap = _main(tmp_path, "train.steps=2", "checkpoint.every=1", capsys=capsys)
    line = _one_error_line(cap)
    assert code == 2 and "checkpoints/0: No space left on device" in line
    assert "rerun the same command" in line


@pytest.mark.parametrize("make,needle", [
    (lambda d: OSError(errno.ENAMETOOLONG, "File name too long", str(d)), "shorter out_dir"),
    (lambda d: OSError(errno.ENOTDIR, "Not a directory", str(d)), "is a file"),
    (lambda d: IsADirectoryError(errno.EISDIR, "Is a directory", str(d)), "move it away"),
    (lambda d: ValueError("DATA_LOSS: Read-only file system"), "writable out_dir"),
])
def test_storage_error_names_the_path_and_the_fix(tmp_path, make, needle):
    se = storage_error(make(tmp_path), str(tmp_path))
    assert isinstance(se, StorageError) and needle in str(se) and str(tmp_path) in str(se)
    assert "\n" not in str(se)
    chained = RuntimeError("outer")
    chained.__cause__ = make(tmp_path)
    assert storage_error(chained) is not None
    assert storage_error(KeyError("x")) is None


@pytest.mark.parametrize("kind", ["long name", "under a file", "metrics is a dir"])
def test_os_errors_of_the_out_dir_are_one_line(tmp_path, capsys, kind):
    """Finding 15: ENAMETOOLONG, ENOTDIR and EISDIR give one line and exit 2."""
    if kind == "long name":
        out = tmp_path / ("x" * 300)
    elif kind == "under a file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "run"
    else:
        out = tmp_path / "run"
        os.makedirs(out / "metrics.jsonl")
    code, cap = _main(out, "train.steps=1", capsys=capsys)
    line = _one_error_line(cap)
    assert code == 2
    assert {"long name": "File name too long", "under a file": "Not a directory",
            "metrics is a dir": "Is a directory"}[kind] in line


def _mount_tmpfs(path, size):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    os.makedirs(path, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


_FILL_DISK = """
import os
def fn(completions, prompts, rows):
    # Fills the tmpfs during RL step {at} (once): the next write of the run finds it full.
    calls = os.path.join({state!r}, "calls")
    n = int(open(calls).read()) + 1 if os.path.exists(calls) else 1
    open(calls, "w").write(str(n))
    if n == {at} and not os.path.exists(os.path.join({state!r}, "filled")):
        open(os.path.join({state!r}, "filled"), "w").close()
        st = os.statvfs({mnt!r})
        with open(os.path.join({mnt!r}, "filler"), "wb") as f:
            f.write(b"x" * (st.f_bavail * st.f_frsize))
    return [0.0] * len(completions)
fn.batched = True
"""


@pytest.mark.slow  # four CLI processes (~15 s each): the real disk, not an injection
@pytest.mark.parametrize("every,where", [(1, "checkpoints/2"), (0, "final.tmp")])
def test_real_full_disk_is_one_line_and_the_rerun_resumes(tmp_path, every, where):
    """Finding 2 on a real 4 MB tmpfs: a reward function fills it during RL step 2, so the
    checkpoint of step 2 (``checkpoint.every=1``) or the final export (``every=0``) meets a
    full disk: one line, exit 2. After freeing the space, the same command resumes and
    finishes."""
    mnt, state = tmp_path / "tmpfs", tmp_path / "state"
    os.makedirs(state)
    _mount_tmpfs(mnt, "4M")
    try:
        (tmp_path / "fill.py").write_text(_FILL_DISK.format(at=2, state=str(state),
                                                            mnt=str(mnt)))
        cmd = [sys.executable, "-m", "ais_jax.train", f"out_dir={mnt / 'run'}", *TINY,
               "train.steps=3", f"checkpoint.every={every}",
               f"reward.functions={{fill: {tmp_path / 'fill.py'}:fn}}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert len(lines) == 1 and "No space left on device" in lines[0], proc.stderr[-3000:]
        assert where in lines[0]
        os.remove(mnt / "filler")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "resumed from step" in proc.stdout
        assert _summary(mnt / "run")["step"] == 3
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# ------------------------------------------------------------------ 3. checkpoint integrity


def _xor_data_files(step_dir, nbytes=64):
    for d, _, files in os.walk(os.path.join(step_dir, "state")):
        for f in files:
            p = os.path.join(d, f)
            if os.path.getsize(p) > nbytes and "ocdbt" in p:
                with open(p, "r+b") as fh:
                    data = bytearray(fh.read(nbytes))
                    fh.seek(0)
                    fh.write(bytes(b ^ 0x5A for b in data))


def test_corrupt_bytes_fall_back_and_the_good_checkpoint_is_kept(tmp_path, capsys, tiny_run):
    """Finding 3: XOR 64 bytes in each data file of the latest checkpoint; the rerun detects it
    (checksums), resumes from the previous one, trains finite steps, and checkpoint.keep=2
    never deletes the checkpoint it restored."""
    base = ("checkpoint.every=1", "checkpoint.keep=2")
    tmp_path = copy_run(tiny_run[0], tmp_path / "run")  # 3 steps, checkpoints 1, 2 and 3
    ckpts = os.path.join(tmp_path, "checkpoints")
    _xor_data_files(os.path.join(ckpts, "3"))
    code, cap = _main(tmp_path, *base, "train.steps=5", capsys=capsys)
    assert code == 0, cap.err
    assert "checkpoint step 3" in cap.err and "damaged" in cap.err
    assert "resuming from step 2" in cap.err
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["loss"] is not None and r["skipped"] == 0 for r in rows)
    kept = sorted(int(s) for s in os.listdir(ckpts) if s.isdigit())
    assert 2 in kept and kept[-2:] == [4, 5], kept  # the restored step survives keep=2


def test_restore_refuses_non_finite_state(tmp_path):
    import jax.numpy as jnp

    from ais_jax.core.errors import CheckpointError
    from ais_jax.run import checkpoint as ckpt
    from ais_jax.run import integrity

    m = ckpt.open_manager(tmp_path, keep=3)
    ckpt.save(m, 0, {"w": jnp.array([1.0, jnp.nan])})
    os.remove(os.path.join(tmp_path, "checkpoints", "0", integrity.CHECKSUMS))
    with pytest.raises(CheckpointError, match=r"non-finite values \(in \['w'\]\)"):
        ckpt.restore(m, 0, {"w": jnp.zeros(2)})
    ckpt.save(m, 1, {"w": jnp.ones(2)})
    ckpt.save(m, 2, {"w": jnp.ones(2)})
    assert integrity.prune(m, 1, protect=1) == [0]
    assert ckpt.all_steps(m) == [1, 2]
    ckpt.close(m)


# ------------------------------------------------------------------ 5. results, no checkpoint


def test_results_without_checkpoint_need_overwrite(tmp_path, capsys, tiny_run):
    """Finding 5: checkpoints/ deleted, rerun with another config: refused, naming what is
    there; --overwrite starts over."""
    tmp_path = copy_run(tiny_run[0], tmp_path / "run")  # a finished 3-step run
    shutil.rmtree(os.path.join(tmp_path, "checkpoints"))
    code, cap = _main(tmp_path, "train.steps=1", "seed=5", capsys=capsys)
    line = _one_error_line(cap)
    assert code == 2 and "summary.json, final, metrics.jsonl" in line and "--overwrite" in line
    code, cap = _main(tmp_path, "train.steps=1", "seed=5", capsys=capsys,
                      argv=("--overwrite",))
    assert code == 0, cap.err


# ------------------------------------------------------------------ 6, 14. user code


def _reward_file(tmp_path, body):
    p = tmp_path / "rw.py"
    p.write_text(body)
    return f"reward.functions={{r: {p}:fn}}"


@pytest.mark.parametrize("body,extra,needle", [
    ("import time\ndef fn(c, p, row):\n    time.sleep(3600)\n", ["reward.timeout_s=1"],
     "reward function r did not return within reward.timeout_s=1 s"),
    ("import sys\ndef fn(c, p, row):\n    sys.exit(0)\n", [], "reward function r raised "
     "SystemExit"),
    ("import sys\nsys.exit(3)\ndef fn(c, p, row):\n    return 0.0\n", [],
     "raised SystemExit"),
    ("def fn(c, p, row):\n    raise KeyboardInterrupt\n", [], "raised KeyboardInterrupt"),
    ("def fn(c, p, row):\n    return 1e308\n", [], "beyond float32"),
    ("def fn(c, p, row):\n    return 10**400\n", [], "beyond float32"),
    ("class X:\n    def __float__(self):\n        raise RuntimeError('no')\n"
     "def fn(c, p, row):\n    return X()\n", [], "expected a float"),
])
def test_user_reward_code_is_bounded_and_reported(tmp_path, capsys, body, extra, needle):
    """Findings 6, 12, 14: a reward function that hangs, exits, or returns a value beyond
    float32 is the function's error: one line naming it, exit 2."""
    t0 = time.monotonic()
    code, cap = _main(tmp_path / "run", "train.steps=1", _reward_file(tmp_path, body), *extra,
                      capsys=capsys)
    assert code == 2 and needle in _one_error_line(cap)
    assert time.monotonic() - t0 < 300


@pytest.mark.slow  # ~7 s in the full suite on 2 busy cores
def test_slow_reward_prints_progress(tmp_path, capsys, monkeypatch):
    from ais_jax.tasks import user_rewards

    monkeypatch.setattr(user_rewards, "PROGRESS_EVERY_S", 0.2)
    calls = []

    def slow_batch(cs, ps, rows):
        calls.append(1)
        time.sleep(0.5)
        return [0.0] * len(cs)

    slow_batch.batched = True
    fns = {"slow": slow_batch}
    from ais_jax.config.load import load_config
    from ais_jax.run.loop import run

    run(load_config(None, [f"out_dir={tmp_path}", *TINY, "train.steps=1"]), reward_fns=fns)
    err = capsys.readouterr().err
    assert calls and "reward function slow still running after" in err


def test_metrics_are_valid_json_with_non_finite_values(tmp_path):
    """Finding 12 (the file side): an infinite metric is written as null and read back."""
    path = str(tmp_path / "metrics.jsonl")
    runguard.append_record(path, {"step": 1, "reward_mean": float("inf"), "x": [float("nan")]})
    with open(path) as f:
        assert json.loads(f.read(), parse_constant=lambda c: pytest.fail(c)) == {
            "step": 1, "reward_mean": None, "x": [None]}
    assert runguard.truncate_metrics(path, 1)[0]["reward_mean"] is None


# ------------------------------------------------------------------ 9. trackers open first


def test_tracker_failure_comes_before_the_warm_start(tmp_path, capsys, monkeypatch):
    """Finding 9: a tracker that cannot start (wandb online without a login) fails before the
    warm start, in one line."""
    from ais_jax.run import trackers

    def no_login(self, wandb, cfg, config):
        raise RuntimeError("api_key not configured (no-tty). call wandb.login(key=[key])")

    monkeypatch.setattr(trackers.Trackers, "_wandb_init", no_login)
    code, cap = _main(tmp_path, "train.steps=1", "sft.steps=200", "log.backends=jsonl,wandb",
                      capsys=capsys)
    line = _one_error_line(cap)
    assert code == 2 and "log.backends: wandb could not start" in line and "api_key" in line
    assert not os.path.exists(os.path.join(tmp_path, "warm_start.json"))


# ------------------------------------------------------------------ 5b, 13. signals


def test_first_and_second_signal_each_print_one_line(capsys):
    stop = signals.StopFlag()
    stop.phase = "warm start"
    with stop.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.signum == signal.SIGTERM
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "received SIGTERM: the warm start stops" in err
        with pytest.raises(SystemExit) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
        assert info.value.code == 143
        assert "received SIGTERM again: stopping at once" in capsys.readouterr().err


@pytest.mark.slow  # one CLI process with a long warm start, stopped by a real SIGTERM (~20 s)
def test_sigterm_during_the_warm_start_stops_cleanly(tmp_path):
    """Finding 13: SIGTERM in the warm start: one line when it arrives, one when it stops,
    exit 143, the lock released, nothing that looks like results."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "ais_jax.train", f"out_dir={out}", *TINY, "sft.steps=100000",
           "sft.target_accuracy=0", "sft.max_steps=0", "train.steps=1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while not os.path.exists(out / runguard.LOCK_NAME) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(8)  # the build compiles; then the warm start runs
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert proc.returncode == 143, stderr[-3000:]
    assert lines[0].startswith("received SIGTERM"), stderr
    assert lines[-1].startswith("stopped by SIGTERM") and "rerun the same command" in lines[-1]
    assert len(lines) == 2, stderr
    assert not os.path.exists(out / runguard.LOCK_NAME)
    assert not os.path.exists(out / "summary.json")
