"""Issue 39's input-validation rows: bad input ends as one line and exit 2 before any work.

Rows: 5 (YAML reader errors name file and position), 3 / 4 (size, count and step
bounds), 8 (float keys checked in float32), 7 (``plan`` sizes before tracing),
9 (``runtime.xla_flags``), 12 (messages), 14 (library API on empty or ill-typed
inputs).  The schema-driven property test is in tests/test_config_bounds.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_arithmetic.yaml")


def _run(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err[-3000:]
    assert err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err
    return err


# ----------------------------------------------------------------------------- row 5


@pytest.mark.parametrize("raw,where", [
    (b"seed: 0\x00\n", "line 1 column 8: character #x0000"),
    (b"seed: 0\nout_dir: \"a\x07b\"\n", "line 2 column 12: character #x0007"),
    (b"seed: 0\x1b\n", "line 1 column 8: character #x001b"),
])
def test_row5_reader_errors_name_file_and_position(tmp_path, raw, where):
    path = tmp_path / "bad.yaml"
    path.write_bytes(raw)
    with pytest.raises(UsageError) as e:
        load_config(str(path))
    msg = str(e.value)
    assert str(path) in msg and where in msg and "\n" not in msg, msg


def test_row5_reader_errors_cli_exit_2(tmp_path):
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"seed: 0\x00\n")
    _one_line_exit_2(_run("ais_jax.train", "--config", str(path), "--print-config"),
                     str(path), "line 1 column 8")
    _one_line_exit_2(_run("ais_jax.train", "--print-config", "seed=\x01"),
                     "override 'seed=\\x01'", "line 1 column 1")
