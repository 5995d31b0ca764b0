"""Tests for the ``python -m ais_jax.mismatch`` CLI (random tiny model, no files needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ais_jax.run import mismatch


def test_random_tiny_run_prints_table_and_json(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = mismatch.main(["--model", "random:tiny", "--num-prompts", "3", "--samples", "2",
                        "--max-new-tokens", "6", "--seed", "1", "--decode-segments", "1",
                        "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    for label in ("d_bar", "ESS ratio", "|dlogp| p99", "seq log-ratio std", "alpha_mis",
                  "alpha"):
        assert label in text
    data = json.loads(out.read_text())
    arm = data["arms"]["fp8"]
    assert arm["num_sequences"] == 6 and 0 < arm["num_tokens"] <= 36
    assert 0 <= arm["d_bar"] < 0.5 and 0 < arm["ess_ratio"] <= 1
    assert 0 <= arm["alpha"] <= 1
    assert arm["abs_delta_p50"] <= arm["abs_delta_p90"] <= arm["abs_delta_p99"] \
        <= arm["abs_delta_max"]


def test_scratch_export_with_char_tokenizer_loads(tmp_path, capsys):
    """A policy exported by a scratch run (HF weights + char_tokenizer.json) is a valid --model,
    and its prompts are encoded with the character tokenizer it was trained with."""
    from ais_jax.models.pretrained import save_pretrained

    params, cfg, tok = mismatch._tiny_model(0)
    save_pretrained(params, cfg, str(tmp_path / "policy"))
    tok.save(str(tmp_path / "policy"))
    prompts = tmp_path / "p.txt"
    prompts.write_text("12*345=\n")
    out = tmp_path / "m.json"
    rc = mismatch.main(["--model", str(tmp_path / "policy"), "--prompts", str(prompts),
                        "--num-prompts", "2", "--samples", "2", "--max-new-tokens", "4",
                        "--decode-segments", "1", "--json", str(out)])
    assert rc == 0
    arm = json.loads(out.read_text())["arms"]["fp8"]
    assert arm["num_sequences"] == 4 and 0 < arm["num_tokens"] <= 16


def test_diagnostics_known_values():
    lt = np.array([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], np.float32)
    lr = np.array([[-1.1, -1.8, 9.0], [-0.5, -0.4, -0.7]], np.float32)
    mask = np.array([[1, 1, 0], [1, 1, 1]], np.float32)  # garbage behind the mask
    d = mismatch.diagnostics(lt, lr, mask, np.array([1.0, -1.0], np.float32))
    np.testing.assert_allclose(d["d_bar"], np.mean([0.1, 0.2, 0.0, 0.1, 0.2]), atol=1e-6)
    np.testing.assert_allclose(d["abs_delta_max"], 0.2, atol=1e-6)
    np.testing.assert_allclose([d["seq_log_ratio_min"], d["seq_log_ratio_max"]],
                               [-0.1, 0.1], atol=1e-6)
    assert d["num_tokens"] == 5 and d["alpha_mis"] == 1.0


@pytest.mark.parametrize("argv,match", [
    (["--model", "/no/such/model"], "does not exist"),
    (["--model", "random:huge"], "unknown random model"),
    (["--model", "random:tiny", "--samples", "0"], "--samples"),
    (["--model", "random:tiny", "--temperature", "-1"], "--temperature"),
    (["--model", "random:tiny", "--max-new-tokens", "x"], "--max-new-tokens"),
    (["--model", "random:tiny", "--prompts", "/no/such/file"], "cannot read prompts"),
    (["--model", "random:tiny", "--task", "nope"], "unknown task"),
    (["--model", "random:tiny", "--max-new-tokens", "5000"], "positions"),
    ([], "--model"),
])
def test_bad_input_one_line_exit_2(argv, match, capsys):
    assert mismatch.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err and "Traceback" not in err


def test_cli_subprocess_bad_path_exit_status():
    r = subprocess.run([sys.executable, "-m", "ais_jax.mismatch", "--model", "/no/such/dir"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
