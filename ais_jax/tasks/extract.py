"""Bounded-time answer extraction from model completions (tags, ``\\boxed{}``, ``####``, ...).

Every function here first keeps only the last `MAX_SCAN_CHARS` characters of
the completion (`tail`): final answers sit at the end, and this bounds the
time spent on adversarial or runaway completions (a 10^6-character string
costs one slice).  An answer that starts further than that from the end is
not found.  Only ASCII digits count as digits.
"""

from __future__ import annotations

import re

MAX_SCAN_CHARS = 32_768  # how much of a completion's end is searched for an answer
MAX_ANSWER_CHARS = 4_096  # longer extracted answers are ignored (None)
MAX_BOXED_CHARS = 1_024  # a \boxed{} whose closing brace is further away is ignored

_HASHES = re.compile(r"####[ \t]*([^\n]{0,200})")
_ANSWER_IS = re.compile(r"answer\s+is\s*:?\s*([^\n]{0,200})", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.\s")
_ANSWER_WORDS = ("answer", "Answer", "ANSWER")
_NUMBER_WINDOW = 256
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?(?:/[0-9]+)?")
_SPACES = re.compile(r" *")
_BRACES = re.compile(r"[{}]")
_BARE_BOXED = re.compile(r"[^\s$]{1,200}")
_BOXED_NAMES = ("\\boxed", "\\fbox")


def tail(text: str) -> str:
    """The last `MAX_SCAN_CHARS` characters of ``text``."""
    return text[-MAX_SCAN_CHARS:] if len(text) > MAX_SCAN_CHARS else text


def last_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>...</tag>`` pair, stripped, or None."""
    text = tail(text)
    close = text.rfind(f"</{tag}>")
    if close < 0:
        return None
    open_ = text.rfind(f"<{tag}>", 0, close)
    if open_ < 0:
        return None
    content = text[open_ + len(tag) + 2 : close].strip()
    return content if len(content) <= MAX_ANSWER_CHARS else None


def has_answer_tag(text: str) -> bool:
    """Whether the completion gives a non-empty ``<answer>...</answer>`` (a task's ``format_ok``).

    Args:
      text: the completion.
    """
    return bool(last_tag(text))


def _braced(text: str, start: int) -> str | None:
    """The content of the brace group opening at ``text[start] == "{"``, or None.

    Only the first `MAX_BOXED_CHARS` characters are searched for the closing brace.
    """
    depth = 0
    for m in _BRACES.finditer(text, start, start + MAX_BOXED_CHARS + 2):
        if m.group(0) == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return text[start + 1 : m.start()]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces allowed.

    ``\\boxed 5`` (no braces) yields ``"5"``.  An unbalanced last box is
    skipped in favour of an earlier complete one.
    """
    text = tail(text)
    end = len(text)
    for _ in range(4):  # a few unbalanced boxes at most, then give up
        pos = max(text.rfind(name, 0, end) for name in _BOXED_NAMES)
        if pos < 0:
            return None
        name = next(n for n in _BOXED_NAMES if text.startswith(n, pos))
        j = _SPACES.match(text, pos + len(name)).end()
        if j < len(text) and text[j] == "{":
            content = _braced(text, j)
            if content is not None:
                return content.strip()
        elif j > pos + len(name) and j < len(text):  # "\boxed 5": up to whitespace or "$"
            m = _BARE_BOXED.match(text, j)
            if m:
                return m.group(0)
        end = pos
    return None


def after_hashes(text: str) -> str | None:
    """The rest of the line after the last ``####`` (GSM8K style), stripped, or None."""
    text = tail(text)
    pos = text.rfind("####")
    if pos < 0:
        return None
    m = _HASHES.match(text, pos)
    found = m.group(1).strip() if m is not None else ""
    return found or None


def answer_is(text: str) -> str | None:
    """What follows the last "the answer is", up to the end of its line or sentence, or None."""
    text = tail(text)
    end = len(text)
    for _ in range(16):  # look back over a few "answer" words that are not "answer is"
        pos = max(text.rfind(v, 0, end) for v in _ANSWER_WORDS)
        if pos < 0:
            return None
        m = _ANSWER_IS.match(text, pos)
        if m is not None:
            found = _SENTENCE_END.split(m.group(1), maxsplit=1)[0]
            found = found.strip().strip("*").strip()
            if found.endswith("."):
                found = found[:-1].rstrip()
            return found or None
        end = pos
    return None


def last_number(text: str) -> str | None:
    """The last number-looking substring (``-1,234.5``, ``3/4``), or None.

    Only a window of `_NUMBER_WINDOW` characters before the last ASCII digit
    is searched, so the cost does not grow with the number of numbers.
    """
    text = tail(text)
    last = max(text.rfind(d) for d in "0123456789")
    if last < 0:
        return None
    found = None
    for m in _NUMBER.finditer(text, max(0, last - _NUMBER_WINDOW), last + 1):
        found = m.group(0)
    return found.rstrip(",") if found is not None else None


def tagged_or_whole(text: str, tag: str = "answer") -> str | None:
    """The last ``<tag>`` content, else the last ``\\boxed{}``, else the whole stripped text.

    The whole-text fallback is what the compact (character-model) prompts
    produce: a bare answer.  Returns None for empty or overlong answers.
    """
    for found in (last_tag(text, tag), last_boxed(text)):
        if found is not None:
            return found
    whole = tail(text).strip()
    if not whole or len(whole) > MAX_ANSWER_CHARS or len(text) > MAX_SCAN_CHARS:
        return None
    return whole
