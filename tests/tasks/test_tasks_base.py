"""Task registry, reproducibility and the train / eval split guarantee."""

import pytest

from ais_jax import tasks
from ais_jax.tasks import base, countdown, sudoku


def test_registry():
    assert set(tasks.TASKS) == {
        "countdown", "sudoku", "arithmetic", "gsm_synth", "multiplication"}
    for name, task in tasks.TASKS.items():
        assert tasks.get_task(name) is task and task.name == name
    with pytest.raises(
        ValueError, match=r"unknown task 'sudoku9'.*arithmetic.*Did you mean 'sudoku'"
    ):
        tasks.get_task("sudoku9")
    with pytest.raises(
        ValueError, match="valid tasks: arithmetic, countdown, gsm_synth, multiplication, sudoku"
    ):
        tasks.get_task("zzzzzz")


@pytest.mark.parametrize("name", ["countdown", "sudoku", "arithmetic", "gsm_synth"])
def test_reproducible_per_seed(name):
    task = tasks.get_task(name)
    a, b, c = task.generate(123, 12), task.generate(123, 12), task.generate(124, 12)
    assert a == b
    assert [p.id for p in a] != [p.id for p in c]
    for p in a:
        assert p.id.startswith(f"{name}-")
        assert isinstance(task.compact_prompt(p), str)
        assert task.verify(p.answer, p)
    assert task.generate(0, 0) == []


def _keys(name, problems):
    """Canonical identity of a problem, recomputed here from its content."""
    if name == "countdown":
        return {(tuple(sorted(p.metadata["numbers"])), p.metadata["target"]) for p in problems}
    if name == "sudoku":
        return {p.metadata["puzzle"] for p in problems}
    if name == "arithmetic":
        return {p.metadata["expression"] for p in problems}
    return {p.prompt for p in problems}


@pytest.mark.parametrize(
    ("name", "kwargs", "n"),
    [
        # Small problem spaces make collisions likely if the split were seed-based.
        ("countdown", {"num_numbers": 2, "max_number": 9, "max_target": 20}, 200),
        ("sudoku", {"size": 4}, 150),
        ("arithmetic", {"digits": 1, "num_operands": 2}, 300),
        ("gsm_synth", {"steps": 1, "max_value": 3}, 300),
    ],
)
def test_train_and_eval_never_share_a_problem(name, kwargs, n):
    task = tasks.get_task(name)
    train, ev = set(), set()
    for seed in range(3):
        train |= _keys(name, task.generate(seed, n, "train", **kwargs))
        ev |= _keys(name, task.generate(seed + 100, n // 5, "eval", **kwargs))
    assert train and ev
    assert not train & ev
    # Not vacuous: the two splits do hold different problems drawn from the same space.
    assert len(ev) > 3


def test_split_is_a_function_of_the_key():
    keys = [f"k{i}" for i in range(2000)]
    splits = [base.split_of("t", k) for k in keys]
    assert splits == [base.split_of("t", k) for k in keys]
    share = splits.count("eval") / len(splits)
    assert 0.07 < share < 0.13  # about EVAL_PER_MILLE / 1000
    assert base.problem_id("t", "a") == base.problem_id("t", "a") != base.problem_id("t", "b")


def test_countdown_permutations_share_a_split():
    # Same numbers in another order are the same problem, hence the same split.
    _, p1 = countdown._problem((3, 5, 7), 22, "3*5+7", True)
    _, p2 = countdown._problem((7, 3, 5), 22, "3*5+7", True)
    assert p1.id == p2.id


def test_sudoku_split_by_solution():
    for p in sudoku.generate(0, 10, "eval"):
        assert base.split_of("sudoku", p.metadata["solution"]) == "eval"


def test_bad_generate_args():
    with pytest.raises(ValueError, match="split"):
        tasks.get_task("arithmetic").generate(0, 1, "validation")
    with pytest.raises(ValueError, match="n must be"):
        tasks.get_task("arithmetic").generate(0, -1)
    with pytest.raises(TypeError):
        tasks.get_task("arithmetic").generate(0, 1, colour="red")
    with pytest.raises(ValueError, match="too few distinct problems"):
        # A generator that can only produce one problem, of the other split.
        base.generate_problems(
            "t", lambda rng: ("same", base.Problem("x", "p", "a", {})), seed=0, n=5,
            split="eval" if base.split_of("t", "same") == "train" else "train", max_draws=50,
        )  # fmt: skip


def test_problem_is_frozen_and_hashable():
    p = base.Problem("i", "p", "a", {"x": [1]})
    with pytest.raises(AttributeError):
        p.answer = "b"
    assert hash(p) == hash(base.Problem("i", "p", "a", {"y": 2}))
