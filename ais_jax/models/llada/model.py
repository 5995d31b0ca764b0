"""LLaDA masked-diffusion transformer as pure functions of a params pytree.

The block is LLaDA's Llama-style block (RMSNorm, RoPE, SwiGLU MLP, no biases)
with *bidirectional* attention: the only attention mask is a padding mask.
Masked positions hold the mask token (``mask_token_id``, 126336 for
LLaDA-8B) and the model predicts the clean token at every position.

Params use the leaf names of `ais_jax.models.model` (``embed``, ``layers/wq`` ...,
``final_norm``, ``lm_head``; layers stacked on a leading ``L`` axis, weights
``[out, in]``), so `ais_jax.models.fp8.to_rollout_params` builds the FP8 rollout copy
unchanged.  `LAYER_PARAMS` / `TOP_PARAMS` are this model's parameter table:
the ``hf`` column holds the LLaDA safetensors names (see
`ais_jax.models.llada.checkpoint`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.models import fp8
from ais_jax.models.attention import attend, bidirectional_mask
from ais_jax.models.fp8 import QuantArray, linear, qdot
from ais_jax.models.layout import ArrayInfo, check_attention
from ais_jax.models.model import apply_rope, rms_norm

#: LLaDA-8B's mask token id.
LLADA_8B_MASK_TOKEN_ID = 126336
#: Per-layer names live under ``model.transformer.blocks.{i}.``.
HF_PREFIX = "model.transformer."
HF_LAYER_PREFIX = HF_PREFIX + "blocks.{i}."


@dataclasses.dataclass(frozen=True)
class LLaDAConfig:
    """Static, hashable LLaDA config (attribute names as `ais_jax.models.model.ModelConfig`).

    ``vocab_size`` is the number of embedding / output rows (LLaDA's
    ``embedding_size`` when set, else its ``vocab_size``); ``text_vocab_size``
    is the config's ``vocab_size`` (``<= vocab_size``).
    """

    vocab_size: int  # V: rows of wte / ff_out
    hidden_size: int  # D (d_model)
    intermediate_size: int  # F (mlp_hidden_size; not split: ff_proj and up_proj are [F, D])
    num_layers: int  # L
    num_heads: int  # Q
    num_kv_heads: int  # K
    mask_token_id: int = LLADA_8B_MASK_TOKEN_ID
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False  # LLaDA's weight_tying
    text_vocab_size: int | None = None  # config vocab_size when embedding_size pads it
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    max_sequence_length: int = 4096  # prompt + response positions the model was trained on
    # attention implementation (ais_jax.models.attention) and the chunked one's keys per block
    attention: str = "auto"
    attention_chunk: int = 256

    def __post_init__(self) -> None:
        check_attention(self.attention, self.attention_chunk)
        if self.text_vocab_size is None:
            object.__setattr__(self, "text_vocab_size", self.vocab_size)
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"LLaDAConfig.{name} must be a positive int, got {v!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"d_model ({self.hidden_size}) must be a multiple of n_heads "
                             f"({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"n_heads ({self.num_heads}) must be a multiple of n_kv_heads "
                             f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head dim d_model / n_heads must be even, got {self.head_dim}")
        m = self.mask_token_id
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < self.vocab_size:
            raise ValueError(f"mask_token_id must be an int in [0, {self.vocab_size}), got {m!r}")
        if not 0 < self.text_vocab_size <= self.vocab_size:
            raise ValueError(f"vocab_size ({self.text_vocab_size}) must be in [1, embedding_size "
                             f"({self.vocab_size})]")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive, got "
                             f"{self.rms_norm_eps!r}, {self.rope_theta!r}")

    @property
    def max_position_embeddings(self) -> int:
        """``max_sequence_length`` under `ais_jax.models.model.ModelConfig`'s name."""
        return self.max_sequence_length

    @property
    def head_dim(self) -> int:
        """H = d_model / n_heads (LLaDA has no separate head_dim)."""
        return self.hidden_size // self.num_heads


def _w(dims, axes, hf, init="normal") -> ArrayInfo:  # a block linear, quantized for rollouts
    return ArrayInfo(dims, axes, hf, "", init, fp8="always")


# Per-layer params (stacked [L, ...]); hf = suffix under model.transformer.blocks.{i}.
LAYER_PARAMS: dict[str, ArrayInfo] = {
    "wq": _w(("L", "QH", "D"), ("layers", "heads", "embed"), "q_proj.weight"),
    "wk": _w(("L", "KH", "D"), ("layers", "kv_heads", "embed"), "k_proj.weight"),
    "wv": _w(("L", "KH", "D"), ("layers", "kv_heads", "embed"), "v_proj.weight"),
    "wo": _w(("L", "D", "QH"), ("layers", "embed", "heads"), "attn_out.weight", "residual"),
    "w_gate": _w(("L", "F", "D"), ("layers", "mlp", "embed"), "ff_proj.weight"),  # SiLU side
    "w_up": _w(("L", "F", "D"), ("layers", "mlp", "embed"), "up_proj.weight"),
    "w_down": _w(("L", "D", "F"), ("layers", "embed", "mlp"), "ff_out.weight", "residual"),
    "attn_norm": ArrayInfo(("L", "D"), ("layers", None), "attn_norm.weight", "", "ones"),
    "mlp_norm": ArrayInfo(("L", "D"), ("layers", None), "ff_norm.weight", "", "ones"),
}

# Top-level params; hf = full name.
TOP_PARAMS: dict[str, ArrayInfo] = {
    "embed": ArrayInfo(("V", "D"), ("vocab", "embed"), HF_PREFIX + "wte.weight", "", "normal"),
    "final_norm": ArrayInfo(("D",), (None,), HF_PREFIX + "ln_f.weight", "", "ones"),
    "lm_head": ArrayInfo(("V", "D"), ("head_vocab", "head_embed"), HF_PREFIX + "ff_out.weight",
                         "", "normal", fp8="option", when="not tie_embeddings"),
}


def param_table(cfg: LLaDAConfig) -> dict[str, Any]:
    """The table rows ``cfg`` has, in the params tree's structure.

    Args:
      cfg: model config.

    Returns:
      ``{"embed": ArrayInfo, "layers": {"wq": ..., ...}, "final_norm": ...,
      ["lm_head": ...]}`` (``lm_head`` absent under weight tying).
    """
    top = {k: v for k, v in TOP_PARAMS.items() if v.present(cfg)}  # type: ignore[arg-type]
    return {"embed": top.pop("embed"), "layers": dict(LAYER_PARAMS), **top}


def hf_name(name: str, layer: int | None = None) -> str:
    """LLaDA safetensors name of top-level ``name``, or of layer ``layer`` of a per-layer one."""
    if layer is None:
        return TOP_PARAMS[name].hf
    return HF_LAYER_PREFIX.format(i=layer) + LAYER_PARAMS[name].hf


def init_params(key: jax.Array, cfg: LLaDAConfig, dtype: Any = jnp.float32) -> dict:
    """Random params (normal 0.02, residual linears 0.02 / sqrt(2 L), norms ones).

    Args:
      key: PRNG key.
      cfg: model config.
      dtype: parameter dtype.

    Returns:
      Params pytree: ``embed`` ``[V, D]``, ``layers/wq`` ``[L, Q*H, D]``, ...,
      ``final_norm`` ``[D]``, ``lm_head`` ``[V, D]`` (untied).
    """
    keys = iter(jax.random.split(key, 16))

    def init(info: ArrayInfo) -> jax.Array:
        shape = info.shape(cfg)  # type: ignore[arg-type]
        if info.init == "ones":
            return jnp.ones(shape, dtype)
        std = info.std(cfg)  # type: ignore[arg-type]
        # bit-identical under jit (see `ais_jax.models.model.init_params`)
        z = jax.lax.optimization_barrier(jax.random.normal(next(keys), shape, jnp.float32))
        return (std * z).astype(dtype)

    table = param_table(cfg)
    layers = {name: init(info) for name, info in table.pop("layers").items()}
    top = {name: init(info) for name, info in table.items()}
    return {"embed": top.pop("embed"), "layers": layers, **top}


def to_rollout_params(params: dict, **kwargs: Any) -> dict:
    """The FP8 rollout copy: `ais_jax.models.fp8.to_rollout_params` (same leaf names and roles).

    Args:
      params: LLaDA params from `init_params` or `ais_jax.models.llada.checkpoint.load`.
      **kwargs: passed on (``dtype``, ``quantize_lm_head``, ``weight_scaling``,
        ``act_scaling``).

    Returns:
      Params with the block linears as `ais_jax.models.fp8.QuantArray` ``[L, out, in]``.
    """
    return fp8.to_rollout_params(params, **kwargs)


def _block(x, lp, pos, mask, inv_freq, cfg: LLaDAConfig, mesh=None):
    """One LLaDA block; ``x`` ``[B, T, D]`` -> ``[B, T, D]``.  ``mesh``: the program's device
    mesh, for the TPU attention kernel on several devices (`ais_jax.models.attention.attend`)."""
    B, T, _ = x.shape
    Q, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    h = rms_norm(x, lp["attn_norm"], cfg.rms_norm_eps)
    q = apply_rope(linear(h, lp["wq"], None, mask).reshape(B, T, Q, H), pos, inv_freq)
    k = apply_rope(linear(h, lp["wk"], None, mask).reshape(B, T, K, H), pos, inv_freq)
    v = linear(h, lp["wv"], None, mask).reshape(B, T, K, H)
    o = attend(q, k, v, bidirectional_mask(mask), cfg.attention, cfg.attention_chunk, mesh)
    x = x + linear(o, lp["wo"], None, mask)
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_norm_eps)
    g = linear(h, lp["w_gate"], None, mask)  # ff_proj: the SiLU input
    u = linear(h, lp["w_up"], None, mask)  # up_proj
    return x + linear(jax.nn.silu(g) * u, lp["w_down"], None, mask)


def hidden_states(params: dict, tokens: jax.Array, cfg: LLaDAConfig,
                  mask: jax.Array | None = None, *, remat: bool = False,
                  remat_policy: Any = None,
                  constrain: Callable[[jax.Array], jax.Array] | None = None,
                  mesh: Any = None) -> jax.Array:
    """The trunk: the residual stream after the last block, before the final norm.

    Args:
      params: full-precision or FP8 rollout params.
      tokens: ``[B, T]`` int ids (mask token at masked positions).
      cfg: model config.
      mask: optional ``[B, T]`` validity (1 real, 0 padding).
      remat: rematerialize each block in the backward pass (``jax.checkpoint``
        around the scanned block).
      remat_policy: the ``jax.checkpoint`` policy with ``remat`` (None: save nothing
        but the block's input; see `ais_jax.training.logprobs.REMAT_POLICIES`).
      constrain: applied to the residual stream ``[B, T, D]`` entering each block
        and leaving the last (e.g. a batch-sharding constraint); its ``mesh``
        attribute, if any (`ais_jax.training.sharding.batch_constraint`), is the mesh the
        TPU attention kernel runs under ``jax.shard_map`` over.
      mesh: the program's device mesh for that kernel when ``constrain`` carries none
        (`forward`'s callers: the sampler, the trajectory replay); None: one device.

    Returns:
      ``[B, T, D]`` in the params' dtype.
    """
    B, T = tokens.shape
    mask = jnp.ones((B, T), jnp.bool_) if mask is None else mask.astype(jnp.bool_)
    embed = params["embed"]
    if isinstance(embed, QuantArray):
        raise ValueError("the embedding must stay full precision; quantize lm_head instead")
    x = jnp.take(embed, tokens, axis=0)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    H = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, H, 2, dtype=jnp.float32) / H))
    # A row of all padding would softmax over nothing: let every query see itself.
    attn_rows = mask | ~jnp.any(mask, axis=-1, keepdims=True)
    pin = constrain if constrain is not None else (lambda y: y)
    if mesh is None:  # for the TPU kernel's shard_map (batch_constraint's mesh)
        mesh = getattr(constrain, "mesh", None)

    def body(x, lp):
        return _block(pin(x), lp, pos, attn_rows, inv_freq, cfg, mesh), None

    if remat:
        body = jax.checkpoint(body, policy=remat_policy)
    x, _ = jax.lax.scan(body, x, params["layers"])
    return pin(x)


def forward(params: dict, tokens: jax.Array, cfg: LLaDAConfig,
            mask: jax.Array | None = None, *, mesh: Any = None) -> jax.Array:
    """Bidirectional forward: logits for every position.

    Positions are ``0..T-1`` as in LLaDA; RoPE is relative and attention never
    crosses padding, so left padding does not change the real tokens' logits.

    Args:
      params: full-precision or FP8 rollout params.
      tokens: ``[B, T]`` int ids (mask token at masked positions).
      cfg: model config.
      mask: optional ``[B, T]`` validity (1 real, 0 padding). Padding keys are
        not attended to; padding rows' logits are meaningless.
      mesh: the program's device mesh, for the TPU attention kernel on several devices
        (`ais_jax.models.attention.attend`); None: one device.

    Returns:
      Logits ``[B, T, V]`` float32.
    """
    B, T = tokens.shape
    mask = jnp.ones((B, T), jnp.bool_) if mask is None else mask.astype(jnp.bool_)
    x = hidden_states(params, tokens, cfg, mask, mesh=mesh)
    x = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    head = params.get("lm_head", params["embed"])
    if isinstance(head, QuantArray):
        return qdot(x, head, out_dtype=jnp.float32, valid=mask)
    return jax.lax.dot_general(x, head.astype(x.dtype), (((2,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32)
