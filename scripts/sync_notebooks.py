"""Write notebooks/*.ipynb from their jupytext sources notebooks/*.py (outputs cleared).

Each notebook is edited as ``notebooks/NN_name.py`` in jupytext's percent format
(``# %%`` code cells, ``# %% [markdown]`` cells, linted by ruff like any module);
the committed ``notebooks/NN_name.ipynb`` that Colab opens is generated from it::

    python scripts/sync_notebooks.py          # rewrite notebooks/*.ipynb from notebooks/*.py
    python scripts/sync_notebooks.py --check  # exit 1 naming the stale notebooks

If you edited a notebook in Jupyter or Colab instead, copy the edit back to its
source first (``jupytext --to py:percent notebooks/NN_name.ipynb``), then run this
script. ``tests/test_notebooks.py`` calls ``check()``, and executes the notebooks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
FIX = "python scripts/sync_notebooks.py"


def cells(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """The (kind, source) of every cell of ``nb``."""
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def read_source(py_path: Path) -> nbformat.NotebookNode:
    """The notebook that the jupytext percent source ``py_path`` describes."""
    return jupytext.read(py_path, fmt="py:percent")


def render(py_path: Path) -> str:
    """The ``.ipynb`` text generated from ``py_path``: outputs cleared, cell ids ``cell-NN``."""
    nb = read_source(py_path)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"  # deterministic, so a regenerated notebook diffs cleanly
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.nbformat, nb.nbformat_minor = 4, max(nb.nbformat_minor, 5)  # 4.5: cells have ids
    nbformat.validate(nb)
    text = jupytext.writes(nb, fmt="ipynb")
    return text if text.endswith("\n") else text + "\n"


def check(nb_dir: Path = NB_DIR) -> list[str]:
    """What is out of sync in ``nb_dir``: one line per problem, empty when all is in sync.

    Every ``.ipynb`` must have a ``.py`` source and vice versa, the cells of each
    pair (kind and source) must be identical, and the ``.ipynb`` must carry no
    outputs or execution counts.
    """
    problems = []
    sources = {p.stem for p in nb_dir.glob("*.py")}
    notebooks = {p.stem for p in nb_dir.glob("*.ipynb")}
    for stem in sorted(notebooks - sources):
        problems.append(f"{stem}.ipynb: no source {stem}.py (write it with "
                        f"jupytext --to py:percent notebooks/{stem}.ipynb)")
    for stem in sorted(sources - notebooks):
        problems.append(f"{stem}.ipynb: missing; run {FIX}")
    for stem in sorted(sources & notebooks):
        want = cells(read_source(nb_dir / f"{stem}.py"))
        nb = nbformat.read(nb_dir / f"{stem}.ipynb", as_version=4)
        have = cells(nb)
        if have != want:
            n = next((i for i, (a, b) in enumerate(zip(have, want, strict=False)) if a != b),
                     min(len(have), len(want)))
            problems.append(f"{stem}.ipynb: differs from {stem}.py (first at cell {n}; "
                            f"{len(have)} vs {len(want)} cells); run {FIX} (to keep an edit "
                            f"made in the .ipynb: jupytext --to py:percent notebooks/{stem}.ipynb"
                            " first)")
        elif any(cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
                 for cell in nb.cells):
            problems.append(f"{stem}.ipynb: has outputs or execution counts; run {FIX}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if a notebook is out of sync with its source")
    args = ap.parse_args(argv)
    if args.check:
        problems = check()
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    for py_path in sorted(NB_DIR.glob("*.py")):
        out = py_path.with_suffix(".ipynb")
        out.write_text(render(py_path), encoding="utf-8")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
