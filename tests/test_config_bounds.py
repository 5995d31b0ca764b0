"""Schema-driven property test (issue 39, "What to build" item 8): every numeric config key.

The keys come from the schema (`ais_jax.config.bounds.numeric_leaves` of a default
`Config`), so a key added later is covered by construction.  For each key, values drawn
from a seeded generator outside every usable range (beyond int32, negative, beyond
float32's finite range, below float32's smallest normal) must be refused by the loader
with one `UsageError` line naming the key, quickly; two draws go through the real CLI
(one line on stderr, exit 2).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

from ais_jax.config.bounds import numeric_leaves
from ais_jax.config.load import load_config
from ais_jax.config.schema import Config
from ais_jax.core.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_arithmetic.yaml")
KEYS = [(key, tp) for key, tp, _ in numeric_leaves(Config())]
DRAWS = 4  # per key and kind of value


def _bad_values(tp: type, rng: random.Random) -> list[str]:
    """Override texts out of range for any key of type ``tp``."""
    if tp is int:
        return [str(rng.randrange(2**31, 10**30)) for _ in range(DRAWS)] + [
            str(-rng.randrange(1, 10**30)) for _ in range(DRAWS)]
    big = [f"{rng.choice('+-')}{rng.uniform(1, 9):.3f}e{rng.randrange(39, 308)}"
           for _ in range(DRAWS)]
    tiny = [f"{rng.choice('+-')}{rng.uniform(1, 9):.3f}e-{rng.randrange(39, 320)}"
            for _ in range(DRAWS)]
    return big + tiny


def test_schema_has_numeric_keys_of_both_types():
    assert {tp for _, tp in KEYS} == {int, float} and len(KEYS) >= 60, KEYS
    assert ("train.steps", int) in KEYS and ("ais.gamma", float) in KEYS


@pytest.mark.parametrize("key,tp", KEYS, ids=[k for k, _ in KEYS])
def test_every_numeric_key_refuses_out_of_range_values(key, tp):
    rng = random.Random(f"issue39:{key}")
    start = time.monotonic()
    for value in _bad_values(tp, rng):
        with pytest.raises(UsageError) as e:
            load_config(TINY, [f"{key}={value}"])
        msg = str(e.value)
        assert "\n" not in msg and len(msg) < 400, msg
        assert key in msg, (value, msg)
    assert time.monotonic() - start < 10  # 16 loads


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ais_jax.train", "--config", TINY, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_two_drawn_keys_exit_2_one_line(tmp_path):
    rng = random.Random("issue39:cli")
    picks = [rng.choice([k for k in KEYS if k[1] is int]),
             rng.choice([k for k in KEYS if k[1] is float])]
    for key, tp in picks:
        value = _bad_values(tp, rng)[0]
        start = time.monotonic()
        proc = _cli(f"out_dir={tmp_path / 'run'}", f"{key}={value}")
        err = proc.stderr.strip()
        assert proc.returncode == 2, err[-3000:]
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and key in err, err
        assert time.monotonic() - start < 60  # interpreter and jax import included
        assert not (tmp_path / "run").exists()
