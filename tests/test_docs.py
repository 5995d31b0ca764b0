"""The generated API reference, docs/api.md, matches the docstrings of the package."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location(
        "gen_api_docs", ROOT / "scripts" / "gen_api_docs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def text(gen):
    return gen.render()


def test_api_docs_are_up_to_date(text):
    assert (ROOT / "docs" / "api.md").read_text(encoding="utf-8") == text, (
        "docs/api.md is out of date; run python scripts/gen_api_docs.py"
    )


def test_api_docs_cover_every_module_and_export(gen, text):
    import ais_jax

    for name in gen.module_names():
        assert f"\n## `{name}`\n" in text, name
    for name in ais_jax.__all__:
        assert f"### `{name}` (top level)" in text, name
    assert "## `ais_jax.tasks.base`" in text and "## `ais_jax.config.yaml_io`" in text
    assert " at 0x" not in text and str(ROOT) not in text


def test_check_fails_on_stale_docs_and_unimportable_modules(gen, monkeypatch, tmp_path, capsys):
    stale = tmp_path / "api.md"
    stale.write_text("# old\n", encoding="utf-8")
    monkeypatch.setattr(gen, "DOCS_PATH", stale)
    assert gen.main(["--check"]) == 1
    assert "run python scripts/gen_api_docs.py" in capsys.readouterr().err
    monkeypatch.setattr(gen, "module_names", lambda: ["ais_jax", "ais_jax.no_such_module"])
    assert gen.main(["--check"]) == 1
    assert "cannot import ais_jax.no_such_module" in capsys.readouterr().err
    assert stale.read_text(encoding="utf-8") == "# old\n"
