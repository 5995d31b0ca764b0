"""LLaDA checkpoints (``config.json`` + safetensors) <-> `ais_jax.models.llada.model` params.

The format is the public LLaDA one: OLMo-style config keys (``d_model``,
``n_heads``, ``n_kv_heads``, ``n_layers``, ``mlp_hidden_size`` /
``mlp_ratio``, ``vocab_size`` / ``embedding_size``, ``rope_theta``,
``rms_norm_eps``, ``mask_token_id``, ``weight_tying``) and tensors named
``model.transformer.wte.weight``, ``model.transformer.blocks.{i}.q_proj.weight``
... ``model.transformer.ln_f.weight``, ``model.transformer.ff_out.weight``
(untied head).  Only safetensors are read (never pickle).  `load` checks the
files as the autoregressive loader does (`ais_jax.models.weight_files`): a
NaN / inf tensor, a truncated or unreadable file, a missing tensor and an index
naming shards outside the directory are each a one-line `CheckpointError`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)
import numpy as np

from ais_jax.core import storage
from ais_jax.core.errors import CheckpointError
from ais_jax.models import weight_files
from ais_jax.models.llada.model import LAYER_PARAMS, LLaDAConfig, hf_name, param_table
from ais_jax.models.weight_files import SafetensorsFiles, read_json, shard_files

# OLMo / LLaDA options this implementation supports, with the only accepted value.
_FIXED = {"block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms",
          "include_bias": False, "include_qkv_bias": False, "alibi": False, "rope": True,
          "scale_logits": False, "attention_layer_norm": False, "block_group_size": 1}


# The public LLaDA-8B config.json (GSAI-ML/LLaDA-8B-Instruct; the Base model has the same
# shapes), for ``python -m ais_jax.plan``: training reads the weights' own directory.
_LLADA_8B: dict[str, Any] = {
    "model_type": "llada", "d_model": 4096, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32,
    "mlp_hidden_size": 12288, "vocab_size": 126464, "embedding_size": 126464,
    "mask_token_id": 126336, "eos_token_id": 126081, "pad_token_id": 126081,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "weight_tying": False,
    "max_sequence_length": 4096, "block_type": "llama", "activation_type": "silu",
    "layer_norm_type": "rms", "include_bias": False, "include_qkv_bias": False,
}
#: LLaDA ``config.json`` dicts by model name (`config_from_dict` parses them).
LLADA_PRESETS: dict[str, dict[str, Any]] = {
    "LLaDA-8B-Instruct": _LLADA_8B, "LLaDA-8B-Base": _LLADA_8B,
}


def _int(d: dict, key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"LLaDA config: {key!r} must be an int, got {v!r}")
    return v


def config_from_dict(d: dict) -> LLaDAConfig:
    """Parse a LLaDA ``config.json`` dict.

    Args:
      d: the decoded JSON.

    Returns:
      The config (``vocab_size`` = ``embedding_size`` or ``vocab_size``).

    Raises:
      ValueError: a missing / ill-typed key, an unsupported option (biases,
        non-SiLU MLP, ALiBi, logit scaling ...) or an out-of-range
        ``mask_token_id`` (one line).
    """
    if not isinstance(d, dict):
        raise ValueError(f"LLaDA config must be a JSON object, got {type(d).__name__}")
    for key, want in _FIXED.items():
        if key in d and d[key] is not None and d[key] != want:
            raise ValueError(f"LLaDA config: {key}={d[key]!r} is not supported (need {want!r})")
    D, text_v = _int(d, "d_model"), _int(d, "vocab_size")
    emb = d.get("embedding_size")
    V = text_v if emb is None else _int(d, "embedding_size")
    if text_v > V:
        raise ValueError(f"LLaDA config: embedding_size {V} < vocab_size {text_v}")
    if d.get("mlp_hidden_size") is not None:
        F = _int(d, "mlp_hidden_size")
    else:
        F = _int(d, "mlp_ratio") * D
    heads = _int(d, "n_heads")
    kv = d.get("n_kv_heads")
    kv = heads if kv is None else _int(d, "n_kv_heads")
    if "mask_token_id" not in d:
        raise ValueError("LLaDA config: missing 'mask_token_id' (126336 for LLaDA-8B)")
    cfg_kwargs: dict[str, Any] = {}
    for key in ("eos_token_id", "pad_token_id", "max_sequence_length"):
        if isinstance(d.get(key), int) and not isinstance(d.get(key), bool):
            cfg_kwargs[key] = d[key]
    try:
        return LLaDAConfig(
            vocab_size=V, hidden_size=D, intermediate_size=F, num_layers=_int(d, "n_layers"),
            num_heads=heads, num_kv_heads=kv, mask_token_id=_int(d, "mask_token_id"),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            tie_embeddings=bool(d.get("weight_tying", False)),
            text_vocab_size=text_v, **cfg_kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"LLaDA config: {e}") from None


def config_to_dict(cfg: LLaDAConfig) -> dict:
    """The LLaDA ``config.json`` dict of ``cfg`` (inverse of `config_from_dict`)."""
    text_v = cfg.text_vocab_size
    d: dict[str, Any] = {
        "architectures": ["LLaDAModelLM"], "model_type": "llada", **_FIXED,
        "d_model": cfg.hidden_size, "n_heads": cfg.num_heads, "n_kv_heads": cfg.num_kv_heads,
        "n_layers": cfg.num_layers, "mlp_hidden_size": cfg.intermediate_size,
        "vocab_size": text_v, "embedding_size": cfg.vocab_size,
        "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps,
        "mask_token_id": cfg.mask_token_id, "weight_tying": cfg.tie_embeddings,
        "max_sequence_length": cfg.max_sequence_length,
    }
    for key in ("eos_token_id", "pad_token_id"):
        if getattr(cfg, key) is not None:
            d[key] = getattr(cfg, key)
    return d


def is_llada_dir(path: str) -> bool:
    """Whether ``path`` is a directory (or bucket prefix) whose ``config.json`` is a LLaDA
    (OLMo-style) config.

    Raises:
      StorageError: a bucket refused the read (permission, credentials, no endpoint).
    """
    try:
        d = json.loads(storage.read_text(storage.join(path, "config.json")))
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and (d.get("model_type") == "llada" or "d_model" in d)


def _tensor_files(path: str) -> dict[str, str] | None:
    """Tensor name -> safetensors file from the directory's index (shards checked), or None
    when it has no index (then every ``*.safetensors`` file is read, and there must be one)."""
    index = storage.join(path, "model.safetensors.index.json")
    if weight_files.isfile(index):
        data = read_json(index)
        return shard_files(path, index, data.get("weight_map") if isinstance(data, dict) else None)
    if not weight_files.safetensors_in(path):
        raise CheckpointError(f"no *.safetensors file in {path}; a LLaDA checkpoint directory "
                              "needs model.safetensors (pickled .bin checkpoints are not read)")
    return None


def load(path: str, dtype: Any = jnp.float32, *, check_finite: bool = True,
         shardings: Callable[[LLaDAConfig], Any] | None = None) -> tuple[dict, LLaDAConfig]:
    """Load a LLaDA checkpoint directory (or ``gs://`` prefix: read in ranges, as
    `ais_jax.models.pretrained.load_pretrained` reads a bucket).

    The files get the checks of the autoregressive loader
    (`ais_jax.models.pretrained.load_pretrained`, through `ais_jax.models.weight_files`).

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or
        shards with ``model.safetensors.index.json``).
      dtype: parameter dtype.
      check_finite: refuse a tensor holding NaN or inf after the cast to
        ``dtype``; False skips the check.
      shardings: ``cfg ->`` a params-shaped tree of shardings: each leaf is built straight
        into its shards from slices read lazily (`ais_jax.models.weight_files.build_leaf`);
        None: whole leaves on the default device.

    Returns:
      ``(params, cfg)``; params as `ais_jax.models.llada.model.init_params` lays them out.

    Raises:
      ValueError: a bad config (`config_from_dict`).
      CheckpointError: a missing or non-JSON ``config.json`` / index, an index
        naming shards outside ``path``, a missing, truncated or unreadable
        safetensors file, a tensor missing or of the wrong shape, or non-finite
        weights (one line each; a `ValueError` subclass).
    """
    cfg = config_from_dict(read_json(storage.join(path, "config.json")))
    indexed = _tensor_files(path)
    files = {} if indexed is None else indexed
    np_dtype = np.dtype(jnp.dtype(dtype))
    with contextlib.ExitStack() as stack:
        handle = SafetensorsFiles(stack)
        if indexed is None:
            for file in weight_files.safetensors_in(path):
                files.update((n, file) for n in handle(file).keys())  # noqa: SIM118

        def get(name: str, shape: tuple[int, ...]) -> weight_files.LazyTensor:
            if name not in files:
                raise CheckpointError(f"LLaDA checkpoint {path}: missing tensor {name}; the "
                                      "config describes weights the checkpoint lacks")
            t = weight_files.safetensors_tensor(handle(files[name]), name)
            if tuple(t.shape) != shape:
                raise CheckpointError(f"LLaDA checkpoint {path}: {name} has shape "
                                      f"{tuple(t.shape)}, expected {shape}; fix the config to "
                                      "match the weights")
            return t

        table = param_table(cfg)
        layer_parts = {}
        for name, info in table.pop("layers").items():
            shape = info.shape(cfg)[1:]  # type: ignore[arg-type]
            names = [hf_name(name, i) for i in range(cfg.num_layers)]
            layer_parts[name] = ([get(n, shape) for n in names], names)
        top_parts = {name: ([get(info.hf, info.shape(cfg))], [info.hf])  # type: ignore[arg-type]
                     for name, info in table.items()}
        sh = shardings(cfg) if shardings is not None else None
        layers = {name: weight_files.build_leaf(
            parts, names, True, np_dtype, path, check_finite,
            None if sh is None else sh["layers"][name])
            for name, (parts, names) in layer_parts.items()}
        top = {name: weight_files.build_leaf(parts, names, False, np_dtype, path, check_finite,
                                             None if sh is None else sh[name])
               for name, (parts, names) in top_parts.items()}
    return {"embed": top.pop("embed"), "layers": layers, **top}, cfg


def save(path: str, params: dict, cfg: LLaDAConfig) -> None:
    """Write ``config.json`` and ``model.safetensors`` in the LLaDA format.

    Args:
      path: output directory (created).
      params: full-precision params (not the FP8 rollout copy).
      cfg: model config.
    """
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    out: dict[str, np.ndarray] = {}
    for name in LAYER_PARAMS:
        arr = np.asarray(params["layers"][name])
        for i in range(cfg.num_layers):
            out[hf_name(name, i)] = np.ascontiguousarray(arr[i])
    for name, info in param_table(cfg).items():
        if name != "layers":
            out[info.hf] = np.ascontiguousarray(np.asarray(params[name]))
    save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_to_dict(cfg), f, indent=2)
