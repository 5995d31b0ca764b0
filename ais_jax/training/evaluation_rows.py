"""Held-out evaluation across the processes of a run: each process decodes and verifies only
the rows its devices sampled (issue 37 item 5), as the RL step scores its rows.

`evaluate_rows` computes what `ais_jax.training.evaluation.make_evaluator`'s one-process path
computes through `ais_jax.tasks.evaluate` (greedy pass@1, the mean greedy length in tokens,
and with ``k > 1`` samples the sampled accuracy and pass@k, from the same chunks, padding and
keys), but reads each chunk's completions from this process's own shards
(`ais_jax.training.placement.owned_rows` / `rows_to_host`) and puts the verdicts together with
`combine_rows`: one all-gather of two numbers per row, never of tokens.  A verifier that fails
on one process stops every process with its line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ais_jax.tasks.evaluate import pass_at_k
from ais_jax.training.build import Run
from ais_jax.training.placement import combine_rows, owned_rows, rows_to_host, to_global


def sample_chunk(run: Run, fn: Any, params: Any, ids: Sequence[Sequence[int]], batch: int,
                 key: jax.Array) -> Any:
    """Sample one evaluation chunk, as both evaluation paths do.

    Args:
      run: the built run.
      fn: a jitted sampler ``(params, pt, pm, key) -> out`` (rows ``j * k + g``).
      params: the model's params.
      ids: the token ids of at most ``batch`` prompts (at least one).
      batch: rows per call: the chunk is padded to it by repeating its last prompt, so one
        compilation serves every chunk.
      key: the sampling key.

    Returns:
      ``fn``'s output for the padded chunk, its prompts padded to ``run.prompt_bucket`` and
      placed on the run's batch sharding.
    """
    ids = [*ids, *[ids[-1]] * (batch - len(ids))]
    pt, pm = run.codec.pad(ids, run.prompt_bucket)
    sh = run.fns.batch_sharding
    return fn(params, to_global(pt, sh), to_global(pm, sh), key)


def evaluate_rows(run: Run, params: Any, problems: Sequence[Any], greedy_fn: Any,
                  sampled_fn: Any, k: int, batch: int) -> dict[str, float]:
    """The evaluation dict of `make_evaluator` (``accuracy``, ``n``, ``response_len``; with
    ``k > 1`` also ``sampled_accuracy`` and ``pass@k``), verified where the rows are.

    Args:
      run: the built run.
      params: the model's params.
      problems: the ``n`` problems.
      greedy_fn: the jitted greedy sampler ``(params, pt, pm, key) -> out`` (``out.tokens``,
        ``out.mask`` ``[batch, N]``).
      sampled_fn: the jitted ``k``-sample sampler (rows ``j * k + g``), or None.
      k: samples per problem (1: greedy only).
      batch: prompts per sampler call (chunks are padded to it).
    """
    codec, task = run.codec, run.task
    n = len(problems)

    def chunk_verdicts(fn: Any, start: int, m: int, key: jax.Array) -> np.ndarray:
        """``[len(chunk) * m, 2]``: verdict (0 / 1) and completion tokens of each row."""
        chunk = problems[start:start + batch]
        out = sample_chunk(run, fn, params,
                           [codec.encode_text(codec.prompt_text(p)) for p in chunk], batch, key)
        rows = owned_rows(out.tokens)
        toks, msk = rows_to_host(out.tokens, rows), rows_to_host(out.mask, rows)
        try:
            mine = np.zeros((len(rows), 2), np.float32)
            for i, r in enumerate(rows):
                if r // m < len(chunk):  # not a padding row
                    text = codec.decode(toks[i], msk[i])
                    mine[i] = (float(bool(task.verify(text, chunk[r // m]))),
                               float(np.sum(msk[i] > 0)))
            error = ""
        except Exception as e:  # a peer must not wait for a process that failed alone
            mine, error = None, " ".join(str(e).split()) or type(e).__name__
        return combine_rows(mine, rows, batch * m, 2, error)[:len(chunk) * m]

    greedy = np.concatenate([chunk_verdicts(greedy_fn, s, 1, jax.random.key(0))
                             for s in range(0, n, batch)])
    out = {"accuracy": int(greedy[:, 0].sum()) / n, "n": n,
           "response_len": float(np.mean([float(x) for x in greedy[:, 1]]))}
    if k > 1:
        root = jax.random.key(run.cfg.seed)
        sampled = np.concatenate([chunk_verdicts(sampled_fn, s, k, jax.random.fold_in(root, s))
                                  for s in range(0, n, batch)])
        counts = [int(c) for c in sampled[:, 0].reshape(n, k).sum(axis=1)]
        out["sampled_accuracy"] = sum(counts) / (n * k)
        out[f"pass@{k}"] = sum(pass_at_k(k, c, k) for c in counts) / n
    return out
