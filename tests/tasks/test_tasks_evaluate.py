"""evaluate(): greedy accuracy and unbiased pass@k with fake policies."""

import math

import pytest

from ais_jax.tasks import TASKS, evaluate, pass_at_k

TASK = TASKS["arithmetic"]
PROBLEMS = TASK.generate(0, 12, "eval")
BY_PROMPT = {TASK.compact_prompt(p): p for p in PROBLEMS}


def always_correct(prompts, num_samples, greedy):
    return [[BY_PROMPT[q].answer] * num_samples for q in prompts]


def always_wrong(prompts, num_samples, greedy):
    return [[str(int(BY_PROMPT[q].answer) + 1)] * num_samples for q in prompts]


def test_always_correct():
    r = evaluate(always_correct, TASK, PROBLEMS, k=4)
    assert r.n == 12 and r.accuracy == 1.0 and r.pass_at_k == 1.0 and r.sampled_accuracy == 1.0
    assert r.num_samples == 4 and r.k == 4
    assert r.mean_response_len == pytest.approx(sum(len(p.answer) for p in PROBLEMS) / 12)
    assert r.format_rate == 0.0  # bare answers are not in <answer> tags


def test_always_wrong():
    r = evaluate(always_wrong, TASK, PROBLEMS, k=2, num_samples=5)
    assert r.accuracy == 0.0 and r.pass_at_k == 0.0 and r.sampled_accuracy == 0.0


def test_greedy_only_by_default():
    calls = []

    def policy(prompts, num_samples, greedy):
        calls.append((len(prompts), num_samples, greedy))
        return always_correct(prompts, num_samples, greedy)

    r = evaluate(policy, TASK, PROBLEMS, batch_size=5)
    assert r.pass_at_k is None and r.sampled_accuracy is None and r.num_samples == 0
    assert calls == [(5, 1, True), (5, 1, True), (2, 1, True)]


def test_pass_at_k_formula():
    # Hand value: n=5 samples, c=2 correct, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7.
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))
    assert pass_at_k(5, 4, 2) == 1.0  # n - c < k
    assert pass_at_k(5, 0, 3) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_mixed_policy_pass_at_k():
    # Greedy right on even-indexed problems; of 5 samples, exactly 2 are right everywhere.
    index = {TASK.compact_prompt(p): i for i, p in enumerate(PROBLEMS)}

    def policy(prompts, num_samples, greedy):
        out = []
        for q in prompts:
            good, bad = BY_PROMPT[q].answer, "<answer>nope</answer>"
            if greedy:
                out.append([good if index[q] % 2 == 0 else bad])
            else:
                out.append([good, bad, good, bad, bad][:num_samples])
        return out

    r = evaluate(policy, TASK, PROBLEMS, k=2, num_samples=5)
    assert r.accuracy == 0.5
    assert r.pass_at_k == pytest.approx(0.7)
    assert r.sampled_accuracy == pytest.approx(0.4)
    assert r.format_rate == 0.5


def test_chat_prompt_fn():
    seen = []

    def policy(prompts, num_samples, greedy):
        seen.extend(prompts)
        return [["<answer>0</answer>"] * num_samples for _ in prompts]

    evaluate(policy, TASK, PROBLEMS[:2], prompt_fn=lambda p: TASK.chat_messages(p)[0]["content"])
    assert all("<answer>" in s for s in seen)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (lambda prompts, n, g: [["1"]] * (len(prompts) + 1), "one list of completions per prompt"),
        (lambda prompts, n, g: [["1", "2"]] * len(prompts), "1 completion"),
        (lambda prompts, n, g: [[1]] * len(prompts), "must be strings"),
        (lambda prompts, n, g: None, "one list of completions per prompt"),
    ],
)
def test_bad_policy_output(policy, message):
    with pytest.raises(ValueError, match=message):
        evaluate(policy, TASK, PROBLEMS)


def test_bad_args():
    with pytest.raises(ValueError, match="at least one problem"):
        evaluate(always_correct, TASK, [])
    with pytest.raises(ValueError, match="num_samples"):
        evaluate(always_correct, TASK, PROBLEMS, k=4, num_samples=2)
    with pytest.raises(ValueError, match="k must be"):
        evaluate(always_correct, TASK, PROBLEMS, k=0)
