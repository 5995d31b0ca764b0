"""Synchronous against asynchronous GRPO steps (``rollout.staleness``), side by side in one process.

Both arms build the same run from the same config (default: the embedded default,
``configs/tiny_arithmetic.yaml``, with ``--set`` overrides) and step through the same
problems; they alternate round by round (the order rotates), and every figure is a median
over the timed steps of all rounds.

* ``sync`` (``rollout.staleness=0``): sample with the current params, wait for the tokens,
  decode and verify on the host, update.
* ``async k`` (``rollout.staleness=k``, `ais_jax.training.stale.StaleRollouts`): dispatch
  step ``t + k``'s rollout, then learn from step ``t``'s batch, sampled earlier: the host's
  decoding and verification of step ``t`` run while the device samples step ``t + k``.

``--split R`` adds a third arm, ``async k`` with ``mesh.rollout_devices=R``: the sampler on
R devices of its own (`ais_jax.training.split_rollout`), so that the rollout of step t + k
and the update of step t run at the same time; on a CPU, ``JAX_NUM_CPU_DEVICES=2`` gives the
trainer one device and the sampler the other.  Per arm it prints
steps per second and the medians of the step's ``timing_s/*`` intervals
(`ais_jax.training.flops`: ``rollout`` is the time the host waited for the tokens, ``host``
the prompt encoding, decoding and verification, ``update`` from the update's dispatch to its
metrics), then the async / sync ratio.  The prompt bucket is fixed up front (no
recompilation mid-benchmark) and the first ``--warmup`` steps of each arm (compilation) are
not timed.

``--host-delay S`` adds a user reward that sleeps ``S`` seconds per batch in all (a
verifier that runs code or calls a service): host work the asynchronous step can hide
behind the next rollout.

    python benchmarks/async_step.py [--k 1] [--steps 6 --rounds 2 --warmup 2]
        [--host-delay 0.15] [--set KEY=V ...]
    JAX_NUM_CPU_DEVICES=2 python benchmarks/async_step.py --split 1

On a GPU or TPU: the same command (one process, the accelerator's devices shared).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

KEYS = ("timing_s/rollout", "timing_s/host", "timing_s/update")


class Arm:
    """One run (config + ``rollout.staleness=k``) stepped by hand, as `ais_jax.run.loop` does."""

    def __init__(self, name: str, k: int, overrides: list[str], total: int) -> None:
        import jax

        from ais_jax.config.load import load_config
        from ais_jax.config.schema import DEFAULT_CONFIG_PATH
        from ais_jax.training.build import build_run
        from ais_jax.training.rl import grow_prompt_bucket, make_rl_step
        from ais_jax.training.stale import StaleRollouts

        out = tempfile.mkdtemp(prefix="async_step_")
        cfg = load_config(DEFAULT_CONFIG_PATH, [f"out_dir={out}", "checkpoint.every=0",
                                                "log.timing=true", f"train.steps={total}",
                                                *overrides, f"rollout.staleness={k}"])
        self.name, self.k, self.cfg = name, k, cfg
        self.run = run = build_run(cfg)
        P = cfg.rollout.prompts_per_step
        longest = max(len(run.codec.encode_prompt(p))
                      for s in range(total) for p in run.train_problems(0, s, P))
        grow_prompt_bucket(run, longest)
        self.rl_step, self.state, self.next = make_rl_step(run), run.state, 0
        root = jax.random.key(cfg.seed)
        self.key = lambda s: jax.random.fold_in(root, s)
        self.problems = lambda s: run.train_problems(0, s, P)
        self.stale = None
        if k:
            self.stale = StaleRollouts(self.rl_step, self.problems, self.key, total, k)
            self.stale.fill(self.state.params, 0)
        self.times: list[float] = []
        self.parts: dict[str, list[float]] = {key: [] for key in KEYS}

    def step(self, timed: bool) -> None:
        """One RL step (the next one of the run)."""
        s, t0 = self.next, time.perf_counter()
        if self.stale is not None:
            self.state, rec = self.stale.step(self.state, s)
        else:
            self.state, rec = self.rl_step(self.state, self.problems(s), self.key(s))
        dt = time.perf_counter() - t0
        self.next += 1
        if timed:
            self.times.append(dt)
            for key in KEYS:
                self.parts[key].append(rec[key])


def _slow_reward(seconds: float) -> str:
    """A config override adding a zero-weight user reward that sleeps ``seconds`` per batch."""
    import os

    path = os.path.join(tempfile.mkdtemp(prefix="async_step_reward_"), "slow.py")
    with open(path, "w") as f:
        f.write("import time\n\n\ndef slow(completions, prompts, rows):\n"
                f"    time.sleep({seconds!r})\n    return [0.0] * len(completions)\n\n\n"
                "slow.batched = True\n")
    return f"reward.functions.slow={path}:slow"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=1, help="the async arm's rollout.staleness")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per arm per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps per arm")
    ap.add_argument("--host-delay", type=float, default=0.0,
                    help="seconds of host work per batch added by a sleeping user reward")
    ap.add_argument("--split", type=int, default=0,
                    help="add an async arm with mesh.rollout_devices=N (needs N more devices)")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides KEY=VALUE")
    a = ap.parse_args(argv)
    if a.host_delay > 0:
        a.set = [*a.set, _slow_reward(a.host_delay)]
    total = a.warmup + a.steps * a.rounds + a.k + 1
    arms = [Arm("sync", 0, a.set, total), Arm(f"async k={a.k}", a.k, a.set, total)]
    if a.split:
        arms.append(Arm(f"async k={a.k} split", a.k,
                        [*a.set, f"mesh.rollout_devices={a.split}"], total))
    for arm in arms:
        for _ in range(a.warmup):
            arm.step(timed=False)
    for rnd in range(a.rounds):
        for arm in arms[rnd % len(arms):] + arms[:rnd % len(arms)]:
            for _ in range(a.steps):
                arm.step(timed=True)
    cfg = arms[0].cfg
    r = cfg.rollout
    print(f"config: {r.prompts_per_step} prompts x {r.group_size}, {r.max_new_tokens} new "
          f"tokens, rollout {r.precision}; host delay {a.host_delay:g} s per batch; "
          f"{a.rounds} rounds x {a.steps} timed steps per arm")
    rate: dict[str, float] = {}
    for arm in arms:
        med = statistics.median(arm.times)
        rate[arm.name] = 1.0 / med
        parts = ", ".join(f"{k.split('/')[1]} {statistics.median(v):.3f} s"
                          for k, v in arm.parts.items())
        print(f"{arm.name:>10}: {1.0 / med:.3f} steps/s (median step {med:.3f} s; {parts})")
    for arm in arms[1:]:
        print(f"{arm.name} / sync steps per second: {rate[arm.name] / rate[arms[0].name]:.2f}x")


if __name__ == "__main__":
    main()
