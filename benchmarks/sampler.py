"""Sampler throughput: `ais_jax.rollout.sampler.sample` against `transformers` `generate` (CPU).

Both sample the same random Llama (a `LlamaForCausalLM` built from a config and
copied into the `ais_jax` params layout) on the same batch, full-vocabulary
sampling at temperature 1, no EOS (``min_new_tokens == max_new_tokens``), in
one process, alternating the contenders round after round; medians and the
median of the per-round ratios are printed.  Compile time (first call) is
reported apart.  The machines are shared and noisy: compare within one run.

    python benchmarks/sampler.py                      # the issue's default config
    python benchmarks/sampler.py --rounds 9 --variants f32,bf16,fp8 --json out.json

On a shared machine PyTorch's OpenMP threads spin at every barrier and lose
badly to other processes (generate fell to ~40 tokens/s here at load 5);
``OMP_WAIT_POLICY=PASSIVE`` gives generate its fair speed back.  The setting
is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=1408)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=64, help="new tokens per row")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--variants", default="f32,bf16,fp8",
                    help="comma list of ais_jax params: f32, bf16, fp8 (FP8 rollout copy of "
                    "f32), and each with a _fused suffix (rollout.fused_linears layout)")
    ap.add_argument("--segments", type=int, default=4, help="sample(decode_segments=...)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers.generate")
    ap.add_argument("--json", default=None, help="write the results here")
    return ap.parse_args(argv)


def hf_to_params(model, n_layers: int) -> dict:
    """Copy a `LlamaForCausalLM`'s weights into the `ais_jax.models.model` layout (float32)."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    def stack(name: str) -> np.ndarray:
        return np.stack([sd[f"model.layers.{i}.{name}"] for i in range(n_layers)])

    layers = {
        "attn_norm": stack("input_layernorm.weight"),
        "mlp_norm": stack("post_attention_layernorm.weight"),
        "wq": stack("self_attn.q_proj.weight"), "wk": stack("self_attn.k_proj.weight"),
        "wv": stack("self_attn.v_proj.weight"), "wo": stack("self_attn.o_proj.weight"),
        "w_gate": stack("mlp.gate_proj.weight"), "w_up": stack("mlp.up_proj.weight"),
        "w_down": stack("mlp.down_proj.weight"),
    }
    params = {"embed": sd["model.embed_tokens.weight"], "layers": layers,
              "final_norm": sd["model.norm.weight"], "lm_head": sd["lm_head.weight"]}
    return jax.tree_util.tree_map(jnp.asarray, params)


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ais_jax.models import fp8, fused
    from ais_jax.models.model import ModelConfig, forward
    from ais_jax.rollout.sampler import sample

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    head_dim = a.hidden // a.heads
    max_pos = max(512, a.prompt + a.new)
    hf_cfg = LlamaConfig(
        hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate, vocab_size=a.vocab,
        max_position_embeddings=max_pos, tie_word_embeddings=False, rms_norm_eps=1e-6,
    )
    hf = LlamaForCausalLM(hf_cfg).eval()
    cfg = ModelConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_layers=a.layers, num_heads=a.heads, num_kv_heads=a.kv_heads,
                      head_dim=head_dim, rms_norm_eps=1e-6, max_position_embeddings=max_pos)
    p32 = hf_to_params(hf, a.layers)
    rng = np.random.default_rng(0)
    prompt_np = rng.integers(0, a.vocab, (a.batch, a.prompt)).astype(np.int32)
    prompt, pmask = jnp.asarray(prompt_np), jnp.ones((a.batch, a.prompt), jnp.bool_)
    ids = torch.from_numpy(prompt_np.astype(np.int64))

    # Same weights? (a check of the conversion, not part of the timing)
    with torch.no_grad():
        ref = hf(ids).logits.float().numpy()
    parity = float(np.max(np.abs(np.asarray(forward(p32, prompt, cfg)) - ref)))

    params = {"f32": p32, "bf16": jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), p32),
              "fp8": fp8.to_rollout_params(p32)}
    params.update({f"{k}_fused": fused.fuse_linears(v) for k, v in params.items()})
    n_tok = a.batch * a.new

    def run_jax(name: str, r: int) -> None:
        out = sample(params[name], prompt, pmask, jax.random.key(r), cfg, max_new_tokens=a.new,
                     temperature=1.0, decode_segments=a.segments)
        jax.block_until_ready(out)

    def run_hf(r: int) -> None:
        torch.manual_seed(r)
        with torch.no_grad():
            out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                              max_new_tokens=a.new, min_new_tokens=a.new, temperature=1.0,
                              top_k=0, top_p=1.0, pad_token_id=0, use_cache=True)
        assert out.shape == (a.batch, a.prompt + a.new), out.shape

    contenders = {f"ais_jax[{v}]": (lambda r, v=v: run_jax(v, r)) for v in a.variants.split(",")}
    if not a.no_hf:
        contenders = {"hf.generate": run_hf, **contenders}
    first: dict[str, float] = {}
    for name, fn in contenders.items():
        t = time.perf_counter()
        fn(0)
        first[name] = time.perf_counter() - t
    times: dict[str, list[float]] = {k: [] for k in contenders}
    load0 = os.getloadavg()[0]
    for r in range(1, a.rounds + 1):
        for name, fn in contenders.items():
            t = time.perf_counter()
            fn(r)
            times[name].append(time.perf_counter() - t)
    load1 = os.getloadavg()[0]

    print(f"config: hidden {a.hidden}, layers {a.layers}, heads {a.heads}/{a.kv_heads}, "
          f"ffn {a.intermediate}, vocab {a.vocab}; batch {a.batch}, prompt {a.prompt}, "
          f"new {a.new}; torch threads {a.threads}; jax {jax.__version__} "
          f"{jax.default_backend()}; {a.rounds} rounds; loadavg {load0:.1f} -> {load1:.1f}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print(f"parity: max |logits(ais_jax f32) - logits(HF)| = {parity:.2e}")
    result = {"args": vars(a), "parity_max_abs": parity, "loadavg": [load0, load1],
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "contenders": {}}
    hf_t = times.get("hf.generate")
    print(f"{'contender':16s} {'first call s':>12s} {'median s':>9s} {'tokens/s':>9s} "
          f"{'best tok/s':>10s} {'x generate':>10s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        row = {"first_call_s": first[name], "median_s": med, "tokens_per_s": n_tok / med,
               "best_tokens_per_s": n_tok / min(ts), "times_s": ts}
        ratio = ""
        if hf_t is not None and name != "hf.generate":
            # Per-round ratio of adjacent runs: robust to slow drifts of machine load.
            row["x_generate"] = statistics.median(h / t for h, t in zip(hf_t, ts, strict=True))
            ratio = f"{row['x_generate']:10.2f}"
        result["contenders"][name] = row
        print(f"{name:16s} {first[name]:12.2f} {med:9.3f} {n_tok / med:9.0f} "
              f"{n_tok / min(ts):10.0f} {ratio}")
    print("first call = compile + one run for ais_jax; one (warm-up) run for generate")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
