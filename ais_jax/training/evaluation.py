"""Held-out evaluation of the policy: `ais_jax.tasks.evaluate` driven by a jitted sampler.

`make_evaluator(run)` returns ``evaluate(params) -> dict`` with greedy pass@1
(``accuracy``), the mean greedy response length in tokens (``response_len``,
EOS included) and, with ``eval.num_samples = k > 1``, the sampled accuracy
(mean over k samples at the rollout's temperature / top-k / top-p) and
``pass@k``.  Each completion is verified once (by `tasks.evaluate`; with several
processes by `ais_jax.training.evaluation_rows`, on the process whose devices sampled it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ais_jax.rollout import sampler
from ais_jax.rollout.sampler import bucket_length
from ais_jax.tasks.evaluate import evaluate as evaluate_policy
from ais_jax.training import sharding as shd
from ais_jax.training.build import Run
from ais_jax.training.evaluation_rows import sample_chunk
from ais_jax.training.placement import to_host
from ais_jax.training.policy import cast_params
from ais_jax.training.steps import model_shardings


def _sampler_fn(run: Run, num_samples: int) -> Any:
    """Jitted ``(params, prompt_tokens, prompt_mask, key) -> Rollout`` over the run's mesh."""
    r, greedy = run.cfg.rollout, num_samples == 1
    fns = run.fns
    rep = shd.replicated(run.mesh)
    if run.is_llada:
        return _llada_sampler_fn(run, num_samples)

    def fn(p: Any, pt: jax.Array, pm: jax.Array, key: jax.Array) -> sampler.Rollout:
        return sampler.sample(
            cast_params(p, jnp.bfloat16), pt, pm, key, run.model_cfg,
            max_new_tokens=r.max_new_tokens, temperature=0.0 if greedy else r.temperature,
            top_k=0 if greedy else r.top_k, top_p=1.0 if greedy else r.top_p,
            eos_id=run.codec.eos_ids or None, num_samples=num_samples)

    return jax.jit(fn, in_shardings=(model_shardings(fns), fns.batch_sharding,
                                     fns.batch_sharding, rep),
                   out_shardings=fns.batch_sharding)


class _Responses(NamedTuple):
    tokens: jax.Array  # [R, N]
    mask: jax.Array  # [R, N] bool: through the first EOS


def _llada_sampler_fn(run: Run, num_samples: int) -> Any:
    """The LLaDA counterpart of `_sampler_fn`: BF16 denoising (greedy: temperature 0)."""
    from ais_jax.rollout.llada_sampler import completion_mask, generate

    r, d, greedy = run.cfg.rollout, run.cfg.diffusion, num_samples == 1
    fns, eos = run.fns, run.codec.eos_ids

    def fn(p: Any, pt: jax.Array, pm: jax.Array, key: jax.Array) -> _Responses:
        out = generate(cast_params(p, jnp.bfloat16), run.model_cfg, pt, key,
                       gen_length=r.max_new_tokens, block_length=d.block_length, steps=d.steps,
                       temperature=0.0 if greedy else r.temperature, remasking=d.remasking,
                       num_samples=num_samples, prompt_mask=pm)
        toks = out.tokens[:, pt.shape[1]:]
        return _Responses(toks, completion_mask(toks, eos))

    return jax.jit(fn, in_shardings=(model_shardings(fns), fns.batch_sharding,
                                     fns.batch_sharding, shd.replicated(run.mesh)),
                   out_shardings=fns.batch_sharding)


class SamplerPolicy:
    """A ``policy_fn(prompts, num_samples, greedy)`` for `tasks.evaluate` over jitted samplers.

    Prompts arrive as rendered strings (`PromptCodec.prompt_text`) in chunks of
    at most ``batch_size``; each chunk is padded to ``batch_size`` rows so one
    compilation serves every chunk.  Sampled chunk ``i`` (starting at prompt
    ``start``) uses the key ``fold_in(key(seed), start)``.  Greedy completions'
    token counts are kept in ``greedy_lengths``.
    """

    def __init__(self, run: Run, params: Any, greedy_fn: Any, sampled_fn: Any,
                 batch_size: int) -> None:
        self.run, self.params, self.batch_size = run, params, batch_size
        self.greedy_fn, self.sampled_fn = greedy_fn, sampled_fn
        self.greedy_lengths: list[float] = []
        self._sampled_start = 0

    def __call__(self, prompts: list[str], num_samples: int, greedy: bool) -> list[list[str]]:
        run, n = self.run, len(prompts)
        ids = [run.codec.encode_text(t) for t in prompts]
        if greedy:
            out = sample_chunk(run, self.greedy_fn, self.params, ids, self.batch_size,
                               jax.random.key(0))
        else:
            key = jax.random.fold_in(jax.random.key(run.cfg.seed), self._sampled_start)
            self._sampled_start += n
            out = sample_chunk(run, self.sampled_fn, self.params, ids, self.batch_size, key)
        toks, msk = to_host(out.tokens), to_host(out.mask)
        k = 1 if greedy else num_samples
        texts = [[run.codec.decode(toks[j * k + g], msk[j * k + g]) for g in range(k)]
                 for j in range(n)]
        if greedy:
            self.greedy_lengths += [float(np.sum(msk[j] > 0)) for j in range(n)]
        return texts


def make_evaluator(run: Run, problems: Sequence[Any] | None = None,
                   num_samples: int | None = None) -> tuple[Callable[[Any], dict[str, float]],
                                                            Any]:
    """``(evaluate(params) -> dict, greedy_fn)``; ``greedy_fn`` exposes its compile count.

    Args:
      run: the built run.
      problems: the problems to evaluate on; None: the held-out ``run.eval_problems``
        (the warm-start criterion passes training-split validation problems).
      num_samples: samples per problem; None: ``eval.num_samples`` (1: greedy only).
    """
    k = run.cfg.eval.num_samples if num_samples is None else num_samples
    probs = run.eval_problems if problems is None else list(problems)
    greedy_fn = _sampler_fn(run, 1)
    sampled_fn = _sampler_fn(run, k) if k > 1 else None
    n_eval = len(probs)
    batch = bucket_length(min(64, max(1, n_eval)), multiple=shd.batch_divisor(run.mesh),
                          pow2_max=0)

    def evaluate(params: Any) -> dict[str, float]:
        if jax.process_count() > 1:  # each process verifies the rows it sampled
            from ais_jax.training.evaluation_rows import evaluate_rows

            return evaluate_rows(run, params, probs, greedy_fn, sampled_fn, k, batch)
        policy = SamplerPolicy(run, params, greedy_fn, sampled_fn, batch)
        res = evaluate_policy(policy, run.task, probs, k=max(k, 1),
                              num_samples=k if k > 1 else 0, prompt_fn=run.codec.prompt_text,
                              batch_size=batch)
        out = {"accuracy": res.accuracy, "n": res.n,
               "response_len": float(np.mean(policy.greedy_lengths))}
        if res.pass_at_k is not None:
            out["sampled_accuracy"] = res.sampled_accuracy
            out[f"pass@{k}"] = res.pass_at_k
        return out

    return evaluate, greedy_fn
