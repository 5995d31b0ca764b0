"""The package's layers: no import circles, and no import from a higher layer into a lower one.

The script folders beside the package (``experiments/``, ``benchmarks/``: modules run as scripts
that import each other by bare name) are checked for import circles by the same walk.

The layers are declared once, here (docs/architecture.md explains them): each folder of
``ais_jax/`` is one layer, and a layer may import only the layers it lists. Imports are read from
the source with `ast` (module-level, function-level and ``TYPE_CHECKING`` imports alike), so the
check needs no JAX and runs in well under a second.
"""

from __future__ import annotations

import ast
import os
from graphlib import CycleError, TopologicalSorter

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "ais_jax")

# Layer -> the layers it may import (besides itself). Lowest first.
LAYERS: dict[str, tuple[str, ...]] = {
    "core": (),
    "method": ("core",),
    "models": ("core",),
    "rollout": ("core", "method", "models"),
    "tasks": ("core",),
    "config": ("core", "tasks"),
    "training": ("core", "method", "models", "rollout", "tasks", "config"),
    "run": ("core", "method", "models", "rollout", "tasks", "config", "training"),
    # the top-level `python -m ais_jax.NAME` wrappers
    "entry": ("run",),
}
ENTRY_MODULES = ("train", "plan", "mismatch", "plots")


def modules(package_dir: str = PACKAGE) -> dict[str, str]:
    """Dotted module name -> file path, for every .py file under ``package_dir``."""
    out = {}
    base = os.path.dirname(package_dir)
    for d, _, files in os.walk(package_dir):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(d, f)
                name = os.path.relpath(p, base)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = p
    return out


def imports_of(name: str, path: str, known: dict[str, str]) -> set[str]:
    """The ``ais_jax`` modules that module ``name`` imports (a package counts as its
    ``__init__``; ``from pkg import mod`` counts as ``pkg.mod``)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                      for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m in known and m != name}


def layer_of(name: str) -> str | None:
    """``ais_jax.models.fp8`` -> ``models``; the entry wrappers -> ``entry``; the package's
    own ``__init__`` (a lazy facade) -> None."""
    parts = name.split(".")
    if len(parts) == 1:
        return None
    if len(parts) == 2 and parts[1] in ENTRY_MODULES:
        return "entry"
    return parts[1]


def violations(package_dir: str = PACKAGE) -> list[str]:
    """Every upward (undeclared) import edge and every import circle, as readable lines."""
    known = modules(package_dir)
    graph = {m: imports_of(m, p, known) for m, p in known.items()}
    out = []
    for m, deps in sorted(graph.items()):
        lm = layer_of(m)
        if lm is None:
            continue
        if lm not in LAYERS:
            out.append(f"{m}: folder {lm!r} is not a declared layer")
            continue
        for d in sorted(deps):
            ld = layer_of(d)
            if ld is None:
                out.append(f"{m} -> {d}: import the defining module, not the package facade")
            elif ld != lm and ld not in LAYERS[lm]:
                out.append(f"{m} -> {d}: layer {lm!r} may not import layer {ld!r}")
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        out.append("import circle: " + " -> ".join(e.args[1]))
    return out


def script_circles(folder: str) -> list[str]:
    """The import circles among the scripts of ``folder`` (each ``NAME.py`` is module ``NAME``,
    imported by bare name with the folder on ``sys.path``), as readable lines."""
    known = {f[:-3]: os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py")}
    graph = {m: imports_of(m, p, known) for m, p in known.items()}
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        return [f"{os.path.basename(folder)}/: import circle: " + " -> ".join(e.args[1])]
    return []


def test_layer_declaration_is_acyclic():
    order = list(TopologicalSorter({k: set(v) for k, v in LAYERS.items()}).static_order())
    assert order.index("core") == 0 and order[-1] == "entry"


def test_no_upward_imports_and_no_circles():
    assert violations() == []


def test_every_folder_is_a_layer_and_the_top_level_is_thin():
    top = sorted(os.listdir(PACKAGE))
    for entry in top:
        path = os.path.join(PACKAGE, entry)
        if os.path.isdir(path):
            if entry != "__pycache__":
                assert entry in LAYERS, f"ais_jax/{entry}/ is not a declared layer"
                assert os.path.exists(os.path.join(path, "__init__.py"))
        elif entry.endswith(".py"):
            assert entry[:-3] in ("__init__", *ENTRY_MODULES), (
                f"ais_jax/{entry}: the top level holds only __init__ and the -m entry modules")
    for layer in LAYERS:
        if layer != "entry":
            with open(os.path.join(PACKAGE, layer, "__init__.py"), encoding="utf-8") as f:
                doc = ast.get_docstring(ast.parse(f.read()))
            assert doc and "import" in doc, f"ais_jax/{layer}/__init__.py: say what it may import"


@pytest.mark.parametrize("bad,expected", [
    ("from ais_jax.training.build import build_run\n", "layer 'models' may not import layer "
     "'training'"),
    ("from ais_jax.models import model\n", "import circle"),
])
def test_the_check_fails_on_an_upward_import_or_a_circle(tmp_path, bad, expected):
    # A copy of a tiny package tree with one bad edge added to models/layout.py.
    pkg = tmp_path / "ais_jax"
    for rel in ("__init__.py", "core/__init__.py", "models/__init__.py", "training/__init__.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text('"""x; may import nothing."""\n')
    (pkg / "models" / "layout.py").write_text("import math\n" + bad)
    (pkg / "models" / "model.py").write_text("from ais_jax.models import layout\n")
    (pkg / "training" / "build.py").write_text("from ais_jax.models.model import layout\n")
    found = violations(str(pkg))
    assert any(expected in v for v in found), found


@pytest.mark.parametrize("folder", ["experiments", "benchmarks"])
def test_script_folders_have_no_import_circles(folder):
    assert script_circles(os.path.join(ROOT, folder)) == []


def test_the_script_check_fails_on_a_circle(tmp_path):
    # function-level imports count too: the drivers import each other lazily
    (tmp_path / "common.py").write_text("import json\n")
    (tmp_path / "driver.py").write_text("import common\nimport report\n")
    (tmp_path / "report.py").write_text("def f():\n    from driver import x\n")
    assert script_circles(str(tmp_path)) != []
    assert "driver" in script_circles(str(tmp_path))[0]
    (tmp_path / "report.py").write_text("import common\n")
    assert script_circles(str(tmp_path)) == []
