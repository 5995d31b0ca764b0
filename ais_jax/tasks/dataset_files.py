"""Reading a dataset file's rows, and naming what is wrong with one that cannot be read.

`ais_jax.tasks.user_dataset.load_rows` reads the file; the helpers here turn a reader's error
into one line naming the file, the line and the fix, and map rows to their file lines
(`row_lines`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from typing import Any

from ais_jax.core.errors import UsageError
from ais_jax.core.safe_yaml import clip


def _shown(path: str) -> str:
    """A path as messages name it: as written, clipped only when very long."""
    return path if len(path) <= 160 else clip(path)


def no_rows(key: str, path: str) -> str:
    """The one-line message for a data file ``path`` (config key ``key``) without rows."""
    return f"{key} {_shown(path)} has no rows; point it at a file with at least one row"


def is_blank(path: str) -> bool:
    """Whether the file holds only whitespace (read no further than its first 64 KiB)."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    return not head.strip() and len(head) < 1 << 16


def _root_cause(e: BaseException) -> BaseException:
    """The innermost exception of ``e``'s chain that says something (``datasets`` wraps the
    reader's own error in a ``DatasetGenerationError`` with a generic message)."""
    chain, seen, cur = [], set(), e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    said = [c for c in chain if str(c).strip()
            and type(c).__name__ != "DatasetGenerationError"]
    return said[-1] if said else chain[-1]


_EMPTY_TEXTS = ("corresponds to no data", "No columns to parse from file")
_CSV_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def read_error(key: str, path: str, ext: str, e: BaseException) -> UsageError:
    """The one-line `UsageError` of a file ``datasets`` failed to read: the real reason."""
    root = _root_cause(e)
    text = " ".join(str(root).split())
    if ext in (".jsonl", ".json") and os.path.isfile(path):
        bad = _first_bad_json_line(path, kinds="changed from" in text)
        if bad is not None:
            return UsageError(f"{key} {_shown(path)}:{bad[0]}: {bad[1]}")
    if isinstance(root, StopIteration) or any(t in text for t in _EMPTY_TEXTS):
        return UsageError(no_rows(key, path))
    m = _CSV_FIELDS.search(text)
    if m is not None:
        return UsageError(f"{key} {_shown(path)}:{m.group(2)}: {m.group(3)} fields, but the "
                          f"header has {m.group(1)}; quote values that hold commas")
    return UsageError(f"{key} {_shown(path)} cannot be read ({type(root).__name__}: "
                      f"{text[:200]})")


def _kind(value: Any) -> str | None:
    """The JSON type of a value as Arrow sees it (ints and floats alike); None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), "a value")


class _HugeNumberError(ValueError):
    """A JSON number that is not finite as a float64 (``1e999``); args[0] is its text."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _HugeNumberError(text[:40])
    return value


def _first_bad_json_line(path: str, kinds: bool = False) -> tuple[int, str] | None:
    """``(1-based line, what is wrong)`` of the first line of a JSON lines file that is not
    UTF-8 or not a JSON object (with ``kinds``: or whose column has another JSON type than
    on an earlier line); None when there is none (or the file is one JSON array)."""
    first: dict[str, tuple[str, int]] = {}  # column -> (its first JSON type, line)
    rows = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return n, f"not valid UTF-8 ({e.reason})"
            stripped = line.strip()
            if not stripped:
                continue
            if not rows and stripped.startswith("["):
                return None  # one JSON document, not JSON lines
            try:
                row = json.loads(line, parse_float=_finite_float)
            except _HugeNumberError as e:
                return n, (f"the number {e.args[0]} is beyond float64's range; quote it "
                           f'("{e.args[0]}") to keep it as text, or use a smaller number')
            except json.JSONDecodeError as e:
                return n, f"invalid JSON ({e.msg}, column {e.colno})"
            except (ValueError, RecursionError) as e:  # an int of > 4300 digits, deep nesting
                return n, f"unreadable JSON ({' '.join(str(e).split())[:120]})"
            if not isinstance(row, dict):
                return n, f"expected a JSON object, got {type(row).__name__}"
            for col, value in row.items() if kinds else ():
                kind = _kind(value)
                seen = first.setdefault(col, (kind, n)) if kind else None
                if seen is not None and seen[0] != kind:
                    return n, (f"column {clip(col)} is {kind} here but {seen[0]} on line "
                               f"{seen[1]}; give each column one JSON type (quote the numbers "
                               "of a text column)")
            rows += 1
    return None


def row_lines(path: str, n_rows: int) -> list[int] | None:
    """The 1-based file line each of ``n_rows`` rows starts on, for ``file:line`` messages.

    JSON lines: the non-blank lines; CSV: the records after the header (blank
    lines skipped, quoted newlines kept inside their record).  None for
    parquet, a saved dataset, a JSON array, or when the count does not match
    what ``datasets`` read (then messages say ``row N``).
    """
    ext = os.path.splitext(path)[1].lower()
    if not os.path.isfile(path) or ext not in (".jsonl", ".json", ".csv"):
        return None
    if ext == ".csv":
        starts, end = [], 0
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            reader = csv.reader(f)
            try:
                for record in reader:
                    if record:
                        starts.append(end + 1)
                    end = reader.line_num
            except csv.Error:
                return None
        lines = starts[1:]  # the first record is the header
    else:
        with open(path, "rb") as f:
            if f.read(1 << 10).lstrip().startswith(b"["):
                return None  # one JSON document, not JSON lines
            f.seek(0)
            lines = [n for n, raw in enumerate(f, start=1) if raw.strip()]
    return lines if len(lines) == n_rows else None
