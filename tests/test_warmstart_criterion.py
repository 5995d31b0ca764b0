"""The warm start's stopping criterion (sft.target_accuracy, sft.check_every, sft.check_size).

Tiny and fast: a 1-layer, 32-wide scratch model (`_tiny`), a few warm-start
steps, scripted accuracies where the real check's value does not matter.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.training.build import build_run
from ais_jax.training.warmstart import WarmStartLog, sft_batch, validation_problems, warm_start

STEPS = 6
BASE = [*TINY_RUN, f"sft.steps={STEPS}", "sft.warmup_steps=2", "sft.batch_size=8",
        "sft.check_every=2", "sft.check_size=8"]


@pytest.fixture(scope="module")
def tiny_run():
    """A built tiny run with the criterion on (target 0.5, a check every 2 of 6 steps)."""
    return build_run(load_config(None, [*BASE, "sft.target_accuracy=0.5"]))


def _fresh(run):
    """A copy of the initial params (the SFT program donates its inputs)."""
    return jax.tree.map(jnp.copy, run.state.params)


def _leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def _fixed_step_reference(run):
    """The fixed-step warm start as it was before the criterion: all sft.steps, no checks."""
    cfg = run.cfg
    params, opt_state = _fresh(run), run.sft_optimizer.init(run.state.params)
    length = run.prompt_bucket + cfg.rollout.max_new_tokens
    coins = np.random.default_rng([cfg.seed, 4242])
    for i in range(cfg.sft.steps):
        probs = run.train_problems(1, i, cfg.sft.batch_size)
        flawed = coins.random(len(probs)) < cfg.sft.mistake_rate
        toks, lm = sft_batch(probs, flawed, run.codec, length, cfg.rollout.max_new_tokens)
        params, opt_state, _ = run.fns.sft(params, opt_state, jnp.asarray(toks), jnp.asarray(lm))
    return params


@pytest.mark.slow  # ~12 s in the full suite on 2 busy cores
def test_stops_at_the_first_check_reaching_the_target(tiny_run):
    scripted = iter([0.1, 0.5, 0.9])  # steps 2, 4, 6: the check at step 4 reaches 0.5
    log = WarmStartLog()
    warm_start(tiny_run, _fresh(tiny_run), log=log, check=lambda p: next(scripted))
    assert log.reached and log.steps_run == 4 and log.target == 0.5
    assert log.checks == [{"step": 2, "accuracy": 0.1}, {"step": 4, "accuracy": 0.5}]


def test_runs_all_steps_when_never_reached_with_the_real_check(tiny_run):
    # The untrained tiny model's real greedy accuracy stays far below 0.5.
    log = WarmStartLog()
    warm_start(tiny_run, _fresh(tiny_run), log=log)
    assert not log.reached and log.steps_run == STEPS
    assert [c["step"] for c in log.checks] == [2, 4, 6]
    assert all(0.0 <= c["accuracy"] < 0.5 for c in log.checks)


def test_continues_past_sft_steps_up_to_max_steps():
    run = build_run(load_config(None, [*BASE, "sft.target_accuracy=0.5", "sft.max_steps=10"]))
    log = WarmStartLog()
    warm_start(run, _fresh(run), log=log, check=lambda p: 0.0)
    assert not log.reached and log.steps_run == 10
    assert [c["step"] for c in log.checks] == [2, 4, 6, 8, 10]


def test_off_is_the_fixed_step_warm_start_and_checks_do_not_perturb_it(tiny_run):
    want = _leaves(_fixed_step_reference(tiny_run))
    off = build_run(load_config(None, [*BASE, "sft.target_accuracy=0"]))

    def never(params):
        raise AssertionError("sft.target_accuracy=0 must not check")

    log = WarmStartLog()
    got_off = _leaves(warm_start(off, _fresh(off), log=log, check=never))
    assert log.steps_run == STEPS and log.checks == [] and not log.reached
    # With the criterion on but never reached, the checks leave training untouched.
    got_on = _leaves(warm_start(tiny_run, _fresh(tiny_run), check=lambda p: 0.0))
    for w, a, b in zip(want, got_off, got_on, strict=True):
        np.testing.assert_array_equal(a, w)
        np.testing.assert_array_equal(b, w)


def test_validation_problems_are_training_split_and_disjoint_from_eval():
    run = build_run(load_config(None, [*BASE, "sft.target_accuracy=0.5", "sft.check_size=300",
                                       "task.eval_size=300"]))
    val = validation_problems(run)
    assert len(val) == 300
    assert {p.id for p in val}.isdisjoint({p.id for p in run.eval_problems})
    # Its own seed stream: not the first warm-start batch nor the first RL batch.
    assert [p.id for p in val[:8]] != [p.id for p in run.train_problems(1, 0, 8)]
    assert [p.id for p in val[:8]] != [p.id for p in run.train_problems(0, 0, 8)]


@pytest.mark.parametrize("override,needle", [
    ("sft.target_accuracy=1.5", "sft.target_accuracy must be in [0, 1]"),
    ("sft.target_accuracy=-0.1", "sft.target_accuracy must be in [0, 1]"),
    ("sft.check_every=0", "sft.check_every must be >= 1"),
    ("sft.check_size=0", "sft.check_size must be >= 1"),
    ("sft.check_every=500", "sft.check_every=500 exceeds the 400 warm-start steps"),
    ("sft.max_steps=300", "sft.max_steps=300 must be 0 (= sft.steps) or >= sft.steps=400"),
])
def test_bad_values_exit_2_with_one_line(override, needle):
    cmd = [sys.executable, "-m", "ais_jax.train", "--print-config", "sft.steps=400",
           "sft.max_steps=0", "sft.target_accuracy=0.6", override]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
    assert needle in err, err


@pytest.mark.slow  # ~6 s in the full suite on 2 busy cores (a fresh run: its own compile)
def test_the_warm_start_step_compiles_once():
    """The SFT optimizer's step counts start on the params' mesh (`_scalars_on_mesh`), so every
    step runs the program the first one compiled; made without a mesh, they gave the second
    step other argument types and the same step compiled again (2 compiles before the fix)."""
    import logging

    from ais_jax.training import warmstart

    run = build_run(load_config(None, BASE))  # fresh: nothing of its step compiled yet
    placed = warmstart._scalars_on_mesh(run.sft_optimizer.init(run.state.params), run.state.params)
    mesh = jax.tree.leaves(run.state.params)[0].sharding.mesh
    scalars = [x for x in jax.tree.leaves(placed) if jnp.ndim(x) == 0]
    assert scalars and all(x.sharding.mesh == mesh for x in scalars)

    compiles: list[str] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Compiling jit(sft_fn)"):
                compiles.append(record.getMessage())

    handler, logger = Count(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            log = WarmStartLog()
            warm_start(run, _fresh(run), log=log)
    finally:
        logger.removeHandler(handler)
    assert log.steps_run == STEPS
    assert len(compiles) == 1, compiles
