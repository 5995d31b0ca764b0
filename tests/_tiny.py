"""Overrides of the tiny runs the CLI / loop tests share (a 1-layer, 32-wide scratch model)."""

TINY_MODEL = [
    "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
    "model.head_dim=16", "model.intermediate_size=64",
]
# 8 prompts x 4 samples, 4 new tokens, no warm start, 8 eval problems, quiet logging.
TINY_RUN = [
    *TINY_MODEL, "rollout.prompts_per_step=8", "rollout.group_size=4",
    "rollout.max_new_tokens=4", "sft.steps=0", "task.eval_size=8", "eval.every=0",
    "eval.num_samples=1", "log.tensorboard=false", "log.progress=false",
]

# The shared run of tests/conftest.py's ``tiny_run`` fixture (test_train's reference run, the
# reliability tests' first run): TINY_RUN at learning rate 0.003, 3 RL steps, a checkpoint
# after each.
TINY_3_STEPS = ["train.learning_rate=0.003", "train.steps=3", "checkpoint.every=1"]


def child_env(devices: int | None = None) -> dict[str, str]:
    """The environment of a child process that sets up its own CPU devices: this process's,
    without JAX_NUM_CPU_DEVICES and without any XLA flag but the suite's compiler setting
    (tests/conftest.py) and an ISA cap (``--xla_cpu_max_isa``: the child is the same machine
    type, so it computes the same bits as this process); ``devices`` simulated CPU devices
    when given."""
    import os

    from conftest import NO_FUSION_EMITTERS

    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split()
            if f == NO_FUSION_EMITTERS or f.startswith("--xla_cpu_max_isa=")]
    if kept:
        env["XLA_FLAGS"] = " ".join(kept)
    if devices is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(devices)
    return env


def copy_run(src, dst):
    """A copy of a finished run directory at ``dst`` (a rerun there resumes it); ``dst``."""
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


def params_digest(tree) -> str:
    """sha256 of a pytree's leaves' bytes (bit-identical params give the same digest)."""
    import hashlib

    import jax
    import numpy as np

    h = hashlib.sha256()
    for x in jax.tree.leaves(tree):
        h.update(np.asarray(jax.device_get(x)).tobytes())
    return h.hexdigest()


def first_prompts(r):
    """The first RL step's padded prompts and mask of a built run, placed on its batch sharding."""
    from ais_jax.training.placement import to_global

    codec, sh = r.codec, r.fns.batch_sharding
    problems = r.train_problems(0, 0, r.cfg.rollout.prompts_per_step)
    pt, pm = codec.pad([codec.encode_prompt(p) for p in problems], r.prompt_bucket)
    return to_global(pt, sh), to_global(pm, sh)
