"""The sampler on devices of its own (``mesh.rollout_devices``, issue 40 item 2): the run equals
the shared-device run bit for bit (the same quantization and sampler programs, split into
quantize on the trainer's device -> transfer -> sample on the rollout device -> transfer), with
``rollout.staleness=1`` so that sampling and training overlap. 2 simulated CPU devices, two CLI
runs of 3 steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _tiny import TINY_RUN

from ais_jax.config.load import load_config
from ais_jax.config.schema import DEFAULT_CONFIG_PATH
from ais_jax.core.errors import UsageError
from ais_jax.training.flops import TIMING_KEYS

REWARD = os.path.join(os.path.dirname(__file__), "_token_reward.py") + ":digit_share"
ARGS = [*TINY_RUN, "train.learning_rate=0.01", "train.steps=3", "checkpoint.every=0",
        "rollout.staleness=1", f"reward.functions.d={REWARD}"]


def _run(out, *extra, code=0, env=None):
    proc = subprocess.run([sys.executable, "-m", "ais_jax.train", f"out_dir={out}", *ARGS, *extra],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, JAX_NUM_CPU_DEVICES="2", **(env or {})))
    assert proc.returncode == code, proc.stderr[-3000:]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items()
                 if k not in {"step_time_s", *TIMING_KEYS}} for line in f if line.strip()]


@pytest.mark.slow  # two 3-step CLI runs on 2 simulated devices (~40 s on 2 cores)
def test_split_devices_equal_shared_devices(tmp_path):
    shared = _run(tmp_path / "shared")
    split = _run(tmp_path / "split", "mesh.rollout_devices=1")
    assert all(r["grad_norm"] > 0.01 for r in shared), shared
    assert split == shared


# SIGTERMs the run once step 2 is scored (tests/_token_reward.py)
STOP_AFTER_STEP_2 = os.path.join(os.path.dirname(__file__),
                                 "_token_reward.py") + ":stops_after_step_2"


@pytest.mark.slow  # three 4-step CLI runs on 2 simulated devices (~60 s on 2 cores)
def test_split_devices_with_staleness_2_and_a_resume_equal_shared_devices(tmp_path):
    args = ("rollout.staleness=2", "train.steps=4", "checkpoint.every=2",
            f"reward.functions.d={STOP_AFTER_STEP_2}")
    (tmp_path / "already").touch()  # the flag exists: the shared run is not stopped
    env = {"AIS_JAX_STOP_FLAG": str(tmp_path / "already")}
    shared = _run(tmp_path / "shared", *args, env=env)
    env["AIS_JAX_STOP_FLAG"] = str(tmp_path / "stopped")
    out = tmp_path / "split"
    first = _run(out, *args, "mesh.rollout_devices=1", code=143, env=env)
    assert [r["step"] for r in first] == [1, 2]
    split = _run(out, *args, "mesh.rollout_devices=1", env=env)
    assert split == shared and len(shared) == 4


@pytest.mark.parametrize("extra, message", [
    (["mesh.rollout_devices=3"], "prompts_per_step=8 must be a multiple of mesh.rollout_devices=3"),
    (["mesh.rollout_devices=1", "lora.rank=4"], "does not support LoRA or a LLaDA policy yet"),
    (["mesh.rollout_devices=-1"], "mesh.rollout_devices must be >= 0"),
])
def test_impossible_rollout_devices_are_refused_with_one_line(extra, message, tmp_path):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(DEFAULT_CONFIG_PATH, [f"out_dir={tmp_path}", *TINY_RUN, *extra])


def test_more_devices_than_visible_is_one_line(tmp_path):
    from ais_jax.training.build import build_mesh

    cfg = load_config(DEFAULT_CONFIG_PATH, [f"out_dir={tmp_path}", *TINY_RUN,
                                            "mesh.rollout_devices=2"])
    with pytest.raises(UsageError, match=r"plus mesh\.rollout_devices=2 needs 3 devices but "
                       r"only 1 are visible"):
        build_mesh(cfg)
