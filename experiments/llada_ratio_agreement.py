"""How well d1's estimator ratio agrees with the denoising trajectory's own ratio (LLaDA).

    python experiments/llada_ratio_agreement.py [--model DIR | --sft-steps N] [--stress]
        [--seed 0] [--prompts 16] [--time-score] [--time-update] [--json OUT] [key=value ...]

On the LLaDA default's warm-started policy (``configs/tiny_llada_countdown.yaml``;
``--model DIR``: an exported warm start, e.g. ``experiments/llada_arms.py warm``'s,
loaded with ``model.source=DIR sft.steps=0``; else the warm start runs here, with
``--sft-steps`` to shorten it), one rollout batch is drawn with the FP8 copy at the
config's temperature (`ais_jax.training.llada.steps.rollout`), then both ratios of every
valid response token are taken:

* estimator: ``log rho = FP8 estimate - trainer estimate`` (d1, the first inner
  iteration's shared prompt mask);
* trajectory: ``log rho = sampler-recorded log-prob - trainer replay`` (the sampler's
  trajectory, `ais_jax.training.llada.trajectory`: each token's log-prob plus its share
  of its step's selection term; before issue 42 the selection term was left out).

The trainer is the config's compute dtype.  Printed (JSON): per-token and per-sequence
(sum over valid tokens) Pearson correlation of the two log-ratios, and ``d_bar`` /
token ESS (`ais_jax.method.ais.ais_coefficient`, truncated at ``ais.C``) of each, and of
the trajectory ratio's selection part alone (``trajectory_selection``);
``--stress`` repeats it with the block linears x3 before quantizing (the issue's stress
setting; trainer and FP8 copy both from the scaled weights).  ``--time-score``: the
median wall time of the jitted score program (`ais_jax.training.llada.steps.score`) on
that batch under each ``diffusion.ratio`` (the trajectory replay's cost).  ``--time-update``:
the same for the update program under each ``diffusion.surrogate`` (with the trajectory
ratio; the replay under gradient's cost).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository's ais_jax, also when it is not installed

CONFIG = "configs/tiny_llada_countdown.yaml"
BLOCK_LINEARS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def _pearson(x: Any, y: Any) -> float:
    import numpy as np

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.size < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _stats(trainer: Any, rollout: Any, valid: Any, cap: float) -> dict[str, float]:
    import jax.numpy as jnp

    from ais_jax.method.ais import ais_coefficient

    res = ais_coefficient(trainer, rollout, jnp.zeros_like(trainer), valid, C=cap, mode="none")
    return {"d_bar": float(res.d_bar), "token_ess": float(res.ess_ratio)}


def agreement(run: Any, params: Any, pt: Any, pm: Any, key: Any) -> dict[str, Any]:
    """One FP8 rollout batch of ``params`` and the two ratios' agreement (module docstring)."""
    import jax
    import numpy as np

    from ais_jax.training.llada import steps as ls

    cfg, lcfg = run.cfg, run.model_cfg
    batch = jax.jit(lambda p, a, b, k: ls.rollout(p, a, b, k, lcfg, cfg, run.codec.eos_ids))(
        params, pt, pm, key)
    est_old, traj_old, sel_old = jax.jit(lambda p, b: ls.score(p, b, lcfg, cfg))(params, batch)
    valid = np.asarray(batch.mask) > 0
    est_t, est_r = np.asarray(est_old[0]), np.asarray(batch.logp[0])
    traj_t, traj_r = np.asarray(traj_old), np.asarray(batch.traj_logp)
    le, lt = est_r - est_t, traj_r - traj_t  # rollout - trainer
    seq = valid.any(axis=1)
    return {
        "rows": int(valid.shape[0]), "valid_tokens": int(valid.sum()),
        "pearson_token": _pearson(le[valid], lt[valid]),
        "pearson_seq": _pearson(np.where(valid, le, 0).sum(1)[seq],
                                np.where(valid, lt, 0).sum(1)[seq]),
        "estimator": _stats(est_t, est_r, valid, cfg.ais.C),
        "trajectory": _stats(traj_t, traj_r, valid, cfg.ais.C),  # complete (issue 42)
        "trajectory_selection": _stats(np.asarray(sel_old), np.asarray(batch.traj_select),
                                       valid, cfg.ais.C),
        "mean_abs_log_ratio_gap": float(np.abs(le - lt)[valid].mean()),
    }


def score_times(run: Any, params: Any, pt: Any, pm: Any, key: Any,
                repeats: int = 5) -> dict[str, float]:
    """Median wall seconds of the jitted score program per ``diffusion.ratio`` (compiled first)."""
    import dataclasses

    import jax
    import numpy as np

    from ais_jax.training.llada import steps as ls

    cfg, lcfg = run.cfg, run.model_cfg
    batch = jax.jit(lambda p, a, b, k: ls.rollout(p, a, b, k, lcfg, cfg, run.codec.eos_ids))(
        params, pt, pm, key)
    out = {}
    for ratio in ("estimator", "trajectory"):
        c = dataclasses.replace(cfg, diffusion=dataclasses.replace(cfg.diffusion, ratio=ratio))
        fn = jax.jit(lambda p, b, c=c: ls.score(p, b, lcfg, c))
        jax.block_until_ready(fn(params, batch))  # compile
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn(params, batch))
            times.append(time.perf_counter() - t)
        out[ratio] = float(np.median(times))
    return out


def update_times(run: Any, params: Any, pt: Any, pm: Any, key: Any,
                 repeats: int = 5) -> dict[str, float]:
    """Median wall seconds of the jitted update program per ``diffusion.surrogate`` (the
    trajectory ratio in both; compiled first; no KL reference; rewards 0/1 alternating)."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np

    from ais_jax.training.llada import steps as ls
    from ais_jax.training.optim import init_train_state

    cfg, lcfg = run.cfg, run.model_cfg
    batch = jax.jit(lambda p, a, b, k: ls.rollout(p, a, b, k, lcfg, cfg, run.codec.eos_ids))(
        params, pt, pm, key)
    G = cfg.rollout.group_size
    rewards = (jnp.arange(batch.tokens.shape[0]) % 2).astype(jnp.float32).reshape(-1, G)
    logp_old = jax.jit(lambda p, b: ls.score(p, b, lcfg, cfg))(params, batch)
    state = init_train_state(params, run.optimizer)
    out = {}
    for sur in ("estimator", "trajectory"):
        c = dataclasses.replace(cfg, diffusion=dataclasses.replace(cfg.diffusion, surrogate=sur))
        fn = jax.jit(lambda s, b, r, lo, c=c: ls.update(s, b, r, key, None, lo, run.optimizer,
                                                        lcfg, c))
        jax.block_until_ready(fn(state, batch, rewards, logp_old))  # compile
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn(state, batch, rewards, logp_old))
            times.append(time.perf_counter() - t)
        out[sur] = float(np.median(times))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, CONFIG))
    ap.add_argument("--model", default="", help="an exported LLaDA warm start (skips the SFT)")
    ap.add_argument("--sft-steps", type=int, default=None, help="shorten the warm start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=16, help="prompts of the batch (x group_size)")
    ap.add_argument("--stress", action="store_true", help="also at block linears x3")
    ap.add_argument("--time-score", action="store_true",
                    help="also time the score program under both ratios")
    ap.add_argument("--time-update", action="store_true",
                    help="also time the update program under both surrogates")
    ap.add_argument("--json", default="", help="also write the result here")
    ap.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = ap.parse_args(argv)

    import jax

    from ais_jax.config.load import load_config
    from ais_jax.training.build import build_run
    from ais_jax.training.rl import grow_prompt_bucket
    from ais_jax.training.warmstart import warm_start

    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="ratio_agreement_")
    over = [f"seed={args.seed}", f"out_dir={tmp}/run", "checkpoint.every=0",
            "log.progress=false", "log.tensorboard=false", "diffusion.ratio=trajectory",
            f"rollout.prompts_per_step={args.prompts}"]
    if args.model:
        over += [f"model.source={args.model}", "model.kind=auto", "sft.steps=0"]
    elif args.sft_steps is not None:
        over += [f"sft.steps={args.sft_steps}",
                 f"sft.warmup_steps={min(50, max(args.sft_steps - 1, 0))}"]
    cfg = load_config(args.config, [*over, *args.overrides])
    run = build_run(cfg)
    params = warm_start(run, run.state.params) if cfg.sft.steps > 0 else run.state.params
    t_warm = time.perf_counter() - t0
    problems = run.train_problems(0, 0, cfg.rollout.prompts_per_step)
    seqs = [run.codec.encode_prompt(p) for p in problems]
    pt, pm = run.codec.pad(seqs, grow_prompt_bucket(run, max(len(s) for s in seqs)))
    key = jax.random.key(args.seed + 1)
    out: dict[str, Any] = {
        "config": os.path.relpath(args.config, ROOT), "model": args.model or "warm start here",
        "sft_steps": cfg.sft.steps, "seed": args.seed, "temperature": cfg.rollout.temperature,
        "fp8_format": cfg.rollout.fp8_format, "compute_dtype": cfg.model.compute_dtype,
        "gen_length": cfg.rollout.max_new_tokens, "diffusion_steps": cfg.diffusion.steps,
        "block_length": cfg.diffusion.block_length, "remasking": cfg.diffusion.remasking,
        "weights": agreement(run, params, pt, pm, key),
    }
    if args.stress:
        layers = {k: (v * 3 if k in BLOCK_LINEARS else v) for k, v in params["layers"].items()}
        out["weights_x3"] = agreement(run, {**params, "layers": layers}, pt, pm, key)
    if args.time_score:
        out["score_s"] = score_times(run, params, pt, pm, key)
    if args.time_update:
        out["update_s"] = update_times(run, params, pt, pm, key)
    out["warm_start_s"] = round(t_warm, 1)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
