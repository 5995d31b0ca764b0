"""Hostile datasets and plan flags end as one line and exit 2, at load, never mid-run.

Findings of the input audit: a prompt longer than the model's positions (7),
characters outside a scratch model's alphabet (8), plan flags that exhaust
memory or crash XLA (10), gold answers the numeric checker can never match
(11), and dataset read errors that spoke through the ``datasets`` logger, said
"(StopIteration: )" for an empty file and counted rows from 0 (16).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError
from ais_jax.rollout.codec import PromptCodec
from ais_jax.run import cli as train
from ais_jax.run import plan
from ais_jax.tasks import CharTokenizer, get_task
from ais_jax.tasks.user_dataset import load_rows, row_lines, rows_to_problems, task_from_config
from ais_jax.training import build

pytest.importorskip("datasets")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [*TINY_RUN, "checkpoint.every=0", "train.steps=1"]


def _sums(n: int = 30, **odd: dict) -> list[dict]:
    """``n`` rows ``{"prompt": "i+i", "answer": 2i}``; ``odd`` maps a 1-based line to its row."""
    rows = [{"prompt": f"{i}+{i}", "answer": 2 * i} for i in range(n)]
    for line, row in odd.items():
        rows[int(line.removeprefix("line")) - 1] = row
    return rows


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _main(tmp_path, capsys, *args: str) -> tuple[int, str]:
    code = train.main([f"out_dir={tmp_path / 'out'}", *TINY, *args])
    return code, capsys.readouterr().err.strip()


def _one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err[-2000:]
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err[-2000:]
    for needle in needles:
        assert needle in err, err


# ----------------------------------------------------------------------------- finding 7


def test_prompt_longer_than_the_positions_is_refused_at_build(tmp_path, capsys):
    long = {"prompt": "1+" * 2100 + "1", "answer": 2101}  # 4,203 tokens with BOS
    data = _jsonl(tmp_path / "d.jsonl", _sums(line6=long, line9=long))
    code, err = _main(tmp_path, capsys, "task.name=dataset", f"task.train_file={data}")
    _one_line(code, err, f"{data}:6: the prompt has 4203 tokens, more than the 4092",
              "4096 positions", "rollout.max_new_tokens=4", "(2 prompts are too long)")


def test_check_problems_limit_is_prompt_plus_new_tokens():
    cfg = load_config(None, [*TINY, "rollout.max_new_tokens=8"])
    tok = CharTokenizer()
    task = task_from_config(load_config(None, ["task.name=dataset"]).task,
                            [{"prompt": f"{i}", "answer": i} for i in range(100)])
    codec = PromptCodec(tok, "compact", task, tok.pad_id, (tok.eos_id,))
    mc = build.scratch_model_config(tok, hidden_size=32, intermediate_size=64, num_layers=1,
                                    num_heads=2, num_kv_heads=1, head_dim=16, max_positions=40)
    fits = rows_to_problems([{"prompt": "1" * 30, "answer": 1}])  # 30 + BOS + "=" = 32 = 40 - 8
    assert len(codec.encode_prompt(fits[0])) == 32
    build.check_problems(cfg, codec, mc, fits)
    over = rows_to_problems([{"prompt": "1" * 31, "answer": 1}], source="f.jsonl", lines=[4])
    with pytest.raises(UsageError, match=r"^f\.jsonl:4: the prompt has 33 tokens, more than "
                                         r"the 32 that fit the model's 40 positions"):
        build.check_problems(cfg, codec, mc, fits + over)
    with pytest.raises(UsageError, match=r"rollout\.max_new_tokens=40 leaves no room"):
        build.check_problems(load_config(None, ["rollout.max_new_tokens=40"]), codec, mc, fits)


# ----------------------------------------------------------------------------- finding 8


def test_character_outside_the_alphabet_names_file_line_and_character(tmp_path, capsys):
    data = _jsonl(tmp_path / "d.jsonl", _sums(line7={"prompt": "1\uff0b1", "answer": 2}))
    code, err = _main(tmp_path, capsys, "task.name=dataset", f"task.train_file={data}")
    _one_line(code, err, f"{data}:7: the prompt has character '\uff0b' (U+FF0B)",
              "character tokenizer", "replace it or drop the row")


def test_character_outside_the_alphabet_in_a_warm_start_answer(tmp_path, capsys):
    data = _jsonl(tmp_path / "d.jsonl", _sums(line3={"prompt": "1+1", "answer": "2\u00b2"}))
    code, err = _main(tmp_path, capsys, "task.name=dataset", f"task.train_file={data}",
                      "task.checker=exact", "sft.steps=2")
    _one_line(code, err, f"{data}:3: the answer has character '\u00b2' (U+00B2)")


def test_reasoning_gym_character_names_the_task(tmp_path, capsys):
    pytest.importorskip("reasoning_gym")
    code, err = _main(tmp_path, capsys, "task.name=reasoning_gym:complex_arithmetic",
                      "task.difficulty={}")
    _one_line(code, err, "task reasoning_gym:complex_arithmetic, problem ",
              "(U+00F7)", "use another task")


def test_a_later_generated_problem_is_a_usage_error_not_a_traceback():
    """Past the build's checks (a generated task), the codec still raises one line."""
    tok = CharTokenizer()
    task = get_task("arithmetic")
    codec = PromptCodec(tok, "compact", task, tok.pad_id, (tok.eos_id,))
    p = task.generate(seed=0, n=1)[0]
    odd = type(p)(p.id, p.prompt, p.answer, {**p.metadata, "expression": "6\u00f72"})
    with pytest.raises(UsageError, match=r"^task arithmetic, problem .*'\u00f7' \(U\+00F7\)"):
        codec.encode_prompt(odd)


# ----------------------------------------------------------------------------- finding 11


def test_numeric_checker_refuses_answers_it_can_never_match(tmp_path, capsys):
    data = _jsonl(tmp_path / "d.jsonl", _sums(line4={"prompt": "1+1", "answer": "[42]"},
                                              line9={"prompt": "1+2", "answer": "42x"}))
    code, err = _main(tmp_path, capsys, "task.name=dataset", f"task.train_file={data}")
    _one_line(code, err, f"{data}:4: answer '[42]' is not a number", "checker=numeric",
              "(2 of 30 rows", "task.checker=exact or math_verify")


def test_numeric_answers_in_every_form_the_checker_reads_still_load():
    rows = [{"prompt": f"p{i}", "answer": a} for i, a in enumerate(
        ["1,234", "$5", "1/2", "\\frac{3}{4}", "-7", "0.25", "50%", 2.0, 1e20, 1e-7, 12])]
    probs = rows_to_problems(rows, checker="numeric")
    assert probs[8].answer == "100000000000000000000" and probs[9].answer == "0.0000001"
    task = task_from_config(load_config(None, ["task.name=dataset"]).task,
                            rows + [{"prompt": f"q{i}", "answer": i} for i in range(100)])
    assert task.verify("100000000000000000000", probs[8])
    assert rows_to_problems([{"prompt": "p", "answer": "[42]"}], checker="exact")


# ----------------------------------------------------------------------------- finding 16


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ais_jax.train", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
@pytest.mark.parametrize("name,text,needle", [
    ("bad.csv", "prompt,answer\n1+1,2\n2+2,4,5\n3+3,6\n",
     "bad.csv:3: 3 fields, but the header has 2"),
    ("empty.jsonl", "", "empty.jsonl has no rows"),
])
def test_dataset_read_errors_are_exactly_one_line(tmp_path, name, text, needle):
    data = tmp_path / name
    data.write_text(text)
    proc = _cli(f"out_dir={tmp_path / 'out'}", *TINY, "task.name=dataset",
                f"task.train_file={data}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0] and "DatasetGenerationError" not in lines[0]


@pytest.mark.parametrize("name,text,needle", [
    ("d.jsonl", '{"prompt": "1+1", "answer": 2}\n{"prompt": 3+3, "answer": 6}\n',
     "d.jsonl:2: invalid JSON"),
    ("d.jsonl", '{"prompt": "1+1", "answer": 2}\n\n{"prompt": "2+2", "answer": "four"}\n',
     "d.jsonl:3: column 'answer' is a string here but a number on line 1"),
    ("d.jsonl", "\n \n", "d.jsonl has no rows"),
    ("d.csv", "prompt,answer\n", "d.csv has no rows"),
    ("d.csv", "", "d.csv has no rows"),
    ("d.parquet", "PAR1 not parquet", "d.parquet cannot be read (ArrowInvalid: Parquet magic"),
])
def test_read_errors_say_the_reason_without_logging(tmp_path, capfd, name, text, needle):
    data = tmp_path / name
    data.write_text(text)
    level = logging.getLogger("datasets").level
    with pytest.raises(UsageError) as e:
        load_rows(str(data))
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert capfd.readouterr().err == ""  # nothing from the datasets logger
    assert logging.getLogger("datasets").level == level  # restored for library users


def test_row_errors_name_the_1_based_file_line(tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"prompt": "1+1", "answer": 2}\n\n{"prompt": "", "answer": 4}\n')
    rows = load_rows(str(jsonl))
    assert row_lines(str(jsonl), len(rows)) == [1, 3]
    with pytest.raises(UsageError, match=rf"^{re.escape(str(jsonl))}:3: column 'prompt' must"):
        task_from_config(load_config(None, ["task.name=dataset",
                                            f"task.train_file={jsonl}"]).task)
    csv = tmp_path / "d.csv"  # the header is line 1; a quoted newline stays in its record
    csv.write_text('prompt,answer\n1+1,2\n\n"two\nlines",4\n3+3,\n')
    rows = load_rows(str(csv))
    assert row_lines(str(csv), len(rows)) == [2, 4, 6]
    with pytest.raises(UsageError, match=rf"^{re.escape(str(csv))}:6: column 'answer' is empty"):
        rows_to_problems(rows, source=str(csv), lines=row_lines(str(csv), len(rows)))
    with pytest.raises(UsageError, match=r"^the dataset passed to run row 2: column 'answer'"):
        task_from_config(load_config(None, ["task.name=dataset"]).task,
                         [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": None}])


# ----------------------------------------------------------------------------- finding 10


@pytest.mark.parametrize("args,needle", [
    (["--devices", "1000000000"], "--devices 1000000000 is more than the 65,536"),
    (["--devices", "100000"], "--devices 100000 is more than the 65,536"),
    (["--devices", "3", "mesh.fsdp=2"], "--devices 3 is not a multiple of the mesh's 2 devices"),
    (["--prompt-len", "1000000000"],
     "--prompt-len 1000000000 + rollout.max_new_tokens=16 exceeds the model's 4096 positions; "
     "use --prompt-len <= 4080"),
    (["--device-memory", "1e400GB"], "'1e400GB' is not a finite size"),
    (["--device-memory", "0.0000001B"], "not a finite size of at least one byte"),
])
def test_plan_refuses_huge_flags_before_making_devices(monkeypatch, capsys, args, needle):
    def no_devices(n):
        raise AssertionError(f"configure_devices({n}) was reached")

    monkeypatch.setattr(plan, "configure_devices", no_devices)
    monkeypatch.setattr(plan, "make_plan", lambda *a, **k: pytest.fail("make_plan was reached"))
    assert plan.main(["rollout.max_new_tokens=16", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err, err


def test_plan_checks_for_library_callers():
    cfg = plan.load_plan_config(None, ["mesh.fsdp=4"])
    plan.check_devices(8, cfg)
    with pytest.raises(UsageError, match="needs 4 devices but only 2"):
        plan.check_devices(2, cfg)
    mc, _ = plan.resolve_model_config(cfg)
    plan.check_prompt_len(mc.max_position_embeddings - cfg.rollout.max_new_tokens, cfg, mc)
    with pytest.raises(UsageError, match="--prompt-len must be >= 1"):
        plan.check_prompt_len(0, cfg, mc)
