"""GSM8K / MATH: extraction, equivalence, JSONL loaders, dataset tasks, gsm_synth."""

import json
from fractions import Fraction

import pytest

from ais_jax.tasks import base, gsm_synth, math_qa
from ais_jax.tasks.equivalence import answers_equal, normalize_latex, parse_number
from ais_jax.tasks.extract import last_boxed


def _p(answer):
    return base.Problem("t", "q", answer, {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{5} and an unclosed \\boxed{7", "5"),
        ("\\boxed 7 is it", "7"),
        ("\\fbox{9}", "9"),
        ("<answer>12</answer>", "12"),
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
        ("#### 1,000\n", "1,000"),
        ("So the answer is 18.", "18"),
        ("The answer is: $3.5$.", "$3.5$"),
        ("The final ANSWER IS **7**", "7"),
        ("we get 3 apples and then 5", "5"),
        ("total -1,234.5 dollars", "-1,234.5"),
        ("ratio 3/4", "3/4"),
        ("8 + 6 = 14", "14"),  # a bare worked line: its right-hand side
        ("3 \\times 4 = 12", "12"),  # LaTeX commands are not words
        ("2+2=", "2"),  # nothing after "=": the last number
        ("9 + 9 = 10 in this context.", "10"),  # words: the last number
        ("(1, 2)", "(1, 2)"),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extract(text, expected):
    assert math_qa.extract(text) == expected


def test_extract_priority():
    text = "The answer is 3. #### 4 <answer>5</answer> \\boxed{6} and 7"
    assert math_qa.extract(text) == "6"
    assert math_qa.extract(text.replace("\\boxed{6}", "")) == "5"
    assert math_qa.extract("The answer is 3. #### 4 then 9") == "4 then 9"
    assert math_qa.extract("The answer is 3. then 9") == "3"


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("72", "72"),
        ("1,000", "1000"),
        ("$1,000", "1000"),
        ("\\$18", "18"),
        ("50\\%", "50"),
        ("50%", "50"),
        ("3/4", "\\frac{3}{4}"),
        ("0.75", "\\frac34"),
        ("\\dfrac{3}{4}", "\\frac{3}{4}"),
        ("\\tfrac{-3}{4}", "-0.75"),
        ("-\\frac{3}{4}", "-3/4"),
        ("+5", "5"),
        ("5.", "5"),
        ("5.0", "5"),
        ("0.50", ".5"),
        ("\u22125", "-5"),
        ("x = 5", "5"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("\\text{(B)}", "(B)"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("(1, 0.5)", "(1, \\frac{1}{2})"),
        ("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt3}{2}"),
        ("10 \\text{ cm}", "10cm"),
        ("\\boxed{5}", "\\boxed{5}"),
    ],
)
def test_equivalent(pred, gold):
    assert answers_equal(pred, gold)


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("73", "72"),
        ("1,2", "12"),
        ("12,34", "1234"),
        ("3/4", "4/3"),
        ("1/0", "0"),
        ("\\frac{1}{0}", "1"),
        ("(1, 2)", "[1, 2]"),
        ("(1, 2)", "(1, 2, 3)"),
        ("(1, 2)", "(2, 1)"),
        ("nan", "0"),
        ("inf", "1"),
        ("１", "1"),
        ("٣", "3"),
        ("1e3", "1000"),
        ("", "0"),
        (None, "0"),
        ("9" * 5000, "9" * 5000),  # overlong answers never match
    ],
)
def test_not_equivalent(pred, gold):
    assert not answers_equal(pred, gold)


def test_parse_number_and_normalize():
    assert parse_number("1,234,567.25") == Fraction(123456725, 100)
    assert parse_number("-\\frac{1.5}{3}") == Fraction(-1, 2)
    assert parse_number("abc") is None
    assert parse_number("1" * 100) is None  # too long to be read as a number
    assert normalize_latex("\\left[ \\dfrac12, 3 \\right)") == "[\\frac{1}{2},3)"
    assert normalize_latex("\\text{\\textbf{yes}}.") == "yes"


@pytest.mark.parametrize(
    ("text", "answer", "ok"),
    [
        ("... so \\boxed{\\dfrac{1}{2}}", "0.5", True),
        ("#### 1,234", "1234", True),
        ("The answer is $18.", "18", True),
        ("I think it's 17. Actually 18", "18", True),
        ("\\boxed{17} but maybe 18", "18", False),  # the box wins over the last number
        ("nothing", "18", False),
    ],
)
def test_verify(text, answer, ok):
    assert math_qa.verify(text, _p(answer)) is ok


def test_format_ok():
    assert math_qa.format_ok("so \\boxed{3}")
    assert not math_qa.format_ok("so 3")
    assert not math_qa.format_ok("\\boxed{}")


# ---- loaders ----------------------------------------------------------------------------


def _write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_gsm8k(tmp_path):
    rows = [
        {"question": "Q1: 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"},
        {"question": "Q2 costs?", "answer": "so\n#### 1,000"},
    ]
    path = _write(tmp_path, "gsm.jsonl", [json.dumps(r) for r in rows] + [""])
    problems = math_qa.load_jsonl(path)
    assert [p.answer for p in problems] == ["4", "1,000"]
    assert problems[0].prompt == "Q1: 2+2?"
    assert problems[0].metadata["solution"] == "2+2=<<2+2=4>>4"
    assert problems[1].metadata["line"] == 2
    assert math_qa.verify("\\boxed{1000}", problems[1])


def test_load_math(tmp_path):
    rows = [
        {"problem": "P1", "solution": "we get $\\boxed{\\frac{1}{2}}$."},
        {"problem": "P2", "solution": "long \\boxed{3} text", "answer": "3"},
        {"problem": "AIME", "answer": 204},
        {"problem": "float", "answer": 0.5},
    ]
    problems = math_qa.load_jsonl(_write(tmp_path, "math.jsonl", [json.dumps(r) for r in rows]))
    assert [p.answer for p in problems] == ["\\frac{1}{2}", "3", "204", "0.5"]
    assert math_qa.verify("\\boxed{0.5}", problems[0])
    assert math_qa.verify("The answer is 204.", problems[2])


@pytest.mark.parametrize(
    ("line", "fmt", "message"),
    [
        ('{"question": "q", "answer": "no hashes"}', "auto", "'####'"),
        ('{"question": "q", "answer": "x ####  "}', "auto", "'####'"),
        ('{"question": "", "answer": "#### 1"}', "auto", "'question'"),
        ('{"question": 3, "answer": "#### 1"}', "auto", "'question'"),
        ('{"question": "q"}', "gsm8k", "'answer'"),
        ('{"problem": "p", "solution": "no box"}', "auto", "boxed"),
        ('{"problem": "p"}', "auto", "'answer' or a 'solution'"),
        ('{"problem": "p", "answer": null}', "auto", "'answer'"),
        ('{"problem": "p", "answer": true}', "auto", "'answer'"),
        ('{"problem": "p", "answer": [1]}', "auto", "'answer'"),
        ('{"text": "x"}', "auto", "'question'"),
        ("[1, 2]", "auto", "JSON object"),
        ('{"question": "q", "answer": "#### 1"', "auto", "invalid JSON"),
        ("not json", "auto", "invalid JSON"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, line, fmt, message):
    good = json.dumps({"question": "fine", "answer": "#### 1"})
    if fmt == "math":
        good = json.dumps({"problem": "fine", "answer": "1"})
    path = _write(tmp_path, "bad.jsonl", [good, "", line, good])
    with pytest.raises(ValueError) as info:
        math_qa.load_jsonl(path, fmt=fmt)
    text = str(info.value)
    assert text.startswith(f"{path}:3:"), text
    assert message in text


def test_loader_file_errors(tmp_path):
    empty = _write(tmp_path, "empty.jsonl", [""])
    with pytest.raises(ValueError, match=r"empty\.jsonl.*no problems"):
        math_qa.load_jsonl(empty)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b'{"question": "q", "answer": "#### 1"}\n\xff\xfe\n')
    with pytest.raises(ValueError, match=r"bin.jsonl:2: not valid UTF-8"):
        math_qa.load_jsonl(binary)
    with pytest.raises(ValueError, match="fmt"):
        math_qa.load_jsonl(empty, fmt="csv")
    with pytest.raises(FileNotFoundError):
        math_qa.load_jsonl(tmp_path / "missing.jsonl")


def test_dataset_task_splits(tmp_path):
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(300)]
    problems = math_qa.load_jsonl(_write(tmp_path, "d.jsonl", [json.dumps(r) for r in rows]))
    task = math_qa.dataset_task("mydata", problems, equivalence="builtin")
    train, ev = task.generate(0, None, "train"), task.generate(0, None, "eval")
    assert len(train) + len(ev) == 300 and ev
    assert not {p.prompt for p in train} & {p.prompt for p in ev}
    assert task.generate(5, 10) == task.generate(5, 10)
    assert task.generate(5, 10) != task.generate(6, 10)
    assert task.verify(f"\\boxed{{{train[0].answer}}}", train[0])
    with pytest.raises(ValueError, match="only"):
        task.generate(0, 1000, "eval")

    held = problems[:20]
    task2 = math_qa.dataset_task("mydata", problems, held, equivalence="builtin")
    assert sorted(task2.generate(0, None, "eval"), key=lambda p: p.id) == sorted(
        held, key=lambda p: p.id
    )
    assert len(task2.generate(0, None, "train")) == 280
    assert not {p.prompt for p in task2.generate(0, None, "train")} & {p.prompt for p in held}


# ---- gsm_synth ------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_gsm_synth(steps):
    problems = gsm_synth.generate(2, 50, steps=steps, max_value=30)
    assert problems == gsm_synth.generate(2, 50, steps=steps, max_value=30)
    for p in problems:
        assert int(p.answer) >= 1
        assert p.metadata["solution"].endswith(f"#### {p.answer}")
        assert p.prompt.endswith("have now?")
        assert gsm_synth.TASK.verify(p.answer, p)
        assert gsm_synth.TASK.verify(f"... \\boxed{{{p.answer}}}", p)
        assert not gsm_synth.TASK.verify(f"\\boxed{{{int(p.answer) + 1}}}", p)
        # Replaying the worked solution's last equation gives the answer.
        last = p.metadata["solution"].splitlines()[-2].split(", ")[-1]
        assert last.split("=")[1] == p.answer
        assert len(p.metadata["solution"].splitlines()) == steps + 1
        assert gsm_synth.TASK.compact_prompt(p) == p.prompt + "="
    assert "\\boxed{}" in gsm_synth.TASK.chat_messages(problems[0])[0]["content"]


def test_last_boxed_nested():
    assert last_boxed("\\boxed{a{b{c}}d}") == "a{b{c}}d"
