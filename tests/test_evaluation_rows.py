"""The per-process held-out evaluation (`ais_jax.training.evaluation_rows`) computes what the
one-process path (`SamplerPolicy` + `ais_jax.tasks.evaluate`) computes: checked here in one
process with a verifier that accepts about half of the completions (an untrained tiny model
solves nothing, which would leave the verdicts all 0); across 2 processes in
tests/test_multihost.py."""

from __future__ import annotations

import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.config.schema import DEFAULT_CONFIG_PATH
from ais_jax.rollout.sampler import bucket_length
from ais_jax.training import evaluation
from ais_jax.training.build import build_run
from ais_jax.training.evaluation_rows import evaluate_rows


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
def test_rows_evaluation_equals_the_one_process_evaluation(tmp_path, monkeypatch):
    cfg = load_config(DEFAULT_CONFIG_PATH, [f"out_dir={tmp_path}", *TINY_RUN,
                                            "eval.num_samples=3", "task.eval_size=10"])
    run = build_run(cfg)

    class HalfTask:  # the run's task with a verifier by completion length
        def __getattr__(self, name):
            return getattr(task, name)

        def verify(self, text, problem):
            return sum(map(ord, text)) % 2 == 0

    task = run.task
    run.task = HalfTask()
    evaluate, greedy_fn = evaluation.make_evaluator(run)
    ref = evaluate(run.state.params)  # one process: SamplerPolicy + tasks.evaluate
    # (the untrained model's greedy completions are alike; its samples are not)
    assert 0 < ref["sampled_accuracy"] < 1 and 0 < ref["pass@3"] < 1, ref
    sampled_fn = evaluation._sampler_fn(run, 3)
    batch = bucket_length(10, multiple=1, pow2_max=0)  # make_evaluator's chunk for 10 problems
    got = evaluate_rows(run, run.state.params, run.eval_problems, greedy_fn, sampled_fn, 3,
                        batch)
    assert got == ref
