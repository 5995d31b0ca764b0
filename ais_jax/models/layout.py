"""`ModelConfig` and the parameter table: one `ArrayInfo` row per parameter of the model.

Everything the library knows about a parameter is declared here once: its shape
(a function of the `ModelConfig`; per-layer params stacked on a leading ``L``
axis, weights ``[out, in]`` as in Hugging Face checkpoints), its logical axes
(mapped to mesh axes by `ais_jax.training.sharding`), its Hugging Face and GGUF tensor
names (`ais_jax.models.pretrained`), its initializer (`ais_jax.models.model.init_params`),
whether the FP8 rollout copy quantizes it (`ais_jax.models.fp8.to_rollout_params`),
and which config flag includes it.

Dimension symbols (see `DIMS`): ``V`` vocab, ``D`` hidden, ``F`` ffn, ``L``
layers, ``H`` head dim, ``QH`` = heads * H, ``KH`` = kv heads * H::

    embed        [V, D]                       lm_head [V, D]   (not tie_embeddings)
    final_norm   [D]
    layers/
      wq [L, QH, D]  wk [L, KH, D]  wv [L, KH, D]  wo [L, D, QH]
      w_gate [L, F, D]  w_up [L, F, D]  w_down [L, D, F]
      attn_norm [L, D]  mlp_norm [L, D]
      bq [L, QH]  bk [L, KH]  bv [L, KH]           (qkv_bias, Qwen2)
      bo [L, D]                                     (o_bias)
      b_gate [L, F]  b_up [L, F]  b_down [L, D]     (mlp_bias, Llama)
      q_norm [L, H]  k_norm [L, H]                  (qk_norm, Qwen3)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

ARCHITECTURES = ("llama", "qwen2", "qwen3")


ATTENTION_IMPLEMENTATIONS = ("auto", "reference", "chunked", "cudnn", "pallas")


def check_attention(attention: str, chunk: int) -> None:
    """Raise ValueError unless ``attention`` names an implementation and ``chunk`` is positive."""
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attention must be one of {ATTENTION_IMPLEMENTATIONS}, got "
                         f"{attention!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise ValueError(f"attention_chunk must be a positive int, got {chunk!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Static, hashable decoder config (pass as a static argument to `jax.jit`)."""

    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F
    num_layers: int  # L
    num_heads: int  # Q
    num_kv_heads: int  # K (== Q for MHA)
    head_dim: int  # H (may differ from D // Q)
    arch: str = "llama"  # llama | qwen2 | qwen3 (documentation; flags below decide)
    rope_theta: float = 10000.0
    # Llama-3 rope scaling as (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings); None for default / linear rope.
    rope_scaling: tuple[float, float, float, int] | None = None
    rope_linear_factor: float = 1.0  # "linear" rope scaling (inverse frequencies / factor)
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    o_bias: bool = False  # Llama / Qwen3 attention_bias=True
    mlp_bias: bool = False  # Llama mlp_bias=True
    qk_norm: bool = False  # Qwen3 per-head RMSNorm on q and k
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_id: int | None = None  # first EOS id (see eos_token_ids)
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    # attention implementation (ais_jax.models.attention): auto | reference | chunked | cudnn,
    # and the chunked implementation's keys per block
    attention: str = "auto"
    attention_chunk: int = 256

    def __post_init__(self) -> None:
        check_attention(self.attention, self.attention_chunk)
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @property
    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        table = param_table(self)
        rows = [*table.pop("layers").values(), *table.values()]
        return sum(math.prod(info.shape(self)) for info in rows)



Init = Literal["normal", "residual", "ones", "zeros"]
Fp8 = Literal["never", "always", "option"]

INIT_STD = 0.02  # std of "normal" init; "residual" uses INIT_STD / sqrt(2 L) (GPT-2 style)
HF_LAYER_PREFIX = "model.layers.{i}."
GGUF_LAYER_PREFIX = "blk.{i}."

# Dimension symbol -> its size under a config.
DIMS: dict[str, Callable[[ModelConfig], int]] = {
    "V": lambda c: c.vocab_size,
    "D": lambda c: c.hidden_size,
    "F": lambda c: c.intermediate_size,
    "L": lambda c: c.num_layers,
    "H": lambda c: c.head_dim,
    "QH": lambda c: c.num_heads * c.head_dim,
    "KH": lambda c: c.num_kv_heads * c.head_dim,
}


class ArrayInfo(NamedTuple):
    """One parameter: shape, sharding axes, checkpoint names, init, FP8 role, presence.

    Attributes:
      dims: dimension symbols of the shape (keys of `DIMS`), e.g. ``("L", "QH", "D")``.
      axes: logical axis per dimension (``vocab``, ``embed``, ``heads``,
        ``kv_heads``, ``mlp``, ``layers`` or None for replicated).
      hf: Hugging Face name: full for top-level params, the suffix under
        ``model.layers.{i}.`` for per-layer params.
      gguf: GGUF name: full, or the suffix under ``blk.{i}.``.
      init: ``"normal"`` (std `INIT_STD`), ``"residual"`` (std
        ``INIT_STD / sqrt(2 L)``), ``"ones"`` or ``"zeros"``.
      fp8: whether the FP8 rollout copy quantizes it: ``"always"`` (decoder-block
        linears), ``"option"`` (the output head, with ``quantize_lm_head``) or ``"never"``.
      when: the `ModelConfig` bool flag that includes it (``"not <flag>"``
        negates); None: always present.
    """

    dims: tuple[str, ...]
    axes: tuple[str | None, ...]
    hf: str
    gguf: str
    init: Init
    fp8: Fp8 = "never"
    when: str | None = None

    def shape(self, cfg: ModelConfig) -> tuple[int, ...]:
        """The concrete shape under ``cfg`` (``[L, ...]`` for per-layer params)."""
        return tuple(DIMS[d](cfg) for d in self.dims)

    def present(self, cfg: ModelConfig) -> bool:
        """Whether a model with config ``cfg`` has this parameter."""
        if self.when is None:
            return True
        flag = self.when.removeprefix("not ")
        return bool(getattr(cfg, flag)) != self.when.startswith("not ")

    def std(self, cfg: ModelConfig) -> float:
        """Init std of a ``"normal"`` / ``"residual"`` param (0 for ones / zeros)."""
        if self.init == "normal":
            return INIT_STD
        if self.init == "residual":
            return INIT_STD / math.sqrt(2 * cfg.num_layers)
        return 0.0


def _w(dims, axes, hf, gguf, init: Init = "normal") -> ArrayInfo:  # a block linear
    return ArrayInfo(dims, axes, hf, gguf, init, fp8="always")


# Per-layer params (stacked [L, ...]). Random inits draw PRNG keys in table
# order, per-layer params first, then the top-level ones (see init_params).
LAYER_PARAMS: dict[str, ArrayInfo] = {
    "wq": _w(("L", "QH", "D"), ("layers", "heads", "embed"),
             "self_attn.q_proj.weight", "attn_q.weight"),
    "wk": _w(("L", "KH", "D"), ("layers", "kv_heads", "embed"),
             "self_attn.k_proj.weight", "attn_k.weight"),
    "wv": _w(("L", "KH", "D"), ("layers", "kv_heads", "embed"),
             "self_attn.v_proj.weight", "attn_v.weight"),
    "wo": _w(("L", "D", "QH"), ("layers", "embed", "heads"),
             "self_attn.o_proj.weight", "attn_output.weight", "residual"),
    "w_gate": _w(("L", "F", "D"), ("layers", "mlp", "embed"),
                 "mlp.gate_proj.weight", "ffn_gate.weight"),
    "w_up": _w(("L", "F", "D"), ("layers", "mlp", "embed"), "mlp.up_proj.weight", "ffn_up.weight"),
    "w_down": _w(("L", "D", "F"), ("layers", "embed", "mlp"),
                 "mlp.down_proj.weight", "ffn_down.weight", "residual"),
    "attn_norm": ArrayInfo(("L", "D"), ("layers", None), "input_layernorm.weight",
                           "attn_norm.weight", "ones"),
    "mlp_norm": ArrayInfo(("L", "D"), ("layers", None), "post_attention_layernorm.weight",
                          "ffn_norm.weight", "ones"),
    "bq": ArrayInfo(("L", "QH"), ("layers", "heads"), "self_attn.q_proj.bias", "attn_q.bias",
                    "zeros", when="qkv_bias"),
    "bk": ArrayInfo(("L", "KH"), ("layers", "kv_heads"), "self_attn.k_proj.bias", "attn_k.bias",
                    "zeros", when="qkv_bias"),
    "bv": ArrayInfo(("L", "KH"), ("layers", "kv_heads"), "self_attn.v_proj.bias", "attn_v.bias",
                    "zeros", when="qkv_bias"),
    "bo": ArrayInfo(("L", "D"), ("layers", None), "self_attn.o_proj.bias", "attn_output.bias",
                    "zeros", when="o_bias"),
    "b_gate": ArrayInfo(("L", "F"), ("layers", "mlp"), "mlp.gate_proj.bias", "ffn_gate.bias",
                        "zeros", when="mlp_bias"),
    "b_up": ArrayInfo(("L", "F"), ("layers", "mlp"), "mlp.up_proj.bias", "ffn_up.bias",
                      "zeros", when="mlp_bias"),
    "b_down": ArrayInfo(("L", "D"), ("layers", None), "mlp.down_proj.bias", "ffn_down.bias",
                        "zeros", when="mlp_bias"),
    "q_norm": ArrayInfo(("L", "H"), ("layers", None), "self_attn.q_norm.weight",
                        "attn_q_norm.weight", "ones", when="qk_norm"),
    "k_norm": ArrayInfo(("L", "H"), ("layers", None), "self_attn.k_norm.weight",
                        "attn_k_norm.weight", "ones", when="qk_norm"),
}

# Top-level params (full names).
TOP_PARAMS: dict[str, ArrayInfo] = {
    "embed": ArrayInfo(("V", "D"), ("vocab", "embed"), "model.embed_tokens.weight",
                       "token_embd.weight", "normal"),
    "final_norm": ArrayInfo(("D",), (None,), "model.norm.weight", "output_norm.weight", "ones"),
    "lm_head": ArrayInfo(("V", "D"), ("head_vocab", "head_embed"), "lm_head.weight",
                         "output.weight",
                         "normal", fp8="option", when="not tie_embeddings"),
}

# The rollout copy's fused layout (`ais_jax.models.fused`, ``rollout.fused_linears``): per-layer
# linears that read the same input, concatenated on their output axis into one weight (and
# their biases into one bias): 4 GEMMs per layer instead of 7 in the program (XLA's GPU
# compiler merges the unfused ones the same way: docs/performance.md).  The
# trainer keeps the table's layout.  Fused name -> its parts, in concatenation order.
ROLLOUT_FUSED: dict[str, tuple[str, ...]] = {
    "wqkv": ("wq", "wk", "wv"),
    "w_gate_up": ("w_gate", "w_up"),
    "bqkv": ("bq", "bk", "bv"),
    "b_gate_up": ("b_gate", "b_up"),
}
# The fused output axis mixes heads, kv heads (or two ffn halves): no sharding rule maps it,
# so a fused leaf is replicated over ``tensor`` (the fused layout is refused with mesh.tensor > 1).
_FUSED_AXES: dict[str, tuple[str | None, ...]] = {
    "wqkv": ("layers", "fused", "embed"),
    "w_gate_up": ("layers", "fused", "embed"),
    "bqkv": ("layers", "fused"),
    "b_gate_up": ("layers", "fused"),
}

# The device mesh's axis names (`ais_jax.training.sharding.make_mesh`), and those a batch's
# rows are sharded over: here so that the models layer (the TPU attention kernel's shard_map)
# names them without importing the training layer.
MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Param name -> logical axes (no config needed; what sharding looks leaves up by).
LOGICAL_AXES: dict[str, tuple[str | None, ...]] = {
    **{name: info.axes for name, info in (TOP_PARAMS | LAYER_PARAMS).items()},
    **_FUSED_AXES,
}


def param_table(cfg: ModelConfig) -> dict[str, Any]:
    """The rows of the params ``cfg`` has, in the params tree's structure.

    Args:
      cfg: model config.

    Returns:
      ``{"embed": ArrayInfo, "layers": {"wq": ArrayInfo, ...}, "final_norm":
      ..., ["lm_head": ...]}`` with exactly the leaves of
      `ais_jax.models.model.init_params(key, cfg)` (per-layer rows in `LAYER_PARAMS`
      order, the order init draws keys in).
    """
    top = {k: v for k, v in TOP_PARAMS.items() if v.present(cfg)}
    layers = {k: v for k, v in LAYER_PARAMS.items() if v.present(cfg)}
    return {"embed": top.pop("embed"), "layers": layers, **top}


def names_where(fp8: Fp8) -> tuple[str, ...]:
    """Names of all params (top-level and per-layer) with the given FP8 role, in table order."""
    return tuple(k for k, v in (LAYER_PARAMS | TOP_PARAMS).items() if v.fp8 == fp8)


def hf_name(name: str, layer: int | None = None) -> str:
    """HF tensor name of top-level param ``name``, or of layer ``layer`` of a per-layer one."""
    if layer is None:
        return TOP_PARAMS[name].hf
    return HF_LAYER_PREFIX.format(i=layer) + LAYER_PARAMS[name].hf


def gguf_name(name: str, layer: int | None = None) -> str:
    """GGUF tensor name of top-level param ``name``, or of layer ``layer`` of a per-layer one."""
    if layer is None:
        return TOP_PARAMS[name].gguf
    return GGUF_LAYER_PREFIX.format(i=layer) + LAYER_PARAMS[name].gguf
