# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · The AIS coefficient as a library function
#
# `ais_jax.ais_coefficient` takes, for every generated token, the log-prob the
# BF16 trainer gives it (`logp_train`), the log-prob the FP8 sampler recorded
# (`logp_rollout`), its advantage `A` and a validity mask, and returns the
# reweighted advantage `A_tilde` plus the batch statistics that decided it
# (docs/spec.md section 4):
#
# ```
# w_bar   = min(exp(logp_train - logp_rollout), C)          C = 5
# w_tilde = 1 + alpha * (w_bar - 1)          A_tilde = w_tilde * A
# alpha   = clip(alpha_ess - beta_var * alpha_var, 0, 1) * alpha_mis
# ```
#
# | statistic | formula | role |
# |---|---|---|
# | `alpha_ess` | `(1 + CV^2) ** -0.5`, CV = std(w_bar, ddof=1) / mean(w_bar) | weight reliability (= sqrt of the ESS ratio) |
# | `alpha_mis` | `min(1, d_bar / delta)`, d_bar = mean \|logp_train - logp_rollout\|, delta = 0.02 | divergence severity: no correction when the policies agree |
# | `alpha_var` | `max(0, (D - gamma) / gamma)`, D = std(A * w_bar) / (std(A) + eps), gamma = 1.2 | variance amplification of the reweighting |
#
# `beta_var` (default 1.0) is not in the paper's v1 hyperparameter list; it is a
# config value (`ais.beta_var`). Everything runs under `stop_gradient`, in
# float32, over the valid tokens of the whole batch, for inputs of any shape.
#
# <!-- The rows of the table above cannot be wrapped at 100 columns: # ruff: noqa: E501 -->

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from ais_jax import ais_coefficient

print("jax", jax.__version__, "on", jax.default_backend())


def fmt(xs):
    return "[" + ", ".join(f"{float(x):.3f}" for x in np.asarray(xs)) + "]"


# %% [markdown]
# ## The worked example of docs/spec.md
#
# Four tokens with truncated ratios `w_bar = [0.8, 1.0, 1.2, 2.0]` and advantages
# `A = [1.2, 0.4, -0.2, -0.8]`. We set `logp_rollout = 0` and `logp_train = log(w_bar)`,
# so that `exp(logp_train - logp_rollout)` is exactly `w_bar` (all below the cap C = 5).
# Here `d_bar = mean |log w_bar| = 0.27 > delta`, so `alpha_mis = 1` as in the SPEC.

# %%
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

# %% [markdown]
# The same numbers by hand with NumPy (sample standard deviations, `ddof=1`):

# %%
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

# %% [markdown]
# ## Modes: `ais`, `tis`, `none`
#
# `mode="tis"` is full truncated importance sampling (alpha = 1, `w_tilde = w_bar`);
# `mode="none"` is no correction (alpha = 0, `w_tilde = 1`). The statistics are
# computed and returned in every mode (they are logged either way). In the trainer
# the mode is the config key `ais.mode`.

# %%
for mode in ("ais", "tis", "none"):
    r = ais_coefficient(logp_train, logp_rollout, adv, mask, mode=mode)
    print(f"mode={mode:4s} alpha={float(r.alpha):.3f} w_tilde={fmt(r.weights)} "
          f"A_tilde={fmt(r.advantages)}")

# %% [markdown]
# ## Masks, garbage in padding, and the necessity gate
#
# Masked positions may hold anything (NaN, Inf): they are selected away with
# `where` and get `w_tilde = 1`, `A_tilde = 0`. With no valid token alpha is 0.
# Below, two padding positions holding NaN / Inf leave the result of the worked
# example unchanged.
#
# The gate `alpha_mis = min(1, d_bar / 0.02)`: batches whose log-ratios are
# `+-d` (so `d_bar = d`) give docs/spec.md's table 0.002 -> 0.10, 0.010 -> 0.50,
# >= 0.020 -> 1.00.

# %%
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

# %% [markdown]
# ## alpha over the (d_bar, CV) plane
#
# To see where AIS corrects and where it does not, we synthesize token batches with
# a chosen mean |log-ratio| `d_bar` and coefficient of variation `CV` of the
# truncated weights, and run `ais_coefficient` on each (one `jax.vmap`).
#
# Construction (N = 8192 tokens): a fraction `p` of the tokens disagree by `+L` or
# `-L` nats (half each), the rest agree exactly. Then `d_bar = p * L`, and for a
# fixed `d_bar` the CV grows with `L` up to `L = log C` (larger `L` is truncated
# at `w_bar = C`). So a given `d_bar` reaches only CVs from about `d_bar` (every
# token off by `+-d_bar`) up to about `sqrt(7 * d_bar)` (rare outliers at the cap):
# the white areas of the plots are batches this construction (and, near the upper
# edge, the cap C itself) cannot produce. The advantages are random `+-1` per
# token, independent of the weights.

# %%
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

# %% [markdown]
# The red star is the FP8 SmolLM2-135M sampler measured by
# `benchmarks/fp8_mismatch_smollm2.py` (d_bar = 0.182, ESS ratio 0.931, so
# CV = sqrt(1/0.931 - 1) = 0.27; see docs/fp8_guide.md). The dashed line is
# `d_bar = delta = 0.02`.

# %%
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

# %% [markdown]
# Reading the plots:
#
# * **Left of the dashed line** (`d_bar < 0.02`) alpha is the necessity gate:
#   `alpha_mis = d_bar / 0.02` grows linearly, whatever the CV. Policies that nearly
#   agree are left (almost) uncorrected: correcting them would only add variance.
# * **Right of it** `alpha_mis = 1` and alpha follows `alpha_ess = (1 + CV^2)^-1/2`:
#   about 0.96 at the SmolLM2 operating point.
# * **At large CV** the reweighted advantages spread more than the raw ones.
#   With advantages independent of the weights, `D = std(A w) / std(A)` is about
#   `mean(w) * sqrt(1 + CV^2)`; once it passes `gamma = 1.2` the penalty
#   `alpha_var` subtracts from `alpha_ess`, and near CV = 1 alpha reaches 0: the
#   weights are judged too noisy to use, and AIS falls back to no correction.
#
# `alpha_var` depends on how advantages and weights co-vary; with other advantage
# patterns (e.g. large weights on the negative-advantage tokens) the right-hand
# region looks different.
