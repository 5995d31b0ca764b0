"""Bounded YAML parsing of config files and overrides: hostile input costs milliseconds.

`load` is ``yaml.safe_load`` with limits, each breach a one-line `UsageError`
naming the place (file and line, or the override):

* no anchors or aliases (``&name`` / ``*name``): an alias bomb (a few lines
  that expand to billions of nodes) is refused while it is being read, and a
  config has no use for them;
* at most `MAX_DEPTH` levels of nested collections (PyYAML's composer
  recurses, so ``[[[[...]]]]`` would otherwise end in a RecursionError);
* numbers of at most `MAX_NUMBER_CHARS` characters (Python refuses to
  convert integers of more than 4300 digits, and no config needs them);
* at most `MAX_BYTES` of text;
* no duplicate keys in a mapping (PyYAML keeps the last one silently).

`clip` is the truncated ``repr`` every config error message uses for user
values, so no message grows with its input.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode

from ais_jax.core.errors import UsageError

MAX_DEPTH = 32  # nested collections
MAX_NUMBER_CHARS = 100  # characters of an int or float scalar
MAX_BYTES = 1 << 20  # config text
CLIP_CHARS = 80  # characters of a user value quoted in an error message
PATH_CHARS = 1024  # of a file path: the user needs all of it to find the file


def clip(value: Any, limit: int = CLIP_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters (``...`` marks the cut).

    Args:
      value: any user value; an int too long for ``repr`` is described by its size.
      limit: the most characters kept of the repr.
    """
    try:
        text = repr(value)
    except ValueError:  # int of more than sys.get_int_max_str_digits() digits
        return f"<int of about {int(value.bit_length() * 0.30103)} digits>"
    return cut(text, limit)


def cut(text: str, limit: int = CLIP_CHARS) -> str:
    """``text`` cut to about ``limit`` characters (``...`` and the full length mark the cut).

    Args:
      text: any text.
      limit: the most characters kept.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


class _BoundedLoader(yaml.SafeLoader):
    """A `yaml.SafeLoader` without anchors or aliases, with depth, number and key checks."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ConstructorError(None, None, "YAML anchors and aliases (&name, *name) are not "
                                   "allowed in configs; write the value out", event.start_mark)
        nested = isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent)
        if nested:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise ConstructorError(None, None, f"collections nested more than {MAX_DEPTH} "
                                       "deep", event.start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            if nested:
                self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode):
                continue  # unhashable keys: SafeConstructor's own error
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConstructorError(None, None, f"duplicate key {clip(key)} (first at line "
                                       f"{seen[key]}); keep one of them", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _bounded_number(name: str) -> Any:
    base = getattr(yaml.SafeLoader, name)

    def construct(loader: _BoundedLoader, node: ScalarNode) -> Any:
        if len(node.value) > MAX_NUMBER_CHARS:
            raise ConstructorError(None, None, f"a number of {len(node.value)} characters is "
                                   f"longer than the {MAX_NUMBER_CHARS} allowed", node.start_mark)
        return base(loader, node)

    return construct


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_number("construct_yaml_int"))
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _bounded_number("construct_yaml_float"))


class YAMLInputError(UsageError):
    """Unreadable or out-of-bounds YAML; ``line`` (1-based, or None) and ``problem`` (one line).

    ``where`` is ``"line L"``, ``"line L column C"`` (a character the YAML reader
    refuses) or ``""``.
    """

    def __init__(self, problem: str, line: int | None = None, column: int | None = None) -> None:
        self.problem, self.line, self.column = cut(problem, 200), line, column
        self.where = "" if line is None else f"line {line}" + (
            "" if column is None else f" column {column}")
        super().__init__(f"{self.where}: {self.problem}" if self.where else self.problem)


def _reader_error(text: str, e: yaml.reader.ReaderError) -> YAMLInputError:
    """A `YAMLInputError` for a character the YAML reader refuses (NUL, control bytes)."""
    position = max(0, min(int(e.position), len(text)))
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    char = e.character if isinstance(e.character, int) else ord(str(e.character)[:1] or "?")
    return YAMLInputError(f"character #x{char:04x} is not allowed in YAML ({e.reason}); remove "
                          "it or write it as an escape in a double-quoted string", line, column)


def load(text: str) -> Any:
    """The value of the YAML document ``text``, parsed within the module's limits.

    Args:
      text: the YAML text (one document).

    Returns:
      Plain data (dicts, lists, str, int, float, bool, None).

    Raises:
      YAMLInputError: a syntax error or a breached limit, with its line when known;
        callers add the file or override it came from.
    """
    if len(text) > MAX_BYTES:
        raise YAMLInputError(f"{len(text)} characters, more than the {MAX_BYTES} a config may "
                             "have")
    try:
        loader = _BoundedLoader(text)  # the reader checks every character here
    except yaml.reader.ReaderError as e:
        raise _reader_error(text, e) from None
    try:
        return loader.get_single_data()
    except yaml.reader.ReaderError as e:
        raise _reader_error(text, e) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join((e.problem or e.context or "invalid YAML").split())
        raise YAMLInputError(problem, None if mark is None else mark.line + 1) from None
    except yaml.YAMLError as e:
        raise YAMLInputError(" ".join(str(e).split())) from None
    except (ValueError, RecursionError) as e:  # belt and braces: no traceback for bad input
        raise YAMLInputError(f"{type(e).__name__}: {' '.join(str(e).split())}") from None
    finally:
        loader.dispose()


def read_mapping(path: str) -> dict[str, Any]:
    """The top-level mapping of the YAML config file ``path``, parsed with `load`.

    An empty file (``/dev/null`` too) is ``{}``: the defaults.  Pipes
    (``--config <(...)``) work.

    Args:
      path: the file.

    Raises:
      UsageError: a missing file, a directory, unreadable text, a `load` error
        (named with the file and line) or a top level that is not a mapping.
    """
    if not os.path.exists(path) or os.path.isdir(path):
        what = "is a directory" if os.path.isdir(path) else "not found"
        raise UsageError(f"config file {clip(path, PATH_CHARS)} {what}; pass the path of a "
                         "YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_BYTES + 1)
        raw = load(text)
    except YAMLInputError as e:
        line = f" {e.where}" if e.where else ""
        raise UsageError(f"YAML syntax error in {cut(path, PATH_CHARS)}{line}: {e.problem}; "
                         "fix the file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read config file {cut(path, PATH_CHARS)}: {cut(str(e))}"
                         ) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(
            f"config file {cut(path)} must hold a mapping of config keys, got {type(raw).__name__}"
        )
    return raw


def parse_override(override: str) -> tuple[str, Any]:
    """``(key, value)`` of a dotted override ``"a.b=value"``, the value parsed with `load`.

    Args:
      override: the command-line override.

    Raises:
      UsageError: no ``=``, an empty key, or a `load` error naming the override.
    """
    if not isinstance(override, str) or "=" not in override:
        raise UsageError(
            f"override {clip(override)} has no '='; write it as key=value, e.g. train.steps=3"
        )
    key, _, text = override.partition("=")
    key = key.strip()
    if not key:
        raise UsageError(f"override {clip(override)} has an empty key; write it as key=value")
    try:
        return key, load(text)
    except YAMLInputError as e:
        raise UsageError(
            f"cannot parse the value of override {clip(override)} as YAML ({e.problem}"
            f"{', at ' + e.where if e.column is not None else ''}); quote "
            f"it, e.g. {cut(key)}='...'"
        ) from None
