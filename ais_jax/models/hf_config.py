"""Hugging Face ``config.json`` / GGUF metadata <-> `ais_jax.models.model.ModelConfig`
translation."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ais_jax.core.errors import CheckpointError
from ais_jax.core.safe_yaml import clip as _clip
from ais_jax.models import layout
from ais_jax.models.model import ModelConfig

_HF_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_ARCH_CLASS = {v: k for k, v in _HF_ARCHS.items()}
# Defaults of the transformers config classes for fields a config.json may omit.
_FAMILY_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
    "qwen2": {"max_position_embeddings": 32768, "num_key_value_heads": 32},
    "qwen3": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": 128},
}
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def _eos_ids(value: Any, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list | tuple) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(f"{where} eos_token_id must be an int or a list of ints, "
                              f"got {_clip(value)}")
    return tuple(dict.fromkeys(values))


def _rope_fields(config: dict, max_pos: int) -> dict:
    """``rope_theta`` / ``rope_scaling`` / ``rope_linear_factor`` from a v4 or v5 HF config."""
    # As transformers 5 does: a legacy rope_scaling wins, then its or rope_parameters' own theta.
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise CheckpointError(f"config.json rope_parameters must be a dict, got {rope!r}")
    if rope and all(isinstance(v, dict) for v in rope.values()):  # nested per layer type (v5)
        kinds = {json.dumps(v, sort_keys=True) for v in rope.values()}
        if len(kinds) != 1:
            raise CheckpointError(f"per-layer rope_parameters {sorted(rope)} differ; only one rope "
                                  "setting for all layers is supported")
        rope = next(iter(rope.values()))
    theta = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    kind = rope.get("rope_type", rope.get("type", "default"))
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    if partial not in (None, 1.0):
        raise CheckpointError(f"partial_rotary_factor={partial} is not supported; only full-width "
                              "rotary embeddings (1.0) are")
    out: dict[str, Any] = {"rope_theta": theta}
    try:
        if kind == "linear":
            out["rope_linear_factor"] = float(rope["factor"])
        elif kind == "llama3":
            out["rope_scaling"] = (
                float(rope["factor"]), float(rope["low_freq_factor"]),
                float(rope["high_freq_factor"]),
                int(rope.get("original_max_position_embeddings", max_pos)),
            )
        elif kind != "default":
            raise CheckpointError(f"rope_type {kind!r} is not supported; use a checkpoint with "
                                  "default, 'linear' or 'llama3' rope scaling")
    except KeyError as e:
        raise CheckpointError(f"config.json rope_type {kind!r} lacks the field {e.args[0]!r}; "
                              "add it to rope_parameters") from None
    return out


def model_config_from_hf(config: dict) -> ModelConfig:
    """A `ModelConfig` from a Hugging Face ``config.json`` dict (transformers 4 or 5 format).

    Reads Llama, Qwen2 and Qwen3 configs: ``rope_theta`` / ``rope_scaling`` (v4)
    or ``rope_parameters`` (v5) with default, ``linear`` or ``llama3`` rope,
    explicit or derived ``head_dim``, GQA / MHA, tied embeddings, Qwen2 q/k/v
    biases, Llama / Qwen3 ``attention_bias`` (q, k, v and o), Llama
    ``mlp_bias``, Qwen3 per-head q/k RMSNorm, and bos / eos (int or list) / pad
    ids.  Fields a config omits take the transformers class defaults.

    Args:
      config: the parsed ``config.json``.

    Returns:
      The matching static model config.

    Raises:
      CheckpointError: (a ``ValueError``) for another architecture, MoE, sliding
        window attention in use, other rope types, a non-SiLU MLP, or a missing
        or mistyped field.
    """
    if not isinstance(config, dict):
        raise CheckpointError(f"config.json must hold a JSON object, got {type(config).__name__}")
    archs = config.get("architectures") or []
    arch = config.get("model_type") or next((_HF_ARCHS[a] for a in archs if a in _HF_ARCHS), None)
    if arch not in _FAMILY_DEFAULTS:
        raise CheckpointError(f"unsupported architecture model_type={config.get('model_type')!r} "
                              f"architectures={archs!r}; supported: llama, qwen2, qwen3")
    moe = [k for k in _MOE_KEYS if config.get(k)]
    if moe:
        raise CheckpointError(f"mixture-of-experts configs ({', '.join(moe)}) are not supported; "
                              "use a dense llama / qwen2 / qwen3 checkpoint")
    layer_types = set(config.get("layer_types") or ["full_attention"])
    if config.get("use_sliding_window") or layer_types != {"full_attention"}:
        raise CheckpointError(
            f"sliding-window attention (use_sliding_window={config.get('use_sliding_window')}, "
            f"layer_types={sorted(layer_types)}) is not supported; use full attention")
    if config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"hidden_act={config['hidden_act']!r} is not supported; "
                              "only 'silu' is")
    c = {**_FAMILY_DEFAULTS[arch], **config}  # keys absent from config.json take class defaults

    def need(name: str) -> int:  # every int field read this way is a size: >= 1
        v = c.get(name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise CheckpointError(f"config.json field {name!r} must be a positive int, got "
                                  f"{_clip(v)}")
        return v

    heads = need("num_attention_heads")
    if c.get("num_key_value_heads") is None:  # explicit null or absent (llama): MHA
        c["num_key_value_heads"] = heads
    if c.get("head_dim") is None:
        c["head_dim"] = need("hidden_size") // heads
    attention_bias = bool(c.get("attention_bias"))
    eos = _eos_ids(c.get("eos_token_id"), "config.json")
    max_pos = need("max_position_embeddings")
    try:
        return ModelConfig(
            vocab_size=need("vocab_size"), hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"), num_layers=need("num_hidden_layers"),
            num_heads=heads, num_kv_heads=need("num_key_value_heads"), head_dim=need("head_dim"),
            arch=arch, rms_norm_eps=float(c.get("rms_norm_eps") or 1e-6),
            tie_embeddings=bool(c.get("tie_word_embeddings")),
            qkv_bias=arch == "qwen2" or attention_bias,
            o_bias=arch != "qwen2" and attention_bias,
            mlp_bias=arch == "llama" and bool(c.get("mlp_bias")),
            qk_norm=arch == "qwen3", max_position_embeddings=max_pos,
            bos_token_id=c.get("bos_token_id"), eos_token_id=eos[0] if eos else None,
            eos_token_ids=eos, pad_token_id=c.get("pad_token_id"),
            **_rope_fields(config, max_pos),
        )
    except (ValueError, TypeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"config.json is inconsistent: {_clip(str(e), 200)}") from None


def hf_config_from_model_config(cfg: ModelConfig, dtype: str = "bfloat16") -> dict:
    """The ``config.json`` dict transformers (4 and 5) needs to load `cfg`'s checkpoint.

    Args:
      cfg: the model config to describe.
      dtype: the checkpoint's tensor dtype, written as ``dtype`` and ``torch_dtype``.

    Returns:
      A JSON-serializable ``config.json`` dict that `model_config_from_hf` maps back to ``cfg``.

    Raises:
      CheckpointError: if the flag combination has no transformers equivalent
        (e.g. Llama with q/k/v biases but no o bias).
    """
    arch = cfg.arch
    ok = {
        "llama": cfg.qkv_bias == cfg.o_bias and not cfg.qk_norm,
        "qwen2": cfg.qkv_bias and not cfg.o_bias and not cfg.qk_norm and not cfg.mlp_bias,
        "qwen3": cfg.qkv_bias == cfg.o_bias and cfg.qk_norm and not cfg.mlp_bias,
    }
    if not ok.get(arch, False):
        raise CheckpointError(
            f"ModelConfig(arch={arch!r}, qkv_bias={cfg.qkv_bias}, o_bias={cfg.o_bias}, qk_norm="
            f"{cfg.qk_norm}, mlp_bias={cfg.mlp_bias}) has no transformers equivalent; set arch "
            "and flags as model_config_from_hf does")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        f, lo, hi, orig = cfg.rope_scaling
        rope |= {"rope_type": "llama3", "factor": f, "low_freq_factor": lo,
                 "high_freq_factor": hi, "original_max_position_embeddings": orig}
    elif cfg.rope_linear_factor != 1.0:
        rope |= {"rope_type": "linear", "factor": cfg.rope_linear_factor}
    eos = list(cfg.eos_token_ids) or ([cfg.eos_token_id] if cfg.eos_token_id is not None else [])
    out = {
        "architectures": [_ARCH_CLASS[arch]], "model_type": arch,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        # transformers 5 reads rope_parameters; 4 reads rope_theta / rope_scaling.
        "rope_parameters": rope, "rope_theta": cfg.rope_theta,
        "rope_scaling": None if rope["rope_type"] == "default" else dict(rope),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": cfg.pad_token_id, "dtype": dtype, "torch_dtype": dtype,
    }
    if arch != "qwen2":
        out["attention_bias"] = cfg.qkv_bias
    if arch == "llama":
        out["mlp_bias"] = cfg.mlp_bias
    else:
        out["use_sliding_window"] = False
    return out


def merge_generation_eos(cfg: ModelConfig, generation_config: Any, where: str) -> ModelConfig:
    """`cfg` with the EOS ids of a ``generation_config.json`` appended to ``eos_token_ids``.

    Args:
      cfg: the config read from ``config.json``.
      generation_config: the parsed ``generation_config.json`` (a non-dict adds nothing).
      where: the file's path, named in errors.

    Returns:
      ``cfg`` with the union of both EOS id lists (config.json's first) and
      ``eos_token_id`` set to the first of them.

    Raises:
      CheckpointError: if its ``eos_token_id`` is neither an int nor a list of ints.
    """
    gen = generation_config
    extra = _eos_ids(gen.get("eos_token_id") if isinstance(gen, dict) else None, where)
    eos = tuple(dict.fromkeys(cfg.eos_token_ids + extra))
    return dataclasses.replace(cfg, eos_token_ids=eos, eos_token_id=eos[0] if eos else None)


def model_config_from_gguf(
    metadata: Callable[[str], Any],
    tensor_shapes: Mapping[str, Sequence[int]],
    path: str,
) -> ModelConfig:
    """A `ModelConfig` from a GGUF file's metadata and tensor names (llama, qwen2, qwen3).

    Biases, Qwen3 q/k norms and tied embeddings are inferred from which
    tensors are present; linear rope scaling is read, other rope scalings are not.

    Args:
      metadata: the decoded value of a GGUF metadata key, or None if the key is absent.
      tensor_shapes: each tensor's GGUF dims (innermost first) by tensor name.
      path: the GGUF file, named in errors.

    Returns:
      The matching static model config.

    Raises:
      CheckpointError: for another architecture, MoE, per-frequency rope factors,
        per-layer kv heads, partial rotary, unsupported rope scaling, or missing or
        invalid hyperparameters.
    """

    def field(key: str, default: Any = None) -> Any:
        v = metadata(key)
        return default if v is None else v

    def need(key: str) -> int:  # every int key read this way is a size: >= 1
        v = field(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise CheckpointError(f"{path} lacks the integer GGUF key {key!r} (a size >= 1, got "
                                  f"{_clip(v)}); re-convert it with llama.cpp's "
                                  "convert_hf_to_gguf.py")
        return v

    arch = field("general.architecture")
    if arch not in _FAMILY_DEFAULTS:
        raise CheckpointError(f"unsupported GGUF architecture {arch!r} in {path}; supported: "
                              "llama, qwen2, qwen3")
    if field(f"{arch}.expert_count", 0):
        raise CheckpointError(f"{path} is a mixture-of-experts model; use a dense checkpoint")
    if "rope_freqs.weight" in tensor_shapes:
        raise CheckpointError(f"{path} uses per-frequency rope factors (rope_freqs, Llama-3.1 "
                              "rope scaling) that are not supported; load the HF safetensors")
    D, heads = need(f"{arch}.embedding_length"), need(f"{arch}.attention.head_count")
    kv = field(f"{arch}.attention.head_count_kv", heads)
    head_dim = int(field(f"{arch}.attention.key_length", D // heads))
    rot = int(field(f"{arch}.rope.dimension_count", head_dim))
    scaling = field(f"{arch}.rope.scaling.type", "none")
    if isinstance(kv, list) or rot != head_dim or scaling not in ("none", "linear"):
        raise CheckpointError(f"{path} uses per-layer kv heads, partial rotary ({rot} of "
                              f"{head_dim}) or rope scaling {scaling!r}, which are not supported; "
                              "load the HF safetensors")
    eos = _eos_ids(field("tokenizer.ggml.eos_token_id"), path)
    eos += tuple(i for i in _eos_ids(field("tokenizer.ggml.eot_token_id"), path) if i not in eos)
    has = lambda key: layout.gguf_name(key, 0) in tensor_shapes  # noqa: E731
    try:
        return ModelConfig(
            vocab_size=int(tensor_shapes[layout.gguf_name("embed")][-1]), hidden_size=D,
            intermediate_size=need(f"{arch}.feed_forward_length"),
            num_layers=need(f"{arch}.block_count"), num_heads=heads, num_kv_heads=int(kv),
            head_dim=head_dim, arch=arch, rope_theta=float(field(f"{arch}.rope.freq_base", 1e4)),
            rope_linear_factor=float(field(f"{arch}.rope.scaling.factor", 1.0))
            if scaling == "linear" else 1.0,
            rms_norm_eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
            tie_embeddings=layout.gguf_name("lm_head") not in tensor_shapes, qkv_bias=has("bq"),
            o_bias=has("bo"), mlp_bias=has("b_gate"),
            qk_norm=has("q_norm"),
            max_position_embeddings=int(field(f"{arch}.context_length", 4096)),
            bos_token_id=field("tokenizer.ggml.bos_token_id"), eos_token_id=eos[0] if eos else None,
            eos_token_ids=eos, pad_token_id=field("tokenizer.ggml.padding_token_id"),
        )
    except CheckpointError:
        raise
    except (TypeError, KeyError, ValueError, ZeroDivisionError) as e:
        raise CheckpointError(f"{path} lacks or has invalid {arch}.* hyperparameters "
                              f"({_clip(str(e), 200)}); "
                              "re-convert it with llama.cpp's convert_hf_to_gguf.py") from None


def _qwen3_preset(hidden: int, ffn: int, layers: int, heads: int, tied: bool) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": tied,
        "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": layers, "bos_token_id": 151643, "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    }


# HF ``config.json`` dicts of public checkpoints, by the checkpoint's directory name: enough
# for `model_config_from_hf` to describe the model without its files (``python -m
# ais_jax.run.plan`` sizes a run with them).  The values are the published hyperparameters.
HF_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": _qwen3_preset(1024, 3072, 28, 16, tied=True),
    "Qwen3-1.7B": _qwen3_preset(2048, 6144, 28, 16, tied=True),
    "Qwen3-8B": _qwen3_preset(4096, 12288, 36, 32, tied=False),
    "SmolLM2-135M": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "rope_scaling": None, "tie_word_embeddings": True,
        "attention_bias": False, "mlp_bias": False, "bos_token_id": 0, "eos_token_id": 0,
        "torch_dtype": "bfloat16",
    },
}
