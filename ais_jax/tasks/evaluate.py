"""Evaluate a policy on task problems: greedy pass@1 and sampled pass@k (Chen et al. 2021).

The policy is any callable ``policy_fn(prompts, num_samples, greedy) ->
completions`` with ``completions[i]`` the list of ``num_samples`` strings for
``prompts[i]``, so this module knows nothing about models or samplers.

pass@k per problem with n samples of which c are correct is the unbiased
estimator ``1 - C(n - c, k) / C(n, k)`` (1 when ``n - c < k``), computed as
the stable product ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``; the result
is its mean over problems.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ais_jax.tasks.base import Problem, Task

PolicyFn = Callable[[list[str], int, bool], list[list[str]]]


@dataclass(frozen=True)
class EvalResult:
    """Evaluation summary.

    Attributes:
      n: number of problems.
      accuracy: greedy pass@1 (fraction of problems whose greedy completion verifies).
      pass_at_k: mean unbiased pass@k over sampled completions (None when no
        sampling was done).
      k: the k of ``pass_at_k``.
      num_samples: sampled completions per problem (0: greedy only).
      sampled_accuracy: mean fraction of correct sampled completions (None
        without sampling).
      format_rate: fraction of greedy completions in the requested answer form.
      mean_response_len: mean length of the greedy completions (``length_fn``,
        characters by default).
    """

    n: int
    accuracy: float
    pass_at_k: float | None
    k: int
    num_samples: int
    sampled_accuracy: float | None
    format_rate: float
    mean_response_len: float


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one problem: ``n`` samples, ``c`` correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _call_policy(
    policy_fn: PolicyFn, prompts: list[str], num_samples: int, greedy: bool, batch_size: int
) -> list[list[str]]:
    out: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        got = policy_fn(chunk, num_samples, greedy)
        if not isinstance(got, list | tuple) or len(got) != len(chunk):
            raise ValueError(
                f"policy_fn returned {type(got).__name__} of length "
                f"{len(got) if hasattr(got, '__len__') else '?'} for {len(chunk)} prompts; it must "
                "return one list of completions per prompt."
            )
        for row in got:
            if not isinstance(row, list | tuple) or len(row) != num_samples:
                raise ValueError(
                    f"policy_fn must return {num_samples} completion(s) per prompt, "
                    f"got {row!r:.80}."
                )
            if not all(isinstance(s, str) for s in row):
                raise ValueError("policy_fn completions must be strings (decode the tokens first).")
            out.append(list(row))
    return out


def evaluate(
    policy_fn: PolicyFn,
    task: Task,
    problems: Sequence[Problem],
    *,
    k: int = 1,
    num_samples: int | None = None,
    prompt_fn: Callable[[Problem], str] | None = None,
    batch_size: int = 64,
    length_fn: Callable[[str], int] = len,
) -> EvalResult:
    """Greedy accuracy and (optionally) sampled pass@k of a policy.

    Args:
      policy_fn: ``(prompts, num_samples, greedy) -> [[completion] * num_samples] * len(prompts)``.
      task: the task whose verifier judges the completions.
      problems: the problems (e.g. ``task.generate(0, 200, "eval")``).
      k: k of pass@k.  Sampling runs when ``k > 1`` or ``num_samples`` is given.
      num_samples: samples per problem for pass@k (default ``k``; must be >= k).
      prompt_fn: ``Problem -> prompt string``; default ``task.compact_prompt``.
        For an instruct model pass e.g. ``lambda p: tok.apply_chat_template(
        task.chat_messages(p), tokenize=False, add_generation_prompt=True)``.
      batch_size: prompts per ``policy_fn`` call.
      length_fn: response length measure (e.g. a token counter).

    Returns:
      An `EvalResult`.
    """
    if not problems:
        raise ValueError("evaluate needs at least one problem.")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")
    samples = (k if k > 1 else 0) if num_samples is None else num_samples
    if samples and samples < k:
        raise ValueError(f"num_samples ({samples}) must be >= k ({k}) for pass@k.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    render = task.compact_prompt if prompt_fn is None else prompt_fn
    prompts = [render(p) for p in problems]

    greedy = [row[0] for row in _call_policy(policy_fn, prompts, 1, True, batch_size)]
    correct = [task.verify(text, p) for text, p in zip(greedy, problems, strict=True)]
    n = len(problems)
    result = EvalResult(
        n=n,
        accuracy=sum(correct) / n,
        pass_at_k=None,
        k=k,
        num_samples=samples,
        sampled_accuracy=None,
        format_rate=sum(task.format_ok(t) for t in greedy) / n,
        mean_response_len=sum(length_fn(t) for t in greedy) / n,
    )
    if not samples:
        return result
    sampled = _call_policy(policy_fn, prompts, samples, False, batch_size)
    counts = [sum(task.verify(t, p) for t in row) for row, p in zip(sampled, problems, strict=True)]
    return replace(
        result,
        pass_at_k=sum(pass_at_k(samples, c, k) for c in counts) / n,
        sampled_accuracy=sum(counts) / (n * samples),
    )
