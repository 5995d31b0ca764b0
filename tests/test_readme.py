"""The README stays short and true: its set-up commands are CI's, its links and anchors resolve,
the configs, modules, flags and config keys its commands name exist, and its example runs."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MAIN_JOB = "pip install -e . && python -m ais_jax.train --config configs/tiny_arithmetic.yaml"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", _text(path), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def broken_links(path: str) -> list[str]:
    """Each relative link (and #anchor) of the markdown file ``path`` that does not resolve."""
    out = []
    for target in LINK.findall(_text(path)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(dest):
            out.append(f"{target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            out.append(f"{target}: no heading with that anchor")
    return out


def test_readme_is_short_and_sends_the_reader_to_gpu_tpu_and_pods_first():
    text = _text(README)
    assert len(text.splitlines()) <= 200
    first_screen = "\n".join(text.splitlines()[:30])
    for anchor in ("#on-a-gpu-or-tpu", "#run-on-a-pod", "docs/index.md"):
        assert anchor in first_screen, anchor


def test_setup_commands_are_the_main_job_and_ci():
    blocks = _blocks(_text(README), "bash")
    assert blocks[0].strip() == MAIN_JOB
    ci = _text(os.path.join(ROOT, ".ci", "run")).strip().splitlines()[-1]
    # CI runs the README's test command, quieter
    assert blocks[1].strip() == ci.replace("pip install -q ", "pip install ")


@pytest.mark.parametrize("page", ["README.md", *sorted(
    f"docs/{f}" for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))])
def test_relative_links_and_anchors_resolve(page):
    assert broken_links(os.path.join(ROOT, page)) == []


def test_the_link_check_fails_on_a_missing_file_or_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title here\n\n[x](b.md) [y](#title-here) [z](#nope)\n"
                                   "[w](https://example.com/none)\n")
    assert broken_links(str(tmp_path / "a.md")) == ["b.md: no such file",
                                                    "#nope: no heading with that anchor"]


def _commands() -> list[list[str]]:
    """Every ``python ...`` command line of the README's bash blocks, as words."""
    out = []
    for block in _blocks(_text(README), "bash"):
        for line in block.splitlines():
            for part in line.split("#")[0].split("&&"):
                words = shlex.split(part)
                if words and words[0] == "python":
                    out.append(words)
    return out


def test_commands_name_existing_configs_modules_flags_and_keys():
    from ais_jax.config import yaml_io
    from ais_jax.config.schema import Config

    keys = set(yaml_io.all_keys(Config))
    cmds = _commands()
    assert len(cmds) >= 8
    for words in cmds:
        if words[1:3] == ["-m", "pytest"]:
            continue
        if words[1] == "-m":
            mod = words[2]
            assert mod.startswith("ais_jax."), words
            path = os.path.join(ROOT, *mod.split(".")) + ".py"
            assert os.path.isfile(path), mod
            source = "".join(_text(os.path.join(ROOT, "ais_jax", "run", f))
                             for f in os.listdir(os.path.join(ROOT, "ais_jax", "run"))
                             if f.endswith(".py"))
            for flag in (w.split("=")[0] for w in words[3:] if w.startswith("--")):
                assert f'"{flag}"' in source, f"{mod}: {flag}"
        for i, w in enumerate(words):
            if w == "--config":
                assert os.path.isfile(os.path.join(ROOT, words[i + 1])), words[i + 1]
            elif "=" in w and not w.startswith("-") and re.fullmatch(r"[a-z_]+(\.\w+)+=.*", w):
                assert w.split("=")[0] in keys, w


def test_config_key_check_catches_a_misspelled_key():
    from ais_jax.config import yaml_io
    from ais_jax.config.schema import Config

    keys = set(yaml_io.all_keys(Config))
    assert "rollout.precision" in keys and "rollout.precison" not in keys


def test_library_example_runs_and_prints_what_its_comment_says():
    code = _blocks(_text(README), "python")[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    said = re.search(r"print\(res\.alpha, res\.weights\)\s+# ([\d.]+) \[([\d. ]+)\]", code)
    printed = [float(x) for x in re.findall(r"[\d.]+", out.getvalue())]
    want = [float(said.group(1)), *map(float, said.group(2).split())]
    assert printed == pytest.approx(want, abs=6e-4)
