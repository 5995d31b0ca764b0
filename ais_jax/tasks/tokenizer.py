"""A character-level tokenizer for the small from-scratch model, saved as JSON beside checkpoints.

Ids are fixed: 0 ``<pad>``, 1 ``<bos>``, 2 ``<eos>``, then one id per character
of the alphabet in order.  The default alphabet is newline plus printable
ASCII (space to ``~``), which covers every compact prompt and answer of the
built-in tasks (99 ids in all).  Encoding a character outside the alphabet is
a ValueError naming it.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ais_jax.core import storage

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
DEFAULT_ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
FILE_NAME = "char_tokenizer.json"
_FORMAT = "ais_jax.CharTokenizer"
_VERSION = 1


@dataclass(frozen=True)
class CharTokenizer:
    """Character tokenizer (data: its alphabet; ids as in the module doc).

    Attributes:
      alphabet: the characters, each once, in id order (ids start at 3).
    """

    alphabet: str = DEFAULT_ALPHABET
    _ids: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.alphabet, str) or not self.alphabet:
            raise ValueError("CharTokenizer alphabet must be a non-empty string.")
        if len(set(self.alphabet)) != len(self.alphabet):
            dups = sorted({c for c in self.alphabet if self.alphabet.count(c) > 1})
            raise ValueError(f"CharTokenizer alphabet has repeated characters: {dups!r}.")
        ids = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(self.alphabet)}
        object.__setattr__(self, "_ids", ids)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(self.alphabet)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of ``text`` (optionally with ``<bos>`` first / ``<eos>`` last).

        Raises:
          ValueError: a character is not in the alphabet.
        """
        try:
            ids = [self._ids[c] for c in text]
        except KeyError as e:
            pos = next(i for i, c in enumerate(text) if c not in self._ids)
            raise ValueError(
                f"character {e.args[0]!r} (U+{ord(e.args[0]):04X}) at position {pos} is not in the "
                "tokenizer's alphabet; remove it or build a CharTokenizer with a larger alphabet."
            ) from None
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``: stops at the first ``<eos>``, drops ``<pad>`` and ``<bos>``.

        Raises:
          ValueError: an id is outside ``[0, vocab_size)``.
        """
        chars = []
        n_special = len(SPECIAL_TOKENS)
        for raw in ids:
            i = int(raw)
            if i == self.eos_id:
                break
            if i < n_special:
                if i < 0:
                    raise ValueError(f"token id {i} is negative.")
                continue
            if i >= self.vocab_size:
                raise ValueError(f"token id {i} is out of range for vocab_size {self.vocab_size}.")
            chars.append(self.alphabet[i - n_special])
        return "".join(chars)

    def save(self, directory: str | Path) -> Path:
        """Write ``<directory>/char_tokenizer.json`` (creating the directory); return its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / FILE_NAME
        data = {
            "format": _FORMAT,
            "version": _VERSION,
            "special_tokens": list(SPECIAL_TOKENS),
            "alphabet": list(self.alphabet),
        }
        path.write_text(json.dumps(data, ensure_ascii=True, indent=1) + "\n", encoding="utf-8")
        return path

    @staticmethod
    def load(directory: str | Path) -> CharTokenizer:
        """Read a tokenizer written by `save` (a directory or the JSON file itself)."""
        path: Any = Path(directory)
        read = functools.partial(path.read_text, encoding="utf-8")
        if storage.is_remote(os.fspath(directory)):  # a bucket export (gs://.../final)
            path = os.fspath(directory)
            path = path if path.endswith(".json") else storage.join(path, FILE_NAME)
            read = functools.partial(storage.read_text, path)
        elif path.is_dir():
            path = path / FILE_NAME
            read = functools.partial(path.read_text, encoding="utf-8")
        try:
            data = json.loads(read())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no tokenizer file at {path}; save one with CharTokenizer.save."
            ) from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg}).") from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(
                f"{path}: not a CharTokenizer file (format field {_FORMAT!r} missing)."
            )
        if data.get("version") != _VERSION or data.get("special_tokens") != list(SPECIAL_TOKENS):
            raise ValueError(f"{path}: unsupported CharTokenizer version or special tokens.")
        alphabet = data.get("alphabet")
        if not isinstance(alphabet, list) or not all(
            isinstance(c, str) and len(c) == 1 for c in alphabet
        ):
            raise ValueError(f"{path}: 'alphabet' must be a list of single characters.")
        return CharTokenizer("".join(alphabet))
