"""reasoning-gym datasets as tasks by name (``task.name=reasoning_gym:<dataset>``), real package."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("reasoning_gym")

from _tiny import TINY_MODEL

from ais_jax.core.errors import UsageError
from ais_jax.tasks import check_task_settings, get_task
from ais_jax.tasks.reasoning_gym_task import chat_prompt

TINY = [*TINY_MODEL, "rollout.prompts_per_step=4", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "sft.steps=0", "task.eval_size=4", "eval.every=0",
        "eval.num_samples=1", "log.tensorboard=false", "log.progress=false"]

# propositional_logic has no single gold answer ("answer" is None): its example is used
GOLD_DATASETS = ["leg_counting", "propositional_logic", "countdown", "basic_arithmetic",
                 "chain_sum", "graph_color"]  # fmt: skip


@pytest.mark.parametrize("dataset", GOLD_DATASETS)
def test_gold_answers_score_one(dataset):
    task = get_task(f"reasoning_gym:{dataset}")
    assert task.name == f"reasoning_gym:{dataset}"
    for p in task.generate(seed=3, n=4) + task.generate(seed=3, n=2, split="eval"):
        assert p.answer and p.answer != "None"
        completion = f"Let me think.\n<answer>{p.answer}</answer>"
        assert task.extract(completion) == p.answer
        assert task.score(completion, p) == 1.0
        assert task.verify(completion, p)
        assert task.score(p.answer, p) == 1.0  # compact prompts: the bare answer
        assert not task.verify("<answer>certainly wrong</answer>", p)


def test_countdown_prompt_agrees_with_answer_tags():
    task = get_task("reasoning_gym:countdown")
    (p,) = task.generate(seed=0, n=1)
    assert "Do not include any other text" in p.prompt  # reasoning-gym's own rule
    text = task.chat_messages(p)[-1]["content"]
    assert "other text or formatting inside the <answer></answer> tags" in text
    assert text.rstrip().endswith("inside the tags.")
    assert chat_prompt("Q?").endswith("the answer format rules above apply to the text inside "
                                       "the tags.")


def test_difficulty_is_passed_to_create_dataset():
    check_task_settings("reasoning_gym:countdown", {"min_numbers": 3, "max_numbers": 3}, 0.0)
    task = get_task("reasoning_gym:countdown")
    for p in task.generate(seed=1, n=3, min_numbers=3, max_numbers=3):
        assert len(p.metadata["entry"]["metadata"]["numbers"]) == 3
        assert task.score(f"<answer>{p.answer}</answer>", p) == 1.0


@pytest.mark.parametrize(("name", "difficulty", "needle"), [
    ("reasoning_gym:leg_countin", {}, "did you mean 'leg_counting'"),
    ("reasoning_gym:", {}, "needs a dataset name"),
    ("reasoning_gym:countdown", {"foo": 1}, "unexpected keyword argument 'foo'"),
    ("reasoning_gym:countdown", {"min_numbers": 5, "max_numbers": 2}, "max_numbers must be"),
])  # fmt: skip
def test_bad_names_and_settings_are_one_line_usage_errors(name, difficulty, needle):
    with pytest.raises(UsageError, match=needle) as info:
        check_task_settings(name, difficulty, 0.0)
    assert "\n" not in str(info.value)


def _cli(out_dir, *extra):
    cmd = [sys.executable, "-m", "ais_jax.train", f"out_dir={out_dir}", *TINY, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))


@pytest.mark.slow  # ~19 s in the full suite on 2 busy cores
def test_cli_two_steps_on_a_reasoning_gym_task_by_name(tmp_path):
    res = _cli(tmp_path, "task.name=reasoning_gym:basic_arithmetic", "train.steps=2",
               "task.difficulty={max_terms: 2, max_digits: 1}")
    assert res.returncode == 0, res.stderr
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert len(rows) == 2


def test_cli_unknown_dataset_is_one_line_exit_2(tmp_path):
    res = _cli(tmp_path, "task.name=reasoning_gym:no_such_dataset", "train.steps=1")
    assert res.returncode == 2
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "no dataset 'no_such_dataset'" in err
