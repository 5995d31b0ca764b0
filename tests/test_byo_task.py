"""Bring your own task: the worked example of docs/byo_task.md, reward functions, dataset task."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError
from ais_jax.rollout.codec import PromptCodec
from ais_jax.run import cli as train
from ais_jax.tasks.user_dataset import load_rows, rows_to_problems, task_from_config
from ais_jax.tasks.user_rewards import build_rewards, load_reward, score_rewards

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "byo_task.md"
TINY = [*TINY_RUN, "checkpoint.every=0"]
SUMS = ["task.name=dataset", "task.prompt_key=question", "task.answer_key=target"]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def _doc_file(name: str) -> str:
    (text,) = [b for b in _blocks("python") if b.startswith(f"# {name}\n")]
    return text


def _doc_command() -> list[str]:
    (cmd,) = [b for b in _blocks("bash") if "python -m ais_jax.train" in b]
    lines = cmd.replace("\\\n", " ").splitlines()
    assert lines[0] == "python make_data.py"
    return shlex.split(lines[1])


@pytest.fixture
def example(tmp_path):
    """The doc's files written into tmp_path and its data made there."""
    for name in ("make_data.py", "my_rewards.py"):
        (tmp_path / name).write_text(_doc_file(name))
    subprocess.run([sys.executable, "make_data.py"], cwd=tmp_path, check=True, timeout=120)
    return tmp_path


def _metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.slow  # ~10 s in the full suite on 2 busy cores
def test_worked_example_runs_from_the_cli(example):
    cmd = _doc_command()
    assert cmd[:3] == ["python", "-m", "ais_jax.train"]
    cmd = [sys.executable, *cmd[1:], *TINY, "train.steps=2", "out_dir=out"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(cmd, cwd=example, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = _metrics(example / "out")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0.0 <= r["reward/close"] <= 1.0 and 0.0 <= r["reward/brevity"] <= 1.0
        assert math.isfinite(r["reward_mean"])


def _write_sums(path, n=40, **cols):
    table = {"question": [f"{i}+{i}" for i in range(n)], "target": [2 * i for i in range(n)]}
    table.update(cols)
    pq.write_table(pa.table(table), path)
    return str(path)


def _rewards_file(path, body):
    path.write_text(body)
    return str(path)


GOOD = "def one(completion, prompt, row):\n    return 1.0\n"


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
@pytest.mark.parametrize("extra,needle", [
    (["reward.functions.r=no_such_module_xyz:fn"], "cannot import module 'no_such_module_xyz'"),
    (["reward.functions.r=os.path:no_such_fn"], "has no attribute 'no_such_fn'"),
    (["reward.functions.r={rf}:two"], "must take (completion, prompt, row)"),
    (["reward.functions.r={rf}:one", "reward.weights.other=2"], "reward.weights.'other'"),
    (["task.answer_key=solution"], "task.answer_key='solution' is not a column"),
    (["task.prompt_key=problem"], "task.prompt_key='problem' is not a column"),
    (["task.train_file={bad}"], "cannot be read"),
    (["reward.functions.r={rf}:boom", "reward.task_weight=0"], "reward function r raised"),
    (["reward.functions.r={rf}:nan"], "reward function r returned nan"),
])
def test_bad_input_exits_2_with_one_line(extra, needle, tmp_path, capsys):
    data = _write_sums(tmp_path / "sums.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    rf = _rewards_file(tmp_path / "rf.py", GOOD + (
        "def two(completion, prompt):\n    return 1.0\n"
        "def boom(completion, prompt, row):\n    raise KeyError('x')\n"
        "def nan(completion, prompt, row):\n    return float('nan')\n"))
    args = [a.format(rf=rf, bad=bad) for a in extra]
    code = train.main([f"out_dir={tmp_path / 'out'}", *TINY, "train.steps=1", *SUMS,
                       f"task.train_file={data}", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert needle in err


def test_load_reward_by_module_and_batched(tmp_path, monkeypatch):
    (tmp_path / "pkg_rw.py").write_text(
        GOOD + "def many(cs, ps, rows):\n    return [len(c) for c in cs]\nmany.batched = True\n"
        "def short(cs, ps, rows):\n    return [1.0]\nshort.batched = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    one = load_reward("one", "pkg_rw:one")
    many = load_reward("many", f"{tmp_path / 'pkg_rw.py'}:many", 0.5)
    assert not one.batched and many.batched and many.weight == 0.5
    probs = rows_to_problems([{"prompt": "1+1", "answer": 2}], checker="numeric") * 2
    vals = score_rewards((one, many), ["ab", "abc"], probs)
    assert vals.tolist() == [[1.0, 2.0], [1.0, 3.0]]
    with pytest.raises(UsageError, match="returned 1 values for 2 completions"):
        score_rewards((load_reward("s", "pkg_rw:short"),), ["a", "b"], probs)


@pytest.mark.slow  # ~12 s in the full suite on 2 busy cores
def test_reward_fns_argument_and_dataset_rows(tmp_path):
    cfg = load_config(None, [f"out_dir={tmp_path}", *TINY, *SUMS, "train.steps=2",
                             "reward.task_weight=0", "task.checker=none"])
    rows = [{"question": f"{i}+1", "target": i + 1, "tag": "t"} for i in range(40)]
    seen = []

    def tagged(completion, prompt, row):
        seen.append((prompt, row["tag"]))
        return 0.5

    res = train.run(cfg, reward_fns={"tagged": tagged}, dataset=datasets.Dataset.from_list(rows))
    assert [r["reward/tagged"] for r in res.metrics] == [0.5, 0.5]
    assert all(r["reward_mean"] == pytest.approx(0.5) for r in res.metrics)
    assert all(tag == "t" and re.fullmatch(r"\d+\+1", p) for p, tag in seen)
    with pytest.raises(UsageError, match="is both in reward"):
        build_rewards(load_config(None, ["reward.functions.tagged=os:getcwd"]).reward,
                      {"tagged": tagged})


def test_dataset_formats_checkers_and_chat_template(tmp_path):
    rows = [{"q": f"What is {i}+{i}?", "a": str(2 * i),
             "msgs": [{"role": "user", "content": f"Add {i} and {i}."}]} for i in range(30)]
    ds = datasets.Dataset.from_list(rows)
    ds.to_json(str(tmp_path / "d.jsonl"))
    ds.to_csv(str(tmp_path / "d.csv"))
    ds.save_to_disk(str(tmp_path / "d_hf"))
    for name in ("d.jsonl", "d_hf"):
        assert [r["q"] for r in load_rows(str(tmp_path / name))] == [r["q"] for r in rows]
    assert load_rows(str(tmp_path / "d.csv"))[3]["a"] == 6  # CSV infers numbers
    cfg = load_config(None, ["task.name=dataset", f"task.train_file={tmp_path / 'd_hf'}",
                             "task.prompt_key=q", "task.answer_key=a", "task.messages_key=msgs",
                             "task.system_prompt=Be brief.", "task.checker=exact"])
    task = task_from_config(cfg.task)
    p = task.generate(seed=0, n=1)[0]
    assert p.prompt.startswith("Add ") and p.metadata["row"]["q"].startswith("What is")
    assert task.verify(f" {p.answer} ", p) and not task.verify("nope", p)
    assert task.verify(f"so \\boxed{{{p.answer}}}", p)
    assert len(task.generate(seed=1, n=100)) == 100  # training draws cycle
    spec = importlib.util.spec_from_file_location("_hf_tiny", ROOT / "benchmarks" / "_hf_tiny.py")
    hf = importlib.util.module_from_spec(spec)
    pytest.importorskip("transformers")
    spec.loader.exec_module(hf)
    tok = hf.build_tokenizer(["Be brief. Add and"], 256)
    text = PromptCodec(tok, "chat", task, 0, ()).prompt_text(p)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAdd ")
    assert text.endswith("<|im_start|>assistant\n")
    numeric = task_from_config(load_config(None, [
        "task.name=dataset", f"task.train_file={tmp_path / 'd.csv'}", "task.prompt_key=q",
        "task.answer_key=a"]).task)
    q = numeric.generate(seed=0, n=1)[0]
    assert numeric.verify(f"{q.answer}.0", q) and not numeric.verify("-1", q)
