"""Runs that survive real life (`ais_jax.run.runguard`): the out_dir lock, the config stored
with checkpoints, checkpoint fallback, a crash-proof metrics.jsonl and SIGTERM / SIGINT.

Tiny runs (the TINY overrides of test_train.py), in-process through `train.main`
except the signal test, which needs a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from _tiny import TINY_RUN, copy_run

from ais_jax.config.load import load_config
from ais_jax.config.schema import DEFAULT_CONFIG_PATH
from ais_jax.core.errors import UsageError
from ais_jax.run import cli as train
from ais_jax.run import runguard, signals
from ais_jax.training.flops import TIMING_KEYS

TINY = [*TINY_RUN, "train.learning_rate=0.003"]
TIMING = {"step_time_s", *TIMING_KEYS}
# After a failed checkpoint read, orbax's tensorstore callbacks hit a closed event loop
# (harmless noise, reported by pytest during whichever test runs next).
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _main(out, *extra, capsys=None):
    code = train.main([f"out_dir={out}", *TINY, *extra])
    cap = capsys.readouterr() if capsys is not None else None
    return code, cap


def _metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]  # every line must parse


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _assert_same(a, b, rtol=1e-6):
    a, b = _strip(a), _strip(b)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert set(ra) == set(rb)
        for k in ra:
            np.testing.assert_allclose(rb[k], ra[k], rtol=rtol, atol=1e-6,
                                       err_msg=f"step {ra['step']} {k}")


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns


def _write_lock(out, pid, host):
    with open(os.path.join(out, runguard.LOCK_NAME), "w") as f:
        json.dump({"pid": pid, "host": host, "since": "2026-01-01T00:00:00", "start": None}, f)


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_lock_held_by_a_live_run_exits_2_naming_it(tmp_path, capsys):
    _write_lock(tmp_path, os.getpid(), socket.gethostname())  # this process is alive
    code, cap = _main(tmp_path, "train.steps=1", capsys=capsys)
    err = cap.err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"in use by run {os.getpid()}@{socket.gethostname()} since 2026-01-01" in err
    assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))  # nothing was touched
    # another host's lock is never taken over (its pid cannot be checked)
    _write_lock(tmp_path, _dead_pid(), "some-other-host")
    code, cap = _main(tmp_path, "train.steps=1", capsys=capsys)
    assert code == 2 and "@some-other-host" in cap.err


def test_stale_lock_is_taken_over_and_released(tmp_path, capsys):
    pid = _dead_pid()
    _write_lock(tmp_path, pid, socket.gethostname())
    code, cap = _main(tmp_path, "train.steps=1", capsys=capsys)
    assert code == 0, cap.err
    assert f"took over the stale lock of run {pid}@" in cap.err
    assert not os.path.exists(os.path.join(tmp_path, runguard.LOCK_NAME))  # released at exit


def test_lock_is_exclusive_and_released_on_error(tmp_path):
    with runguard.RunLock(str(tmp_path)), pytest.raises(UsageError, match="in use by run"):
        runguard.RunLock(str(tmp_path)).acquire()
    assert not os.path.exists(os.path.join(tmp_path, runguard.LOCK_NAME))
    code, _ = _main(tmp_path, "train.steps=1", "model.source=/no/such/model")
    assert code == 2 and not os.path.exists(os.path.join(tmp_path, runguard.LOCK_NAME))


def test_resume_refuses_a_changed_config_and_accepts_more_steps(tmp_path, capsys, tiny_run):
    out = copy_run(tiny_run[0], tmp_path / "run")  # 3 steps, checkpoint.every=1
    base = ("checkpoint.every=1",)
    code, cap = _main(out, *base, "train.steps=4", "rollout.temperature=0.5", "seed=1",
                      capsys=capsys)
    err = cap.err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "rollout.temperature 1.0->0.5" in err and "seed 0->1" in err
    assert [r["step"] for r in _metrics(out)] == [1, 2, 3]  # untouched
    code, cap = _main(out, *base, "train.steps=4", "log.progress=true", capsys=capsys)
    assert code == 0, cap.err
    assert "resumed from step 3" in cap.out
    assert [r["step"] for r in _metrics(out)] == [1, 2, 3, 4]


def test_checkpoint_without_config_resumes_with_a_warning(capsys):
    cfg = load_config(DEFAULT_CONFIG_PATH, TINY)
    runguard.check_resume_config({"eval_before": {}}, cfg, 5, "/x")
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stores no config" in err
    runguard.check_resume_config({"config": runguard.flat_config(cfg)}, cfg, 5, "/x")


def test_finished_run_exits_0_without_rewriting_results(tmp_path, capsys, tiny_run):
    out = copy_run(tiny_run[0], tmp_path / "run")  # 3 steps, checkpoint.every=1
    files = [os.path.join(out, "summary.json"), os.path.join(out, "metrics.jsonl"),
             os.path.join(out, "final", "model.safetensors")]
    before = [_digest(p) for p in files]
    for steps in (3, 1):  # reached, and passed
        code, cap = _main(out, f"train.steps={steps}", "checkpoint.every=1",
                          capsys=capsys)
        assert code == 0, cap.err
        assert "already holds the results of step 3" in cap.out
        assert len(cap.out.strip().splitlines()) == 1
        assert [_digest(p) for p in files] == before


def _corrupt_state(out, step):
    state_dir = os.path.join(out, "checkpoints", str(step), "state")
    for d, _, files in os.walk(state_dir):
        for f in files:
            if f not in ("_METADATA", "_CHECKPOINT_METADATA", "_sharding"):
                with open(os.path.join(d, f), "wb") as fh:
                    fh.write(b"garbage")


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, capsys, tiny_run):
    tmp_path = copy_run(tiny_run[0], tmp_path / "run")  # 3 steps, checkpoints 1, 2 and 3
    base = ("checkpoint.every=1", "checkpoint.keep=3")
    first = _metrics(tmp_path)
    _corrupt_state(tmp_path, 3)
    code, cap = _main(tmp_path, *base, "train.steps=4", capsys=capsys)
    assert code == 0, cap.err
    warns = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(warns) == 1 and warns[0].startswith("warning: checkpoint step 3"), cap.err
    assert "resuming from step 2" in warns[0] and "delete" not in warns[0].replace(
        "not deleted", "")
    assert "resumed from step 2" in cap.out
    assert os.path.isdir(os.path.join(tmp_path, "checkpoints.unrestorable", "3"))  # kept
    rows = _metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    _assert_same(first, rows[:3])  # step 3 recomputed from step 2, identically
    # nothing restores: one line naming out_dir, suggesting a new one, files left in place
    for s in (2, 3, 4):
        if os.path.isdir(os.path.join(tmp_path, "checkpoints", str(s))):
            _corrupt_state(tmp_path, s)
    listing = sorted(os.listdir(os.path.join(tmp_path, "checkpoints")))
    code, cap = _main(tmp_path, *base, "train.steps=5", capsys=capsys)
    err = cap.err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"no checkpoint in {tmp_path} can be restored" in err and "new out_dir" in err
    assert "delete" not in err
    assert sorted(os.listdir(os.path.join(tmp_path, "checkpoints"))) == listing


def test_torn_metrics_line_and_later_steps_are_dropped_on_resume(tmp_path, capsys, tiny_run):
    tmp_path = copy_run(tiny_run[0], tmp_path / "run")  # 3 steps, checkpoint.every=1
    base = ("checkpoint.every=2",)
    path = os.path.join(tmp_path, "metrics.jsonl")
    with open(path) as f:
        lines = f.readlines()
    # the latest checkpoint is step 3; pretend the run died while logging step 4
    with open(path, "a") as f:
        f.write('{"step": 4, "reward_mean": 0.')
    code, cap = _main(tmp_path, *base, "train.steps=5", capsys=capsys)
    assert code == 0, cap.err
    assert [r["step"] for r in _metrics(tmp_path)] == [1, 2, 3, 4, 5]
    with open(path) as f:
        assert f.readlines()[:3] == lines
    # lines for steps after the restored checkpoint are dropped too (no duplicates)
    kept = runguard.truncate_metrics(path, 2)
    assert [r["step"] for r in kept] == [1, 2] == [r["step"] for r in _metrics(tmp_path)]


SIGNAL_ARGS = [*TINY, "train.steps=30", "checkpoint.every=0"]


@pytest.fixture(scope="module")
def signal_ref(tmp_path_factory):
    """The uninterrupted 30-step run both signal tests compare with (one run, not two)."""
    out = tmp_path_factory.mktemp("signal_ref")
    return train.run(load_config(DEFAULT_CONFIG_PATH, [f"out_dir={out}", *SIGNAL_ARGS]))


@pytest.mark.slow  # ~14 s in the full suite on 2 busy cores
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_checkpoints_exits_128_plus_signum_and_resumes_identically(signum, tmp_path,
                                                                          signal_ref):
    args, ref = SIGNAL_ARGS, signal_ref
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "ais_jax.train", f"out_dir={out}", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # signal right after step 2
        if os.path.exists(path):
            with open(path) as f:
                if len(f.read().splitlines()) >= 2:
                    break
        time.sleep(0.005)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, err
    line = err.strip().splitlines()[-1]
    k = len(_metrics(out))
    assert 2 <= k < 30
    assert line == (f"stopped by {signal.Signals(signum).name} after step {k}; checkpoint saved in "
                    f"{out}/checkpoints/{k}; rerun the same command to resume")
    assert not os.path.exists(os.path.join(out, runguard.LOCK_NAME))
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert f"resumed from step {k}" in second.stdout
    _assert_same(ref.metrics, _metrics(out))


def test_stop_flag_records_the_signal_and_restores_handlers():
    before = signal.getsignal(signal.SIGINT)
    stop = signals.StopFlag()
    with stop.installed():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert stop.agreed() == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C stops at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) is before


def test_export_refuses_non_finite_weights(tmp_path):
    import jax
    import jax.numpy as jnp

    from ais_jax.core.errors import CheckpointError
    from ais_jax.models.model import ModelConfig, init_params
    from ais_jax.models.pretrained import save_pretrained

    mc = ModelConfig(vocab_size=17, hidden_size=16, intermediate_size=32, num_layers=1,
                     num_heads=2, num_kv_heads=1, head_dim=8)
    params = init_params(jax.random.key(0), mc)
    params["layers"]["w_up"] = params["layers"]["w_up"].at[0, 0, 0].set(jnp.nan)
    with pytest.raises(CheckpointError, match=r"mlp\.up_proj\.weight.*1 non-finite"):
        save_pretrained(params, mc, tmp_path / "final")
    assert not (tmp_path / "final").exists()


def test_disk_full_or_read_only_out_dir_exits_2_with_one_line(monkeypatch, capsys, tmp_path):
    import errno as errno_mod

    def full(cfg, **_):
        raise OSError(errno_mod.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl"))

    monkeypatch.setattr(train, "run", full)
    assert train.main([f"out_dir={tmp_path}", "train.steps=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and str(tmp_path) in err[0]
