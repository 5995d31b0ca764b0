"""CharTokenizer: fixed ids, round trip, decode rules, save / load."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ais_jax.tasks import TASKS, CharTokenizer
from ais_jax.tasks.tokenizer import DEFAULT_ALPHABET, FILE_NAME

TOK = CharTokenizer()


def test_fixed_ids():
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id) == (0, 1, 2)
    assert TOK.vocab_size == 3 + 96 == 99
    assert TOK.encode("\n") == [3]
    assert TOK.encode(" ") == [4]
    assert TOK.encode("0") == [3 + 1 + ord("0") - 32]
    assert TOK.encode("12+7=", add_bos=True, add_eos=True) == [1, 21, 22, 15, 27, 33, 2]


@given(st.text(alphabet=DEFAULT_ALPHABET, max_size=200))
def test_round_trip(text):
    ids = TOK.encode(text)
    assert all(3 <= i < TOK.vocab_size for i in ids)
    assert TOK.decode(ids) == text
    assert TOK.decode(TOK.encode(text, add_bos=True, add_eos=True)) == text


def test_all_compact_prompts_and_answers_encode():
    for name, task in TASKS.items():
        kwargs = {"size": 9} if name == "sudoku" else {}
        for p in task.generate(0, 20, **kwargs):
            text = task.compact_prompt(p) + p.answer
            assert TOK.decode(TOK.encode(text)) == text


def test_decode_rules():
    ids = TOK.encode("ab")
    assert TOK.decode([1, *ids, 2, *TOK.encode("cd")]) == "ab"  # stops at eos
    assert TOK.decode([0, 0, *ids, 0]) == "ab"  # drops pad
    assert TOK.decode(np.asarray([1, *ids, 2, 0, 0], dtype=np.int32)) == "ab"
    with pytest.raises(ValueError, match="out of range"):
        TOK.decode([99])
    with pytest.raises(ValueError, match="negative"):
        TOK.decode([-1])


@pytest.mark.parametrize("bad", ["é", "３", "\t", "\x00", "🙂"])
def test_unknown_character(bad):
    with pytest.raises(ValueError, match=r"not in the tokenizer's alphabet") as info:
        TOK.encode(f"12{bad}3")
    assert "position 2" in str(info.value) and repr(bad) in str(info.value)


def test_custom_alphabet():
    tok = CharTokenizer("0123456789+=")
    assert tok.vocab_size == 15
    assert tok.encode("1+1=2") == [4, 13, 4, 14, 5]
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("00")
    with pytest.raises(ValueError, match="non-empty"):
        CharTokenizer("")


def test_save_load(tmp_path):
    tok = CharTokenizer("abc\n ")
    path = tok.save(tmp_path / "ckpt")
    assert path == tmp_path / "ckpt" / FILE_NAME
    loaded = CharTokenizer.load(tmp_path / "ckpt")
    assert loaded == tok and loaded.encode("cab\n") == tok.encode("cab\n")
    assert CharTokenizer.load(path) == tok
    assert CharTokenizer.load(TOK.save(tmp_path / "d")) == TOK


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        CharTokenizer.load(tmp_path)
    bad = tmp_path / FILE_NAME
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        CharTokenizer.load(tmp_path)
    bad.write_text(json.dumps({"format": "other"}), encoding="utf-8")
    with pytest.raises(ValueError, match="not a CharTokenizer file"):
        CharTokenizer.load(tmp_path)
    data = json.loads(TOK.save(tmp_path / "x").read_text())
    data["alphabet"] = ["ab"]
    bad.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="single characters"):
        CharTokenizer.load(tmp_path)
