"""YAML machinery of the run configuration: reading, typing, dotted overrides and printing.

The functions here work on any tree of frozen dataclasses (the *root*, e.g.
`ais_jax.config.schema.Config`) whose fields are sections (nested dataclasses) or
leaves of type ``bool``, ``int``, ``float``, ``str`` or `FrozenMapping`.  The
schema itself and its validation live in `ais_jax.config.schema`, whose
``load_config`` is `load_yaml` followed by ``validate``.  Every user mistake
raises `UsageError` with one line naming the bad key or value and the fix.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import io
import math
import os
import textwrap
import tokenize
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import yaml

from ais_jax.core import safe_yaml
from ais_jax.core.errors import UsageError
from ais_jax.core.safe_yaml import clip, cut

# A mapping-valued leaf (generator keyword arguments): sorted (name, value) pairs,
# hashable; written as a YAML mapping such as {digits: 2}.
FrozenMapping = tuple[tuple[str, int | float | str | bool], ...]

_T = TypeVar("_T")

# ----------------------------------------------------------------------------- schema walking


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp)


@functools.cache
def all_keys(root: type) -> tuple[str, ...]:
    """Every dotted key of ``root``, sections included, in field order.

    Args:
      root: the top-level config dataclass, e.g. `ais_jax.config.schema.Config`; its
        keys are ``("seed", ..., "train", "train.steps", ...)``.
    """
    keys = []
    for name, tp in _hints(root).items():
        keys.append(name)
        if _is_section(tp):
            keys.extend(f"{name}.{sub}" for sub in _hints(tp))
    return tuple(keys)


def _unknown_key(root: type, key: str, where: str) -> UsageError:
    keys = all_keys(root)
    parent, _, leaf = key.rpartition(".")
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]
    same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf and k != key]
    if parent == "" or parent in keys:  # a typo inside a section, or a key in the wrong one
        close = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in siblings], n=1)
        close = [f"{parent}.{close[0]}" if parent else close[0]] if close else same_leaf[:1]
    else:  # a typo in the section name
        depth = [k for k in keys if k.count(".") == key.count(".")]
        close = difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.0) or (
            difflib.get_close_matches(key, depth, n=1)
        )
    if close:
        return UsageError(f"unknown config key {clip(key)}{where}; did you mean {close[0]!r}?")
    valid = siblings or [k for k in keys if "." not in k]
    return UsageError(f"unknown config key {clip(key)}{where}; valid keys: {', '.join(valid)}")


# ----------------------------------------------------------------------------- typing


def _describe(value: Any) -> str:
    return f"{clip(value)} ({type(value).__name__})"


def _convert_number(value: Any, tp: type, key: str, where: str) -> Any:
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{key} must be an int{where}, got {_describe(value)}")
        return value
    if isinstance(value, str):  # PyYAML reads 1e-4 as a string
        try:
            value = float(value)
        except ValueError:
            raise UsageError(f"{key} must be a float{where}, got {_describe(value)}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{key} must be a float{where}, got {_describe(value)}")
    if not math.isfinite(value):
        raise UsageError(f"{key} must be a finite number{where}, got {clip(value)}")
    return float(value)


def _convert_mapping(value: Any, key: str, where: str) -> FrozenMapping:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise UsageError(
            f"{key} must be a mapping such as {{digits: 2}}{where}, got {_describe(value)}"
        )
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, int | float | str | bool):
            raise UsageError(
                f"{key} entries must map a name to a number, string or bool{where}, "
                f"got {clip(k)}: {_describe(v)}"
            )
    return tuple(sorted(value.items()))


def _convert(value: Any, tp: Any, key: str, where: str, root: type) -> Any:
    """``value`` checked and converted to the field type ``tp``."""
    if _is_section(tp):
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise UsageError(f"{key} must be a mapping of its keys{where}, got {_describe(value)}")
        return _build(tp, value, key + ".", where, root)
    if tp is bool:
        if not isinstance(value, bool):
            raise UsageError(
                f"{key} must be a bool (true or false){where}, got {_describe(value)}"
            )
        return value
    if tp is int or tp is float:
        return _convert_number(value, tp, key, where)
    if tp is str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise UsageError(f"{key} must be a str{where}, got {_describe(value)}; quote it")
        return value
    if tp == FrozenMapping:
        return _convert_mapping(value, key, where)
    raise TypeError(f"unsupported config field type {tp!r} of {key}")  # a bug in the schema


def _build(cls: type, raw: Mapping[str, Any], prefix: str, where: str, root: type) -> Any:
    hints = _hints(cls)
    for name in raw:
        if name not in hints:
            raise _unknown_key(root, f"{prefix}{name}", where)
    return cls(**{n: _convert(v, hints[n], prefix + n, where, root) for n, v in raw.items()})


def build(root: type[_T], raw: Mapping[str, Any], where: str = "") -> _T:
    """``root(...)`` from nested plain data, each leaf type-checked and converted.

    Args:
      root: the top-level config dataclass, e.g. `ais_jax.config.schema.Config`.
      raw: nested mappings as read from YAML; missing keys keep their defaults.
      where: appended to the key in error messages, e.g. ``" in path.yaml"``.

    Raises:
      UsageError: an unknown key (with a suggestion) or a value of the wrong type.
    """
    return _build(root, raw, "", where, root)


# ----------------------------------------------------------------------------- dict / YAML


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A config value as nested plain dicts (JSON- and YAML-serializable).

    Args:
      cfg: a config dataclass value; its `FrozenMapping` fields become mappings.
    """

    def conv(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):
            return {f.name: conv(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if isinstance(obj, tuple):
            return {k: v for k, v in obj}
        return obj

    return conv(cfg)


def config_to_yaml(cfg: Any) -> str:
    """A config value as YAML (fields in schema order) that reads back to an equal value.

    Args:
      cfg: a config dataclass value, e.g. an `ais_jax.config.schema.Config`.
    """
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, dict):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    text = yaml.safe_dump(value, default_flow_style=True)
    return text.removesuffix("\n").removesuffix("\n...")


def format_config(cfg: Any) -> str:
    """A config value as YAML with each field's comment (the ``--print-config`` output).

    Args:
      cfg: a config dataclass value; the text (one ``key: value  # comment``
        line per field) reads back to an equal value.
    """
    root = type(cfg)
    data = config_to_dict(cfg)
    comments = field_comments(root)
    lines = []
    for name, tp in _hints(root).items():
        if not _is_section(tp):
            lines.append(f"{name}: {_yaml_scalar(data[name])}  # {comments[name]}")
            continue
        lines.append(f"{name}:  # {comments[name]}")
        sub_comments = field_comments(tp)
        for sub, value in data[name].items():
            lines.append(f"  {sub}: {_yaml_scalar(value)}  # {sub_comments[sub]}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- loading


def _apply_override(data: dict[str, Any], override: str, root: type) -> None:
    """Sets the dotted key of ``override`` (``"a.b=value"``) in the nested dict ``data``.

    A mapping given for a section sets some of its keys; keys below a
    `FrozenMapping` field (``task.difficulty.digits=3``) set one entry.  Value
    types are checked later by `build`.
    """
    key, value = safe_yaml.parse_override(override)
    parts = key.split(".")
    node_tp: Any = root
    node = data
    for i, part in enumerate(parts):
        if node_tp == FrozenMapping:  # free-form generator kwargs
            field_tp: Any = None
        elif _is_section(node_tp):
            if part not in _hints(node_tp):
                raise _unknown_key(root, key, "")
            field_tp = _hints(node_tp)[part]
        else:
            parent = ".".join(parts[:i])
            raise UsageError(
                f"config key {clip(parent)} is a value, not a section; write {cut(parent)}=VALUE"
            )
        if i == len(parts) - 1:
            old = node.get(part)
            if _is_section(field_tp) and isinstance(value, Mapping) and isinstance(old, Mapping):
                value = {**old, **value}  # a mapping for a section sets some of its keys
            node[part] = value
            return
        if not isinstance(node.get(part), Mapping):
            node[part] = {}
        node[part] = dict(node[part])
        node, node_tp = node[part], field_tp


def load_yaml(
    root: type[_T], path: str | os.PathLike | None, overrides: Sequence[str] | str = ()
) -> _T:
    """Read a YAML config and apply dotted overrides, without range validation.

    Args:
      root: the top-level config dataclass, e.g. `ais_jax.config.schema.Config`.
      path: YAML file; None starts from the dataclass defaults.
      overrides: ``"a.b=value"`` strings applied in order (a single string
        counts as one override).

    Raises:
      UsageError: missing file, YAML syntax error, unknown key or wrong type.
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    cfg = root()
    if path is not None:
        path = os.fspath(path)
        cfg = build(root, safe_yaml.read_mapping(path), f" in {cut(path)}")
    if overrides:
        data = config_to_dict(cfg)
        for override in overrides:
            _apply_override(data, override, root)
        cfg = build(root, data)
    return cfg


# ----------------------------------------------------------------------------- field comments


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """The source comment of each field of a config dataclass.

    A field's comment is the trailing ``# ...`` on its line or, failing that,
    the comment lines directly above it.  Used by `format_config` and
    ``scripts/gen_config_docs.py``.

    Args:
      cls: a config dataclass (the root or a section); a field without a
        comment maps to ``""``.
    """
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[str, str] = {}
    (class_def,) = ast.parse(source).body
    for node in class_def.body:  # type: ignore[attr-defined]
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        text = comments.get(node.end_lineno or node.lineno, "")
        if not text:
            above = []
            line = node.lineno - 1
            while line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            text = " ".join(above)
        out[node.target.id] = text
    return out


def reference_rows(root: type) -> list[tuple[str, str, str, str]]:
    """``(key, type, default, comment)`` for every leaf field of ``root``, in file order.

    The rows of docs/configuration.md: the default is YAML text and the type
    of a `FrozenMapping` field is ``mapping``.

    Args:
      root: the top-level config dataclass, e.g. `ais_jax.config.schema.Config`.
    """
    rows = []

    def type_name(tp: Any) -> str:
        return "mapping" if tp == FrozenMapping else tp.__name__

    defaults = config_to_dict(root())
    top_comments = field_comments(root)
    for name, tp in _hints(root).items():
        if not _is_section(tp):
            rows.append((name, type_name(tp), _yaml_scalar(defaults[name]), top_comments[name]))
            continue
        comments = field_comments(tp)
        for sub, sub_tp in _hints(tp).items():
            row = (f"{name}.{sub}", type_name(sub_tp), _yaml_scalar(defaults[name][sub]))
            rows.append((*row, comments[sub]))
    return rows
