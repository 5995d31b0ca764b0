"""`load_config`: a run's YAML file plus command-line overrides, typed and validated.

Reading and typing are `ais_jax.config.yaml_io`'s; the rules are
`ais_jax.config.checks`'; the schema is `ais_jax.config.schema`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ais_jax.config.checks import validate_config
from ais_jax.config.schema import DEFAULT_CONFIG_PATH, Config
from ais_jax.config.yaml_io import format_config, load_yaml

__all__ = ["DEFAULT_CONFIG_PATH", "format_config", "load_config", "validate"]


def load_config(path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML config, apply dotted overrides and validate.

    Args:
      path: YAML file (``yaml.safe_load``); None starts from the dataclass
        defaults.  Missing keys keep their defaults.
      overrides: ``"a.b=value"`` strings applied in order; the value is parsed
        with ``yaml.safe_load`` (``train.steps=3``, ``rollout.precision=bf16``,
        ``task.difficulty={digits: 3}`` or ``task.difficulty.digits=3``).

    Returns:
      The validated `Config`.

    Raises:
      UsageError: missing file, YAML syntax error, unknown key, wrong type or
        invalid value; one line naming the problem and the fix.
    """
    cfg = load_yaml(Config, path, overrides)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Check value ranges, choices and cross-field constraints of a config.

    The mesh is not checked against the device count (the trainer knows the
    devices).  Paths are checked unless ``AIS_JAX_SKIP_PATH_CHECK=1``.  The
    rules live in `ais_jax.config.checks`.

    Args:
      cfg: the config to check, e.g. from `ais_jax.config.yaml_io.load_yaml`.

    Raises:
      UsageError: the first problem found, in one line with the fix.
    """
    validate_config(cfg)
