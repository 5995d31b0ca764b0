"""Multi-process start-up (issue 55 items 1, 2 and 7): one run, one config, and no hang.

Real processes on a loopback coordinator (2 CPU devices each), all of them bounded by a
subprocess timeout. Processes that differ in a config key, or are started with a bad id or
count, or without their peers, must all end with one line and exit 2 within a bounded time;
every check here ends before anything is compiled, so the runs are short.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from _tiny import TINY_RUN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError
from ais_jax.run import agree, distributed

MIN = [*TINY_RUN, "rollout.prompts_per_step=2", "rollout.group_size=2", "task.eval_size=4",
       "sft.target_accuracy=0", "train.steps=2", "checkpoint.every=1", "mesh.fsdp=4"]
BOUND_S = 90  # every scenario of a test, started together, ends within this (2 busy cores)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(specs, timeout=BOUND_S):
    """Start every ``(env, args)`` of ``specs`` at once (the CLI, 2 CPU devices each); returns
    ``[(returncode, stderr)]`` in order and the wall time. All are killed at ``timeout``."""
    procs = [subprocess.Popen([sys.executable, "-m", "ais_jax.train", *args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, JAX_NUM_CPU_DEVICES="2", **env))
             for env, args in specs]
    t0, out = time.monotonic(), []
    try:
        for p in procs:
            _, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            out.append((p.returncode, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"a process ran past {timeout} s (killed): "
                    f"{[p.communicate()[1][-1500:] for p in procs]}")
    return out, time.monotonic() - t0


def _env(port: int, count: int, pid: int) -> dict[str, str]:
    return {"AIS_JAX_COORDINATOR": f"127.0.0.1:{port}", "AIS_JAX_NUM_PROCESSES": str(count),
            "AIS_JAX_PROCESS_ID": str(pid)}


def _pair_specs(out_dir, extra1=(), count1=2, timeout_s=60):
    port = _free_port()
    args = [f"out_dir={out_dir}", *MIN, f"runtime.init_timeout_s={timeout_s}"]
    return [(_env(port, 2, 0), args), (_env(port, count1, 1), [*args, *extra1])]


def _one_line_exit_2(rc_err, contains):
    rc, err = rc_err
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert rc == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and contains in lines[0], err[-3000:]
    return lines[0]


@pytest.mark.slow  # 3 pairs of processes started together (~12 s CPU)
def test_processes_with_different_configs_stop_on_both_naming_the_key(tmp_path):
    # issue 55 rows 1-3: another seed, learning rate or step count on process 1 only: both
    # exited 0 with a mixed run (rows 1, 2), or aborted in a gloo collective (row 3)
    rows = [("seed=1", "seed"), ("train.learning_rate=0.5", "train.learning_rate"),
            ("train.steps=5", "train.steps")]
    specs = []
    for i, (override, _) in enumerate(rows):
        specs += _pair_specs(tmp_path / f"run{i}", [override])
    out, elapsed = _launch(specs)
    assert elapsed < BOUND_S
    for i, (_, key) in enumerate(rows):
        lines = [_one_line_exit_2(x, f"process 1 has another {key} (") for x in out[2 * i:][:2]]
        assert lines[0] == lines[1]
        assert not (tmp_path / f"run{i}" / "checkpoints").exists()  # nothing was written


# Keys a careless or hostile user may set on one host only, with a value other than MIN's.
PERTURB = [("rollout.group_size", "4"), ("ais.mode", "tis"), ("train.beta_kl", "0.1"),
           ("rollout.precision", "bf16"), ("task.eval_size", "6"), ("model.hidden_size", "64"),
           ("train.clip_eps", "0.3"), ("rollout.temperature", "0.7"), ("seed", "7"),
           ("checkpoint.keep", "2")]


@pytest.mark.slow  # one pair of processes per example (~4 s CPU; the suite runs one example)
@settings(max_examples=1, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(PERTURB))
def test_any_one_key_changed_on_process_1_stops_both(tmp_path, perturb):
    # issue 55 item 7: one random key on process 1 only -> exit 2 on both, naming that key
    key, value = perturb
    load_config(None, [*MIN, f"{key}={value}"])  # a valid value: the difference is the error
    d = tmp_path / f"{key}={value}"
    out, elapsed = _launch(_pair_specs(d, [f"{key}={value}"]))
    assert elapsed < BOUND_S
    lines = [_one_line_exit_2(x, f"process 1 has another {key} (") for x in out]
    assert lines[0] == lines[1]


@pytest.mark.slow  # 4 scenarios, 7 processes started together (~12 s CPU)
def test_start_up_that_cannot_join_ends_in_one_line_on_every_process(tmp_path):
    # issue 55 rows 4-6 and a count mismatch: each process ends with one line and exit 2
    # within runtime.init_timeout_s (3 s here) of its start-up, instead of hanging ~300 s
    # (then a C++ abort), waiting until killed, or a ValueError traceback
    args = [f"out_dir={tmp_path / 'r'}", *MIN, "runtime.init_timeout_s=3"]
    p = [_free_port() for _ in range(3)]
    specs = [(_env(p[0], 2, 1), args),  # row 4: alone, no coordinator listening
             (_env(p[1], 2, 0), args), (_env(p[1], 2, 0), args),  # row 5: two process 0s
             (_env(p[2], 2, 0), args), (_env(p[2], 2, 5), args)]  # row 6: id 5 of 2
    # a count mismatch: with process 0 serving 2 both join, and the count is a differing key
    # (with process 0 serving 3, process 0 waits, as in row 6, until the watchdog ends it)
    specs += _pair_specs(tmp_path / "count", count1=3)
    out, elapsed = _launch(specs)
    assert elapsed < BOUND_S
    join = "the processes did not all join the coordinator"
    _one_line_exit_2(out[0], f"process 1 of 2: {join}")
    five = sorted(_one_line_exit_2(x, "") for x in out[1:3])
    assert "already in use" in five[1] and join in five[0], five  # "error: p" < "error: t"
    _one_line_exit_2(out[3], f"process 0 of 2: {join}")
    _one_line_exit_2(out[4], "AIS_JAX_PROCESS_ID=5 is outside 0..1")
    for x in out[5:]:
        _one_line_exit_2(x, "process 1 has another processes.count (2 on process 0, 3 on")


@pytest.mark.parametrize("env, match", [
    ({"AIS_JAX_COORDINATOR": "localhost"}, "is not host:port"),
    ({"AIS_JAX_COORDINATOR": "h:1", "AIS_JAX_PROCESS_ID": "0"}, "AIS_JAX_NUM_PROCESSES is not"),
    ({"AIS_JAX_COORDINATOR": "h:1", "AIS_JAX_NUM_PROCESSES": "two", "AIS_JAX_PROCESS_ID": "0"},
     "'two' is not an integer"),
    ({"AIS_JAX_COORDINATOR": "h:1", "AIS_JAX_NUM_PROCESSES": "0", "AIS_JAX_PROCESS_ID": "0"},
     "must be >= 1"),
    ({"AIS_JAX_COORDINATOR": "h:1", "AIS_JAX_NUM_PROCESSES": "2", "AIS_JAX_PROCESS_ID": "-1"},
     "outside 0..1"),
])
def test_env_ids_refuses_bad_values(env, match):
    with pytest.raises(UsageError, match=match):
        distributed.env_ids(env)
    assert distributed.env_ids({}) is None
    assert distributed.env_ids({"AIS_JAX_COORDINATOR": "h:1", "AIS_JAX_NUM_PROCESSES": "2",
                                "AIS_JAX_PROCESS_ID": "1"}) == ("h:1", 2, 1)


def test_a_busy_coordinator_port_is_refused_for_process_0():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(UsageError, match="already in use"):
            distributed.check_port_free(s.getsockname()[1])
    port = _free_port()
    distributed.check_port_free(port)  # claims the port for this process
    with pytest.raises(UsageError, match="already in use"):  # a second claim on this host
        distributed.check_port_free(port)


def test_the_watchdog_ends_a_start_up_that_does_not_finish(tmp_path):
    code = ("from ais_jax.run.distributed import joined_within\nimport time\n"
            "joined_within(0.5, 'no peers', lambda: time.sleep(30))")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert time.monotonic() - t0 < 15
    assert p.returncode == 2 and p.stderr == "error: no peers\n", p.stderr


def test_first_difference_names_the_first_key_and_process(tmp_path):
    base = {"seed": 0, "train.steps": 3, agree.CODE_KEY: "sha256:a"}
    assert agree.first_difference([base, dict(base), dict(base)]) is None
    line = agree.first_difference([base, dict(base), {**base, "train.steps": 5, "seed": 1}])
    assert line.startswith("the processes of this run differ: process 2 has another seed "
                           "(0 on process 0, 1 on process 2)")
    line = agree.first_difference([base, {**base, "extra": 1}])
    assert "another extra (\"<unset>\" on process 0, 1 on process 1)" in line
    # the identity: no per-process key, the code's digest, and the contents of named files
    f = tmp_path / "rows.jsonl"
    f.write_text('{"prompt": "1+1", "answer": "2"}\n')
    cfg = load_config(None, [*MIN, "task.name=dataset", f"task.train_file={f}",
                             f"out_dir={tmp_path}", "runtime.profile_steps=5"])
    ident = agree.identity(cfg)
    assert "out_dir" not in ident and not any(k.startswith("runtime.") for k in ident)
    assert ident[agree.CODE_KEY] == agree.code_digest() and ident[agree.COUNT_KEY] == 1
    before = ident["task.train_file" + agree.FILE_SUFFIX]
    f.write_text('{"prompt": "1+2", "answer": "3"}\n')
    assert agree.identity(cfg)["task.train_file" + agree.FILE_SUFFIX] != before


@pytest.mark.slow  # a child process that imports JAX (~3 s; ~20 s on 2 busy cores)
def test_a_service_left_by_a_dead_process_0_lingers_until_a_rerun_takes_the_port():
    # issue 55 row 7: JAX's service runs in a child of process 0 that outlives it (the
    # survivors then fail in a collective, not in C++); a rerun's process 0 ends it at once
    from ais_jax.run import coordinator

    port = _free_port()
    svc = coordinator.start_child_service(f"[::]:{port}", 2)
    assert not coordinator.release_lingering(port)  # serving, not lingering: left alone
    with pytest.raises(UsageError, match="already in use"):
        distributed.check_port_free(port)
    svc.proc.stdin.close()  # process 0 died (no stop word): the child lingers
    time.sleep(0.5)
    assert svc.proc.poll() is None
    t0 = time.monotonic()
    assert coordinator.release_lingering(port)
    svc.proc.wait(10)
    assert time.monotonic() - t0 < 10
    distributed.check_port_free(port)  # free again for the rerun


def test_a_survivor_releases_the_lock_of_a_dead_process_0(tmp_path, monkeypatch):
    # issue 55 item 3: process 0 cannot release its lock when it dies; the survivor, told of
    # the death by a failed collective, removes it if it is still the one of this run
    import json

    from ais_jax.run import multihost

    monkeypatch.setattr(multihost, "_count", lambda: 2)
    monkeypatch.setattr(multihost, "is_main", lambda: False)
    lock, info = tmp_path / "run.lock", {"pid": 12345, "host": "host0", "since": "t"}
    lock.write_text(json.dumps(info))
    multihost.share_lock(str(lock), {**info, "pid": 1})  # another run's lock now: kept
    assert not multihost.release_dead_main_lock() and lock.exists()
    multihost.share_lock(str(lock), info)
    assert multihost.release_dead_main_lock() and not lock.exists()
    multihost.share_lock("", None)  # the run ended: nothing to release
    lock.write_text(json.dumps(info))
    assert not multihost.release_dead_main_lock() and lock.exists()
