"""Sudoku (4x4 and 9x9) with unique solutions: generator, solver, verifier.

Grids are strings of ``size * size`` characters read row by row: digits
``1..size`` for filled cells and ``.`` for empty ones in puzzles.

Answer format (checked by `verify`): the completed grid as ``size * size``
digits, row by row, inside ``<answer>...</answer>`` (chat) or bare (compact).
Whitespace, newlines and the separators ``| , ; - + [ ] ( )`` are ignored, so
``"1234 3412 ..."`` and drawn grids with ``|`` / ``+---+`` both work; any other
character, a ``0``, or a wrong digit count makes the answer malformed.  The
answer is correct when it is a valid complete grid that keeps every given.

Prompt formats:

* compact: the puzzle string then ``=`` (``"1.3..4..2.....1.="``) -> the 16 or 81
  solution digits.
* chat: the puzzle drawn as rows, the answer asked for in ``<answer>`` tags.

Generation: a random complete grid (randomised backtracking), then givens are
removed in random order, each removal kept only if the puzzle still has
exactly one solution (bitmask solver with the fewest-candidates heuristic,
stopping at two solutions).  At most ``max_removal_tries`` removals are tried,
which bounds the time per puzzle (9x9 with 30 givens: a few ms to tens of ms).
The split is decided by the solution grid, so train and eval puzzles can never
coincide (a puzzle determines its unique solution).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ais_jax.tasks import base
from ais_jax.tasks.extract import has_answer_tag as format_ok
from ais_jax.tasks.extract import tagged_or_whole

NAME = "sudoku"
SIZES = (4, 9)
DEFAULT_GIVENS = {4: 6, 9: 30}
_SEPARATORS = frozenset(" \t\r\n|,;-+[]()")


def box_size(size: int) -> int:
    """Side of a box: 2 for 4x4, 3 for 9x9."""
    if size not in SIZES:
        raise ValueError(f"sudoku size must be one of {SIZES}, got {size!r}.")
    return 2 if size == 4 else 3


def _search(
    cells: Sequence[int], size: int, limit: int, rng: random.Random | None
) -> tuple[int, list[int] | None]:
    """Count solutions up to ``limit``; also return the first one found (or None)."""
    b = box_size(size)
    full = (1 << (size + 1)) - 2  # bits 1..size
    rows, cols, boxes = [0] * size, [0] * size, [0] * size
    grid = list(cells)
    empties: list[tuple[int, int, int, int]] = []
    for i, v in enumerate(grid):
        r, c = divmod(i, size)
        k = (r // b) * b + c // b
        if v:
            bit = 1 << v
            if (rows[r] | cols[c] | boxes[k]) & bit:
                return 0, None
            rows[r] |= bit
            cols[c] |= bit
            boxes[k] |= bit
        else:
            empties.append((i, r, c, k))
    count = 0
    first: list[int] | None = None

    def search(pos: int) -> bool:  # True: stop (limit reached)
        nonlocal count, first
        if pos == len(empties):
            count += 1
            if first is None:
                first = list(grid)
            return count >= limit
        best, best_mask, best_n = pos, 0, size + 1
        for t in range(pos, len(empties)):
            _, r, c, k = empties[t]
            m = full & ~(rows[r] | cols[c] | boxes[k])
            nb = m.bit_count()
            if nb < best_n:
                best, best_mask, best_n = t, m, nb
                if nb <= 1:
                    break
        if best_n == 0:
            return False
        empties[pos], empties[best] = empties[best], empties[pos]
        i, r, c, k = empties[pos]
        digits = [d for d in range(1, size + 1) if best_mask >> d & 1]
        if rng is not None:
            rng.shuffle(digits)
        for d in digits:
            bit = 1 << d
            rows[r] |= bit
            cols[c] |= bit
            boxes[k] |= bit
            grid[i] = d
            stop = search(pos + 1)
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[k] ^= bit
            grid[i] = 0
            if stop:
                return True
        return False

    search(0)
    return count, first


def count_solutions(puzzle: str, limit: int = 2) -> int:
    """Number of solutions of a puzzle string (``.`` = empty), counting at most ``limit``."""
    size = 4 if len(puzzle) == 16 else 9 if len(puzzle) == 81 else 0
    box_size(size)
    cells = [0 if ch == "." else int(ch) for ch in puzzle]
    return _search(cells, size, limit, None)[0]


def _to_str(cells: Sequence[int]) -> str:
    return "".join(str(v) if v else "." for v in cells)


def _make(rng: random.Random, size: int, solution: list[int], givens: int, tries: int) -> str:
    cells = list(solution)
    order = list(range(size * size))
    rng.shuffle(order)
    filled = size * size
    for i in order[:tries]:
        if filled <= givens:
            break
        v, cells[i] = cells[i], 0
        if _search(cells, size, 2, None)[0] == 1:
            filled -= 1
        else:
            cells[i] = v
    return _to_str(cells)


def _problem(size: int, puzzle: str, solution: str) -> base.Problem:
    b = box_size(size)
    rows = "\n".join(puzzle[r * size : (r + 1) * size] for r in range(size))
    prompt = (
        f"Solve this {size}x{size} Sudoku: fill the empty cells (.) with digits 1-{size} so that "
        f"every row, every column and every {b}x{b} box contains each digit exactly once.\n{rows}"
    )
    metadata = {"size": size, "puzzle": puzzle, "solution": solution}
    return base.Problem(base.problem_id(NAME, puzzle), prompt, solution, metadata)


def generate(
    seed: int,
    n: int,
    split: str = "train",
    *,
    size: int = 4,
    givens: int | None = None,
    max_removal_tries: int | None = None,
) -> list[base.Problem]:
    """Reproducible Sudoku puzzles with exactly one solution.

    Args:
      seed: random seed.
      n: number of puzzles.
      split: ``"train"`` or ``"eval"``; decided by the hash of the solution grid.
      size: 4 or 9.
      givens: stop removing at this many givens (default 6 for 4x4, 30 for
        9x9).  Fewer givens are harder; the target may be missed (more givens
        stay) when no further removal keeps the solution unique.
      max_removal_tries: at most this many cells are tried for removal
        (default: all cells); bounds the generation time.

    Returns:
      ``n`` puzzles; ``problem.answer`` is the solution string.
    """
    base.check_split(split)
    base.check_count(n)
    box_size(size)
    target = DEFAULT_GIVENS[size] if givens is None else givens
    if not 0 <= target <= size * size:
        raise ValueError(f"givens must be in [0, {size * size}], got {givens}.")
    tries = size * size if max_removal_tries is None else max_removal_tries
    if tries < 0:
        raise ValueError(f"max_removal_tries must be >= 0, got {max_removal_tries}.")
    rng = random.Random(seed)
    out: list[base.Problem] = []
    for _ in range(100 * n + 1000):
        if len(out) == n:
            return out
        _, grid = _search([0] * (size * size), size, 1, rng)
        assert grid is not None  # an empty grid always has a solution
        solution = _to_str(grid)
        if base.split_of(NAME, solution) != split:
            continue
        out.append(_problem(size, _make(rng, size, grid, target, tries), solution))
    if len(out) < n:
        raise ValueError(f"sudoku: could only draw {len(out)} of {n} {split!r} puzzles.")
    return out


def compact_prompt(problem: base.Problem) -> str:
    """``"<puzzle with . for blanks>="``."""
    return f"{problem.metadata['puzzle']}="


def chat_messages(problem: base.Problem) -> base.Messages:
    """One user message asking for the solved grid inside ``<answer>`` tags."""
    size = problem.metadata["size"]
    return base.user_message(
        f"{problem.prompt}\nThink step by step, then give the completed grid inside "
        f"<answer></answer> tags as {size} lines of {size} digits."
    )


def extract(text: str) -> str | None:
    """The last ``<answer>`` content, else the last ``\\boxed{}``, else the whole text."""
    return tagged_or_whole(text)


def parse_grid(answer: str, size: int) -> list[int] | None:
    """Digits of an answer grid (separators ignored), or None if malformed."""
    digits: list[int] = []
    for ch in answer:
        if ch in _SEPARATORS:
            continue
        if not ("1" <= ch <= "9" and ch.isascii()) or int(ch) > size:
            return None
        digits.append(int(ch))
        if len(digits) > size * size:
            return None
    return digits if len(digits) == size * size else None


def is_valid_solution(cells: Sequence[int], size: int) -> bool:
    """Whether a complete grid has every digit once per row, column and box."""
    b = box_size(size)
    want = set(range(1, size + 1))
    for u in range(size):
        row = {cells[u * size + c] for c in range(size)}
        col = {cells[r * size + u] for r in range(size)}
        r0, c0 = (u // b) * b, (u % b) * b
        box = {cells[(r0 + dr) * size + c0 + dc] for dr in range(b) for dc in range(b)}
        if row != want or col != want or box != want:
            return False
    return True


def verify(text: str, problem: base.Problem) -> bool:
    """Whether the completion gives a valid complete grid that keeps all givens."""
    answer = extract(text)
    if answer is None:
        return False
    size = problem.metadata["size"]
    cells = parse_grid(answer, size)
    if cells is None or not is_valid_solution(cells, size):
        return False
    return all(
        p == "." or int(p) == v for p, v in zip(problem.metadata["puzzle"], cells, strict=True)
    )


TASK = base.Task(
    name=NAME,
    generate=generate,
    compact_prompt=compact_prompt,
    chat_messages=chat_messages,
    extract=extract,
    verify=verify,
    format_ok=format_ok,
    description="Sudoku 4x4 / 9x9 with a unique solution.",
)
