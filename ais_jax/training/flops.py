"""Model FLOPs of the update and the rollout, device peaks, MFU, and a step's timing metrics.

The formulas are the usual "model FLOPs" accounting (PaLM's appendix B, verl's
``perf/mfu``): a token costs ``2 N`` FLOPs forward and ``6 N`` forward + backward,
``N`` the parameters that enter a matmul per token (the decoder-block linears and
the output head; the embedding lookup is free), plus the attention scores and
values, ``4 L T_ctx Q H`` per token forward for a context of ``T_ctx`` keys.
`forward_flops` counts the head on ``head_positions`` positions per sequence (all
by default); `grpo_step_flops` and `sampler_flops` count it where the logits are
used (the trainer's completion positions, a prefill's last position).
Recomputation is not counted as model FLOPs (MFU, not hardware utilization);
`update_flops` can count it (``remat_recompute=True``: one more forward per pass)
for the hardware-FLOP view.  MFU divides by the device's *dense* BF16 peak
(`PEAK_BF16_FLOPS`, from the vendors' data sheets); for a device not in the table
(e.g. a CPU) MFU is None and the FLOP rate alone is reported.
`grpo_step_flops` applies the formulas to one GRPO step of either model family and
`perf_record` turns them and the step's clock marks into the ``timing_s/*`` and
``perf/*`` metrics (docs/performance.md).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ais_jax.config.schema import Config
from ais_jax.models.layout import ModelConfig, param_table
from ais_jax.models.llada.model import LLaDAConfig
from ais_jax.models.llada.model import param_table as llada_param_table

# Dense (no sparsity) BF16 matmul peak per device, FLOP/s, keyed by a lowercase substring of
# jax's ``device.device_kind``; the first match wins (longer keys first where they overlap).
PEAK_BF16_FLOPS: dict[str, float] = {
    "h200": 989e12,  # NVIDIA H200 SXM; also matches GH200 (the same peak)
    "h100 pcie": 756e12,
    "h100 nvl": 835e12,
    "h100": 989e12,  # H100 SXM ("NVIDIA H100 80GB HBM3")
    "h800": 989e12,
    "b200": 2250e12,
    "a100": 312e12,
    "l40s": 362e12,
    "l40": 181e12,
    "a10g": 70e12,
    "l4": 121e12,
    "tpu v6": 918e12,  # Trillium ("TPU v6 lite")
    "tpu v5p": 459e12,
    "tpu v5 lite": 197e12,  # v5e
    "tpu v5e": 197e12,
    "tpu v5": 459e12,  # v5p reports "TPU v5"
    "tpu v4": 275e12,
}


class StepFlops(NamedTuple):
    """Model FLOPs of one GRPO step's device programs (`grpo_step_flops`)."""

    update: float  # the update program: its forwards + backwards and the KL reference forward
    score: float  # the separately dispatched logp_old forward (0 when the update needs none)
    rollout: float  # the rollout program: sampling (and LLaDA's log-prob estimates)


def _table(cfg: Any) -> dict[str, Any]:
    return llada_param_table(cfg) if isinstance(cfg, LLaDAConfig) else param_table(cfg)


def head_params(cfg: ModelConfig) -> int:
    """Parameters of the output head, ``V * D`` (a tied head is the embedding)."""
    return cfg.vocab_size * cfg.hidden_size


def block_matmul_params(cfg: ModelConfig) -> int:
    """Parameters of the decoder-block linears (every ``[L, out, in]`` weight), all layers."""
    layers = _table(cfg)["layers"]
    return sum(math.prod(i.shape(cfg)) for i in layers.values() if len(i.dims) == 3)


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters multiplied per token: every 2-D-per-layer linear and the output head.

    Norms, biases and the embedding lookup are excluded; a tied head counts the
    embedding once (as the head).  ``cfg``: a `ModelConfig` or a LLaDA config.
    """
    return block_matmul_params(cfg) + head_params(cfg)


def attention_flops_per_token(cfg: ModelConfig, context: float) -> float:
    """Forward FLOPs of the attention scores and values for one query over ``context`` keys."""
    return 4.0 * cfg.num_layers * context * cfg.num_heads * cfg.head_dim


def forward_flops(cfg: ModelConfig, rows: int, seq_len: int, *,
                  head_positions: int | None = None, causal: bool = True) -> float:
    """Model FLOPs of one forward over ``[rows, seq_len]`` tokens.

    Args:
      cfg: model config (AR or LLaDA).
      rows: sequences.
      seq_len: positions per sequence.
      head_positions: positions per sequence the output head is applied to
        (None: all ``seq_len``).
      causal: causal attention (on average a query attends to ``(seq_len + 1) / 2``
        keys); False: bidirectional (``seq_len`` keys, LLaDA).

    Returns:
      FLOPs (float).
    """
    ctx = (seq_len + 1) / 2 if causal else float(seq_len)
    heads = seq_len if head_positions is None else head_positions
    trunk = rows * seq_len * (2.0 * block_matmul_params(cfg)
                              + attention_flops_per_token(cfg, ctx))
    return trunk + rows * heads * 2.0 * head_params(cfg)


def update_flops(cfg: ModelConfig, rows: int, seq_len: int, *, remat_recompute: bool = False,
                 extra_forwards: int = 0, passes: int = 1, head_positions: int | None = None,
                 causal: bool = True) -> float:
    """Model FLOPs of an update over ``[rows, seq_len]`` tokens: 3 x the forward per pass.

    Args:
      cfg: model config.
      rows: sequences in the update (all minibatches of the step together).
      seq_len: tokens per sequence (prompt + completion).
      remat_recompute: count the forward that full rematerialization recomputes
        (4 instead of 3 forwards per pass: hardware FLOPs, not model FLOPs).
      extra_forwards: separate no-grad forwards over the same tokens (e.g. the
        trainer's logp_old scoring and a KL reference), 1 x the forward each.
      passes: gradient passes over all ``rows`` (``train.epochs``; LLaDA's inner iterations).
      head_positions: see `forward_flops`.
      causal: see `forward_flops`.

    Returns:
      FLOPs (float).
    """
    f = forward_flops(cfg, rows, seq_len, head_positions=head_positions, causal=causal)
    return f * (passes * (3 + int(remat_recompute)) + extra_forwards)


def rollout_flops(cfg: ModelConfig, rows: int, prompt_len: int, new_tokens: int) -> float:
    """Model FLOPs of a KV-cached rollout: the prompt's forward, then one token per step.

    The generic count (every row prefilled, the head on every prompt position, one
    decode step per new token); decode token ``t`` (0-based) attends to
    ``prompt_len + t + 1`` keys.  `sampler_flops` counts this repository's sampler.
    """
    prefill = forward_flops(cfg, rows, prompt_len)
    mean_ctx = prompt_len + (new_tokens + 1) / 2
    decode = rows * new_tokens * (2.0 * matmul_params(cfg)
                                  + attention_flops_per_token(cfg, mean_ctx))
    return prefill + decode


def sampler_flops(cfg: ModelConfig, rows: int, prompt_len: int, new_tokens: int, *,
                  prompts: int | None = None) -> float:
    """Model FLOPs of `ais_jax.rollout.sampler.sample` producing ``new_tokens`` tokens per row.

    The prefill runs the trunk over the ``[prompts, prompt_len]`` prompts (each prompt
    once, its cache shared by its samples; ``prompts`` None: ``rows``) and the head on
    the last position, which gives the first token; each of the other
    ``new_tokens - 1`` tokens is one decode step of all ``rows``, step ``s`` (1-based)
    attending to ``prompt_len + s`` keys (on average ``prompt_len + new_tokens / 2``).
    """
    prefill = forward_flops(cfg, rows if prompts is None else prompts, prompt_len,
                            head_positions=1)
    steps = max(new_tokens - 1, 0)
    decode = rows * steps * (2.0 * matmul_params(cfg)
                             + attention_flops_per_token(cfg, prompt_len + new_tokens / 2))
    return prefill + decode


def diffusion_rollout_flops(cfg: LLaDAConfig, rows: int, prompt_len: int, new_tokens: int,
                            steps: int, estimates: int = 0) -> float:
    """Model FLOPs of a masked-diffusion rollout: ``steps`` bidirectional forwards over
    ``[rows, prompt_len + new_tokens]`` (the head on the ``new_tokens`` response positions),
    plus ``estimates`` log-prob estimates (one forward each) under the rollout weights."""
    f = forward_flops(cfg, rows, prompt_len + new_tokens, head_positions=new_tokens,
                      causal=False)
    return f * (steps + estimates)


def grpo_step_flops(cfg: Config, model_cfg: Any, prompt_len: int, decode_len: int, *,
                    kl: bool, score_separately: bool) -> StepFlops:
    """Model FLOPs of one GRPO step (`ais_jax.training.rl`) of either model family.

    Rows ``B = rollout.prompts_per_step * rollout.group_size``, ``N =
    rollout.max_new_tokens``, ``P = prompt_len`` (the prompt bucket).
    Autoregressive: the trainer's forward runs over ``P + N - 1`` positions with the
    head on the ``N`` completion positions (`ais_jax.training.logprobs`); the update is
    ``train.epochs`` gradient passes over all rows (any minibatch / micro-batch split),
    plus the reference forward under a KL term; the rollout prefills the ``Pn``
    prompts and decodes ``decode_len`` tokens per row.  LLaDA: every forward is
    bidirectional over ``P + N`` positions (head on ``N``), ``M =
    diffusion.inner_iterations`` gradient passes (and ``M`` reference forwards), ``M``
    logp_old forwards (plus ``diffusion.steps`` replay forwards with ``diffusion.ratio:
    trajectory``; ``diffusion.surrogate: trajectory`` makes each gradient pass and the
    reference ``diffusion.steps`` forwards, the reference once); the rollout is
    ``diffusion.steps`` denoising forwards and ``M`` FP8 estimates.

    Args:
      cfg: the run config.
      model_cfg: the policy's `ModelConfig` or LLaDA config.
      prompt_len: the prompt bucket ``P`` the step was padded to.
      decode_len: tokens the AR sampler produced per row (its loop runs until the
        longest completion ends: the largest mask sum); unused for LLaDA.
      kl: the update scores a KL reference (``train.beta_kl > 0`` with reference params).
      score_separately: logp_old comes from the separate score program
        (``StepFns.score_for_update``), not from the update's own forward.

    Returns:
      `StepFlops`.
    """
    r = cfg.rollout
    B, N = r.prompts_per_step * r.group_size, r.max_new_tokens
    if isinstance(model_cfg, LLaDAConfig):
        M, T = cfg.diffusion.inner_iterations, prompt_len + N
        fwd = forward_flops(model_cfg, B, T, head_positions=N, causal=False)
        # diffusion.surrogate=trajectory: each pass replays the steps, the reference once
        traj = cfg.diffusion.surrogate == "trajectory"
        per_pass = cfg.diffusion.steps if traj else 1
        return StepFlops(
            update=fwd * per_pass * (3 * M + (1 if traj else M) * int(kl)),
            # diffusion.ratio=trajectory: the score also replays diffusion.steps forwards
            score=fwd * (M + cfg.diffusion.steps * int(cfg.diffusion.ratio == "trajectory"))
            * int(score_separately),
            rollout=diffusion_rollout_flops(model_cfg, B, prompt_len, N, cfg.diffusion.steps,
                                            estimates=M))
    fwd = forward_flops(model_cfg, B, prompt_len + N - 1, head_positions=N)
    return StepFlops(update=fwd * (3 * cfg.train.epochs + int(kl)),
                     score=fwd * int(score_separately),
                     rollout=sampler_flops(model_cfg, B, prompt_len, decode_len,
                                           prompts=r.prompts_per_step))


def peak_flops(device: Any | str) -> float | None:
    """Dense BF16 peak FLOP/s of a jax device (or its ``device_kind`` string); None if unknown."""
    kind = (device if isinstance(device, str) else getattr(device, "device_kind", "")).lower()
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in kind:
            return peak
    return None


def mfu(flops: float, seconds: float, device: Any | str, num_devices: int = 1) -> float | None:
    """Model FLOP utilization: ``flops / seconds / (num_devices * peak)``; None if the peak
    is unknown or ``seconds`` is not positive."""
    peak = peak_flops(device)
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / (num_devices * peak)


# The keys `perf_record` writes (``perf/mfu`` only where the device's peak is known).
TIMING_KEYS = ("timing_s/rollout", "timing_s/host", "timing_s/update", "perf/tokens_per_s",
               "perf/rollout_flops_per_s", "perf/update_flops_per_s", "perf/mfu")


class StepTimes(NamedTuple):
    """``time.perf_counter()`` marks of one GRPO step (`ais_jax.training.rl`), in order."""

    start: float  # the step begins (prompts are encoded next)
    rollout: float  # the rollout program is dispatched
    tokens: float  # its tokens and mask are on the host
    update: float  # the update program is dispatched (decode, verify, rewards done)
    done: float  # the update's metrics are on the host


def perf_record(t: StepTimes, tokens: float, flops: StepFlops, device: Any | str,
                num_devices: int) -> dict[str, float]:
    """A step's ``timing_s/*`` and ``perf/*`` metrics (docs/performance.md).

    The logp_old forward (``flops.score``) is dispatched right after the rollout and
    runs while the host works, so the update interval alone may miss part of it.  The
    device time of score + update is taken as ``min(U * (F_u + F_s) / F_u, U + H)``
    (``U``: update interval, ``H``: host interval after the rollout): the first term
    is exact when the score finished within the host interval, the second when it
    did not (the device then ran score and update back to back); at one FLOP rate
    over both programs each is an upper bound of that time, so the rate is never
    overstated.

    Args:
      t: the step's time marks.
      tokens: real completion tokens generated (the rollout mask's sum).
      flops: the step's `StepFlops`.
      device: a jax device or its ``device_kind`` (for the peak).
      num_devices: devices the programs ran on (``jax.device_count()``).

    Returns:
      ``{key: value}`` over `TIMING_KEYS`; ``perf/mfu`` is left out when the peak
      is unknown (e.g. a CPU).
    """
    rollout, host, update = t.tokens - t.rollout, t.update - t.tokens, t.done - t.update
    busy = update
    if flops.score > 0 and flops.update > 0:
        busy = min(update * (flops.update + flops.score) / flops.update, update + host)
    total = flops.update + flops.score
    rec = {"timing_s/rollout": rollout, "timing_s/host": t.rollout - t.start + host,
           "timing_s/update": update, "perf/tokens_per_s": _rate(tokens, rollout),
           "perf/rollout_flops_per_s": _rate(flops.rollout, rollout),
           "perf/update_flops_per_s": _rate(total, busy)}
    util = mfu(total, busy, device, num_devices)
    if util is not None:
        rec["perf/mfu"] = util
    return rec


def _rate(x: float, seconds: float) -> float:
    return x / seconds if seconds > 0 else float("nan")  # nan: written as null
