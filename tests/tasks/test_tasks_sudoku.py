"""Sudoku: uniqueness of generated puzzles (independent counter), answer format, verifier."""

import pytest

from ais_jax.tasks import sudoku


def independent_count(puzzle: str, limit: int = 2) -> int:
    """Solution counter written independently of ais_jax (sets, first empty cell, no bitmasks)."""
    n = 4 if len(puzzle) == 16 else 9
    b = 2 if n == 4 else 3
    grid = [0 if c == "." else int(c) for c in puzzle]

    def candidates(i):
        r, c = divmod(i, n)
        used = {grid[r * n + k] for k in range(n)} | {grid[k * n + c] for k in range(n)}
        r0, c0 = r - r % b, c - c % b
        used |= {grid[(r0 + x) * n + c0 + y] for x in range(b) for y in range(b)}
        return [d for d in range(1, n + 1) if d not in used]

    for i, v in enumerate(grid):  # the givens themselves must not clash
        if v:
            grid[i] = 0
            ok = v in candidates(i)
            grid[i] = v
            if not ok:
                return 0
    count = 0

    def solve():
        nonlocal count
        empty = [i for i, v in enumerate(grid) if v == 0]
        if not empty:
            count += 1
            return
        i = min(empty, key=lambda j: len(candidates(j)))
        for d in candidates(i):
            grid[i] = d
            solve()
            grid[i] = 0
            if count >= limit:
                return

    solve()
    return count


@pytest.mark.parametrize(("size", "n"), [(4, 50), (9, 20)])
def test_generated_puzzles_have_one_solution(size, n):
    problems = sudoku.generate(7, n, size=size)
    assert len({p.metadata["puzzle"] for p in problems}) == n
    for p in problems:
        puzzle, solution = p.metadata["puzzle"], p.metadata["solution"]
        assert len(puzzle) == size * size and p.answer == solution
        assert independent_count(puzzle) == 1
        assert independent_count(solution) == 1  # the solution is a valid full grid
        assert all(a == "." or a == s for a, s in zip(puzzle, solution, strict=True))
        assert sudoku.verify(solution, p)


def test_givens_knob_and_reproducibility():
    a = sudoku.generate(1, 5, size=9, givens=40)
    assert a == sudoku.generate(1, 5, size=9, givens=40)
    assert all(sum(c != "." for c in p.metadata["puzzle"]) == 40 for p in a)
    hard = sudoku.generate(1, 3, size=4, givens=4)
    assert all(sum(c != "." for c in p.metadata["puzzle"]) >= 4 for p in hard)
    none_removed = sudoku.generate(1, 2, size=4, max_removal_tries=0)
    assert all("." not in p.metadata["puzzle"] for p in none_removed)


def test_solver_counts():
    assert sudoku.count_solutions("." * 16, limit=1000) == 288  # all 4x4 grids
    assert independent_count("." * 16, limit=1000) == 288
    assert sudoku.count_solutions("11" + "." * 14) == 0


SOLUTION = "1234341221434321"
PUZZLE = "1.3..4..2.....2."
P = sudoku._problem(4, PUZZLE, SOLUTION)


@pytest.mark.parametrize(
    "text",
    [
        SOLUTION,
        "<answer>\n1234\n3412\n2143\n4321\n</answer>",
        "<answer>12|34\n34|12\n--+--\n21|43\n43|21</answer>",
        "<answer>[[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]]</answer>",
        "reasoning... <answer>1 2 3 4 3 4 1 2 2 1 4 3 4 3 2 1</answer> done",
    ],
)
def test_correct(text):
    assert independent_count(PUZZLE) >= 1
    assert sudoku.verify(text, P)


@pytest.mark.parametrize(
    "text",
    [
        "1234341221434312",  # last two digits swapped: invalid grid
        "2143432112343412",  # valid grid but breaks the givens
        "123434122143432",  # 15 digits
        "12343412214343211",  # 17 digits
        "1234341221434320",  # contains 0
        "1234341221434325",  # digit > size
        "1234a41221434321",
        "1234341221434３21",  # fullwidth digit
        "<answer>1234 3412 2143 4321</answer> <answer>1111222233334444</answer>",
        "<answer></answer>",
        "",
        "The grid is 1234341221434321",  # prose inside the answer
    ],
)
def test_wrong_or_malformed(text):
    assert not sudoku.verify(text, P)


def test_any_valid_grid_keeping_givens_is_accepted():
    # With few givens there may be several completions; the verifier accepts any of them.
    p = sudoku._problem(4, "1" + "." * 15, SOLUTION)
    other = "1243341221344321"  # a different valid grid with the same given
    assert other != SOLUTION and independent_count(other) == 1
    assert sudoku.verify(SOLUTION, p)
    assert sudoku.verify(other, p)


def test_prompts():
    assert sudoku.compact_prompt(P) == PUZZLE + "="
    (msg,) = sudoku.chat_messages(P)
    assert "<answer>" in msg["content"] and "1.3." in msg["content"]


def test_bad_args():
    with pytest.raises(ValueError, match="size"):
        sudoku.generate(0, 1, size=6)
    with pytest.raises(ValueError, match="givens"):
        sudoku.generate(0, 1, size=4, givens=17)
