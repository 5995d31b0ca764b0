"""PEFT's LoRA adapter directories (``adapter_config.json`` + ``adapter_model.safetensors``) <->
`ais_jax.models.lora` adapters of an AR decoder or a LLaDA policy.

Module names come from the model family's parameter table (`ais_jax.models.layout`, or
`ais_jax.models.llada.model` for a `LLaDAConfig`): the adapter of ``params["layers"][name]`` at
layer ``i`` is PEFT's ``base_model.model.<layer prefix><module>.lora_A.weight`` ``[r, in]`` /
``lora_B.weight`` ``[out, r]``, where the layer prefix is ``model.layers.{i}.`` (AR) or
``model.transformer.blocks.{i}.`` (LLaDA's HF checkpoint), ``<module>`` is the table's HF name
without ``.weight`` (``self_attn.q_proj``; LLaDA: ``q_proj``, ``attn_out``, ``ff_proj``,
``up_proj``, ``ff_out``) and PEFT's ``target_modules`` lists its last part (``q_proj``).  An
untied LLaDA has a top-level ``model.transformer.ff_out`` (the output head) that PEFT's name
match would also pick: its ``target_modules`` is then a regex over the blocks' modules.  Only
plain LoRA is read: the PEFT options that change the model's function beyond ``W + scale B A``
on these linears are refused with a one-line `ais_jax.core.errors.CheckpointError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)
import numpy as np

from ais_jax.core import storage
from ais_jax.core.errors import CheckpointError, UsageError
from ais_jax.models import layout, weight_files
from ais_jax.models.lora import TARGETS, LoraConfig, validate_lora

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PeftModel -> the transformers CausalLM's own names
# PEFT options whose non-empty / true value we cannot represent (so we refuse the adapter).
_REFUSED = ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform",
            "layer_replication", "lora_bias", "fan_in_fan_out", "use_qalora", "use_bdlora",
            "alora_invocation_tokens", "trainable_token_indices", "target_parameters",
            "exclude_modules", "arrow_config", "megatron_config")


def _family(model_cfg: Any = None) -> tuple[str, dict[str, Any]]:
    """``(HF layer prefix, per-layer table)`` of the model family of ``model_cfg`` (None: AR)."""
    from ais_jax.models.llada import model as llada

    if isinstance(model_cfg, llada.LLaDAConfig):
        return llada.HF_LAYER_PREFIX, llada.LAYER_PARAMS
    return layout.HF_LAYER_PREFIX, layout.LAYER_PARAMS


def module_path(name: str, model_cfg: Any = None) -> str:
    """PEFT module path of target ``name`` under a layer: ``"wq"`` -> ``"self_attn.q_proj"``
    (a `LLaDAConfig` ``model_cfg``: ``"q_proj"``; ``"w_down"`` -> ``"ff_out"``)."""
    return _family(model_cfg)[1][name].hf.removesuffix(".weight")


def module_name(name: str, model_cfg: Any = None) -> str:
    """PEFT ``target_modules`` entry of target ``name``: ``"wq"`` -> ``"q_proj"``."""
    return module_path(name, model_cfg).rpartition(".")[2]


def peft_key(name: str, layer: int, which: str, model_cfg: Any = None) -> str:
    """Tensor name of ``which`` (``"A"`` or ``"B"``) of target ``name`` at layer ``layer``
    (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``; LLaDA:
    ``base_model.model.model.transformer.blocks.0.q_proj.lora_A.weight``)."""
    prefix = _family(model_cfg)[0].format(i=layer)
    return f"{PEFT_PREFIX}{prefix}{module_path(name, model_cfg)}.lora_{which}.weight"


def target_modules(lora_cfg: LoraConfig, model_cfg: Any) -> list[str] | str:
    """``adapter_config.json``'s ``target_modules``: the module names, or (an untied LLaDA
    with ``w_down``, whose name ``ff_out`` is also the output head's) a regex full-matching
    the blocks' modules only."""
    names = [module_name(n, model_cfg) for n in lora_cfg.targets]
    prefix = _family(model_cfg)[0]
    if "ff_out" in names and prefix != layout.HF_LAYER_PREFIX and not model_cfg.tie_embeddings:
        return (re.escape(prefix.format(i="@")).replace("@", r"\d+")
                + "(" + "|".join(names) + ")")
    return names


def _check_model_cfg(model_cfg: Any) -> None:
    from ais_jax.models.llada.model import LLaDAConfig

    if not isinstance(model_cfg, layout.ModelConfig | LLaDAConfig):
        raise UsageError(f"PEFT adapter files are supported for the AR decoder's ModelConfig and "
                         f"LLaDAConfig, not {type(model_cfg).__name__}; merge the adapters and "
                         "save the model")


def save_peft_adapter(adapters: dict, lora_cfg: LoraConfig, model_cfg: Any,
                      out_dir: str | os.PathLike, base_model_name_or_path: str = "") -> None:
    """Write ``adapters`` as a PEFT LoRA directory that ``peft.PeftModel.from_pretrained`` loads.

    Args:
      adapters: ``{"layers": {name: {"a": [L, r, in], "b": [L, out, r]}}}``; the tensors keep
        their dtype.
      lora_cfg: the adapters' settings (rank, alpha, dropout, rslora, targets).
      model_cfg: the base model's `ais_jax.models.layout.ModelConfig` or `LLaDAConfig`.
      out_dir: directory (created) for ``adapter_config.json`` and ``adapter_model.safetensors``.
      base_model_name_or_path: recorded in the config (the base checkpoint's hub id or path).

    Raises:
      CheckpointError: adapters that do not match ``lora_cfg`` / ``model_cfg``, or non-finite
        values (nothing is written then).
    """
    from safetensors.numpy import save_file

    _check_model_cfg(model_cfg)
    validate_lora(lora_cfg, model_cfg)
    host = jax.device_get(adapters)
    if sorted(host.get("layers", {})) != sorted(lora_cfg.targets):
        raise CheckpointError(f"adapters hold {sorted(host.get('layers', {}))} but "
                              f"lora_cfg.targets is {list(lora_cfg.targets)}; save matching ones")
    out: dict[str, np.ndarray] = {}
    for name in lora_cfg.targets:
        L, o, i = layout.LAYER_PARAMS[name].shape(model_cfg)
        r = lora_cfg.rank
        for which, arr, shape in (("A", host["layers"][name]["a"], (L, r, i)),
                                  ("B", host["layers"][name]["b"], (L, o, r))):
            if tuple(arr.shape) != shape:
                raise CheckpointError(f"adapter {name} {which.lower()} has shape "
                                      f"{tuple(arr.shape)}, expected {shape}; save the adapters "
                                      "of this model and rank")
            bad = int(arr.size - np.count_nonzero(np.isfinite(np.asarray(arr, np.float32))))
            if bad:
                raise CheckpointError(f"refusing to export {out_dir}: adapter {name} "
                                      f"{which.lower()} holds {bad} non-finite values")
            for layer in range(L):
                out[peft_key(name, layer, which, model_cfg)] = np.ascontiguousarray(arr[layer])
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path or None,
        "r": lora_cfg.rank,
        "lora_alpha": lora_cfg.alpha,
        "lora_dropout": lora_cfg.dropout,
        "target_modules": target_modules(lora_cfg, model_cfg),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": lora_cfg.rslora,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "layers_to_transform": None,
        "layers_pattern": None,
        "lora_bias": False,
        "revision": None,
    }
    os.makedirs(out_dir, exist_ok=True)
    save_file(out, os.path.join(out_dir, WEIGHTS_FILE), metadata={"format": "pt"})
    with open(os.path.join(out_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


def _targets(cfg: dict, model_cfg: Any, source: str) -> tuple[str, ...]:
    """The table names PEFT's ``target_modules`` selects (matched as PEFT matches them)."""
    mods = cfg.get("target_modules")
    if mods == "all-linear":  # every linear but the output head
        return TARGETS
    prefix = _family(model_cfg)[0]

    def paths(n: str) -> list[str]:  # the module in every layer, as the CausalLM names it
        return [prefix.format(i=i) + module_path(n, model_cfg)
                for i in range(model_cfg.num_layers)]

    def module_name(n: str) -> str:
        return module_path(n, model_cfg).rpartition(".")[2]

    if isinstance(mods, str):  # a regex, full-matched against module names
        try:
            hits = {n: [bool(re.fullmatch(mods, p)) for p in paths(n)] for n in TARGETS}
        except re.error as e:
            raise CheckpointError(f"{source}: target_modules {mods!r} is not a valid regex "
                                  f"({e})") from None
    elif isinstance(mods, list) and mods and all(isinstance(m, str) for m in mods):
        hits = {n: [any(p == m or p.endswith("." + m) for m in mods) for p in paths(n)]
                for n in TARGETS}
        for m in mods:
            if not any(p == m or p.endswith("." + m) for n in TARGETS for p in paths(n)):
                raise CheckpointError(f"{source}: target module {m!r} is not one of "
                                      f"{[module_name(n) for n in TARGETS]}; only the "
                                      "decoder-block linears can carry LoRA adapters here")
    else:
        raise CheckpointError(f"{source}: target_modules {mods!r} is not a list of module names")
    partial = [n for n, h in hits.items() if any(h) and not all(h)]
    if partial:
        raise CheckpointError(f"{source}: target_modules {mods!r} adapts "
                              f"{module_name(partial[0])} in some layers only; only adapters "
                              "of every layer load")
    return tuple(n for n in TARGETS if all(hits[n]))


def _check_options(cfg: Any, source: str) -> dict:
    """A parsed ``adapter_config.json``, refusing options plain LoRA cannot represent."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{source} is not a JSON object; re-export the adapter")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(f"{source}: peft_type {cfg.get('peft_type')!r} is not supported; "
                              "only LORA adapters load")
    if cfg.get("task_type") not in (None, "CAUSAL_LM"):
        raise CheckpointError(f"{source}: task_type {cfg.get('task_type')!r} is not supported; "
                              "use a CAUSAL_LM adapter")
    for key in _REFUSED:
        if cfg.get(key):
            raise CheckpointError(f"{source}: {key}={cfg[key]!r} is not supported (only plain "
                                  f"LoRA loads); re-train or re-export without {key}")
    if cfg.get("bias") not in (None, "none"):
        raise CheckpointError(f"{source}: bias={cfg['bias']!r} is not supported; only "
                              "bias='none' adapters load")
    return cfg


def load_peft_adapter(path: str | os.PathLike, model_cfg: Any, dtype: Any = jnp.float32,
                      ) -> tuple[dict, LoraConfig]:
    """Read a PEFT LoRA directory for a base model with config ``model_cfg``.

    Keys with PEFT's adapter name (``lora_A.default.weight``) are accepted too.

    Args:
      path: directory with ``adapter_config.json`` and ``adapter_model.safetensors``.
      model_cfg: the base model's `ais_jax.models.layout.ModelConfig` or `LLaDAConfig`.
      dtype: dtype of the returned adapter arrays.

    Returns:
      ``(adapters, lora_cfg)``: ``{"layers": {name: {"a": [L, r, in], "b": [L, out, r]}}}``
      and the `LoraConfig` (rank, alpha, dropout, rslora, targets) from the file.

    Raises:
      CheckpointError: a missing or malformed file; an unsupported option (DoRA, rank / alpha
        patterns, biases, modules_to_save, partial layers, ...); a target module that is not a
        decoder-block linear; a missing, extra, non-finite or mis-shaped tensor (naming the
        key, its shape and the expected one).
    """
    _check_model_cfg(model_cfg)
    path = os.fspath(path)
    cfg_path, w_path = storage.join(path, CONFIG_FILE), storage.join(path, WEIGHTS_FILE)
    for f in (cfg_path, w_path):  # a bucket too: read in ranges (weight_files)
        if not weight_files.isfile(f):
            raise CheckpointError(f"{f} not found; a PEFT adapter directory needs "
                                  f"{CONFIG_FILE} and {WEIGHTS_FILE}")
    cfg = _check_options(weight_files.read_json(cfg_path), cfg_path)
    with contextlib.ExitStack() as stack:
        handle = weight_files.SafetensorsFiles(stack)(w_path)
        names: dict[str, str] = {}  # the plain PEFT key -> the key in the file
        for k in handle.keys():  # noqa: SIM118
            plain = re.sub(r"\.lora_([AB])\.default\.weight$", r".lora_\1.weight", k)
            if plain in names:
                first, second = sorted((names[plain], k), key=len)
                raise CheckpointError(f"{w_path} holds two tensors for one module, {first!r} "
                                      f"and {second!r}; keep one of them")
            names[plain] = k
        targets = _targets(cfg, model_cfg, cfg_path)
        try:
            lora_cfg = LoraConfig(rank=cfg.get("r", 8), alpha=cfg.get("lora_alpha", 8),
                                  targets=targets, dropout=cfg.get("lora_dropout", 0.0),
                                  rslora=bool(cfg.get("use_rslora", False)))
            validate_lora(lora_cfg, model_cfg)
        except UsageError as e:
            raise CheckpointError(f"{cfg_path}: {e}") from None
        np_dtype, r = np.dtype(jnp.dtype(dtype)), lora_cfg.rank
        layers: dict[str, dict[str, Any]] = {}
        for name in targets:
            L, o, i = layout.LAYER_PARAMS[name].shape(model_cfg)
            pair = {}
            for which, shape in (("A", (r, i)), ("B", (o, r))):
                stack_ = []
                for layer in range(L):
                    key = peft_key(name, layer, which, model_cfg)
                    if key not in names:
                        raise CheckpointError(f"tensor {key!r} is missing from {w_path}; the "
                                              "adapter must cover every layer of its targets")
                    arr = handle.get_tensor(names.pop(key))
                    if tuple(arr.shape) != shape:
                        raise CheckpointError(f"tensor {key!r} in {w_path} has shape "
                                              f"{tuple(arr.shape)} but the model and r={r} imply "
                                              f"{shape}; load the adapter of this base model")
                    arr = arr.astype(np_dtype)
                    weight_files.check_finite(arr, key, w_path)
                    stack_.append(arr)
                pair[which.lower()] = jnp.asarray(np.stack(stack_))  # [L, r, in] / [L, out, r]
            layers[name] = pair
    if names:
        extra = sorted(names)
        raise CheckpointError(f"{w_path} holds tensors of no supported target ({extra[:3]}"
                              f"{'...' if len(extra) > 3 else ''}); only plain LoRA on "
                              f"{[module_name(n, model_cfg) for n in TARGETS]} loads")
    return {"layers": layers}, lora_cfg
