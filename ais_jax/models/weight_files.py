"""The checks every loader of model weight files shares (HF / AR and LLaDA directories).

Each failure is one-line `ais_jax.core.errors.CheckpointError` naming the file
or tensor and the fix: a ``config.json`` / index that is missing or not JSON
(`read_json`), an index naming shards outside the model directory
(`shard_files`), a missing, truncated or otherwise unreadable safetensors file
(`SafetensorsFiles`), and a tensor holding NaN or inf (`check_finite`).
`ais_jax.models.pretrained` and `ais_jax.models.llada.checkpoint` both use them.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ais_jax.core import storage
from ais_jax.core.errors import CheckpointError


def read_json(path: str) -> Any:
    """The decoded JSON file ``path``.

    Raises:
      CheckpointError: the file is missing or not valid JSON (one line).
    """
    if not isfile(path):
        raise CheckpointError(f"{path} not found; an HF checkpoint directory needs a config.json")
    try:
        return json.loads(storage.read_text(path))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, huge ints
        raise CheckpointError(f"{path} is not valid JSON ({str(e)[:200]}); repair or re-export "
                              "it") from None


def check_finite(arr: np.ndarray, name: str, source: str) -> None:
    """Refuse a tensor holding NaN or inf.

    Args:
      arr: the tensor as loaded (after the cast to the load dtype, so an
        overflow of the cast counts); integer tensors always pass.
      name: the tensor's name in the file, for the message.
      source: the file or directory, for the message.

    Raises:
      CheckpointError: naming the tensor and the count of non-finite values.
    """
    if np.issubdtype(arr.dtype, np.integer) or bool(np.isfinite(arr).all()):
        return
    bad = int(np.count_nonzero(~np.isfinite(arr)))
    raise CheckpointError(f"tensor {name!r} in {source} holds {bad} non-finite values (NaN or "
                          f"inf) of {arr.size}; the weights are corrupt (re-download or "
                          "re-export them) or overflow the load dtype")


def shard_files(path: str, index: str, weight_map: Any) -> dict[str, str]:
    """Tensor name -> shard path from an index's ``weight_map``; shards stay inside ``path``.

    The check is on the names (no absolute path, no ``..`` component), made before any
    shard is opened; symlinks inside the directory (the HF hub cache) are followed.

    Args:
      path: the model directory.
      index: the index file's path (for messages).
      weight_map: its ``weight_map`` entry (anything: checked here).

    Raises:
      CheckpointError: no ``weight_map`` object, a shard that is not a file name,
        or a shard path outside ``path``.
    """
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index} has no 'weight_map' object; re-export the checkpoint")
    files = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise CheckpointError(f"{index} maps tensor {str(tensor)[:80]!r} to "
                                  f"{str(shard)[:80]!r}, not a file name; re-export it")
        norm = os.path.normpath(shard)
        if os.path.isabs(shard) or norm == ".." or norm.startswith(".." + os.sep):
            raise CheckpointError(f"{index} names the shard {shard[:120]!r} outside the model "
                                  "directory; refusing to open it (shards must be relative "
                                  "paths inside the directory)")
        files[tensor] = storage.join(path, norm)
    return files


class SafetensorsFiles:
    """Open safetensors files on first use, each once, inside an `contextlib.ExitStack`.

    ``files(path)`` returns the ``safe_open`` handle (numpy framework) of ``path``.
    A missing file, a truncated one (its header promises more bytes than it
    holds) or any other unreadable file is a one-line `CheckpointError`.
    """

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self._handles: dict[str, Any] = {}

    def __call__(self, file: str) -> Any:
        from safetensors import safe_open

        if file not in self._handles:
            if not isfile(file):
                raise CheckpointError(f"weight file {file} is missing; restore it or re-export")
            try:
                self._handles[file] = RemoteSafetensors(file) if storage.is_remote(file) else \
                    self._stack.enter_context(safe_open(file, framework="numpy"))
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{file} is not a readable safetensors file ({e}); "
                                      "re-export it") from None
        return self._handles[file]


def isfile(path: str) -> bool:
    """Whether ``path`` is a file (a bucket: an object, `ais_jax.core.storage`)."""
    return storage.exists(path) if storage.is_remote(path) else os.path.isfile(path)


def safetensors_in(path: str) -> list[str]:
    """The ``*.safetensors`` files directly in the directory ``path`` (or bucket prefix),
    sorted."""
    if not storage.is_remote(path):
        return sorted(glob.glob(os.path.join(path, "*.safetensors")))
    return [storage.join(path, f) for f in storage.files(path)
            if "/" not in f and f.endswith(".safetensors")]


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
           "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
           "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


class RemoteSafetensors:
    """A safetensors file in a bucket, read by ranged reads: the header once, then per
    `get_slice` index only the rows of the leading dimension it selects (never the whole
    file first).  Offers what `safetensors_tensor` uses of a ``safe_open`` handle."""

    def __init__(self, path: str) -> None:
        self.path = path
        n = int.from_bytes(storage.read_bytes(path, 0, 8), "little")
        if not 2 <= n <= 100 << 20:
            raise ValueError(f"header length {n} is not a safetensors header")
        header = json.loads(storage.read_bytes(path, 8, 8 + n))
        header.pop("__metadata__", None)
        self.base, self.header = 8 + n, header

    def keys(self) -> list[str]:
        return list(self.header)

    def get_tensor(self, name: str) -> np.ndarray:
        part = self.get_slice(name)
        return part[tuple(slice(None) for _ in part.get_shape())]

    def get_slice(self, name: str) -> Any:
        import ml_dtypes  # noqa: F401  (registers bfloat16 / float8 with numpy)

        info = self.header[name]
        dtype = np.dtype(_DTYPES[info["dtype"]]) if info["dtype"] in _DTYPES else None
        if dtype is None:
            raise ValueError(f"tensor {name!r} has the unsupported dtype {info['dtype']}")
        shape, (begin, _) = tuple(int(d) for d in info["shape"]), info["data_offsets"]
        path, base = self.path, self.base

        class _Slice:
            def get_shape(self) -> list[int]:
                return list(shape)

            def __getitem__(self, index: Any) -> np.ndarray:
                index = index if isinstance(index, tuple) else (index,)
                if not shape:
                    raw = storage.read_bytes(path, base + begin, base + begin + dtype.itemsize)
                    return np.frombuffer(raw, dtype).reshape(())
                lead = index[0] if index else slice(None)
                start, stop, _ = lead.indices(shape[0])
                stop = max(stop, start)
                row = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
                off = base + begin + start * row
                raw = storage.read_bytes(path, off, off + (stop - start) * row) if stop > start \
                    else b""
                rows = np.frombuffer(raw, dtype).reshape((stop - start, *shape[1:]))
                return rows[(slice(None, None, lead.step), *index[1:])]

        return _Slice()


# ----------------------------------------------------------------------------- lazy tensors


class LazyTensor(NamedTuple):
    """A tensor of a weight file, read a slice at a time.

    Attributes:
      shape: the tensor's shape in the file.
      read: ``read(index) -> np.ndarray``, the part ``index`` (a tuple of slices, one per
        dimension) selects; only those bytes are read.
    """

    shape: tuple[int, ...]
    read: Callable[[tuple[slice, ...]], np.ndarray]


def safetensors_tensor(handle: Any, name: str) -> LazyTensor:
    """A `LazyTensor` over tensor ``name`` of an open safetensors handle (``get_slice``)."""
    part = handle.get_slice(name)
    return LazyTensor(tuple(int(d) for d in part.get_shape()), lambda index: part[index])


def array_tensor(arr: np.ndarray) -> LazyTensor:
    """A `LazyTensor` over an array already in memory (GGUF's dequantized tensors)."""
    return LazyTensor(tuple(arr.shape), lambda index: arr[index])


def build_leaf(parts: list[LazyTensor], names: list[str], stacked: bool, np_dtype: Any,
               source: str, check: bool, sharding: Any = None) -> Any:
    """One params leaf from its tensors, cast to ``np_dtype``, checked, laid out.

    Args:
      parts: the leaf's tensors: one, or with ``stacked`` one per layer (stacked on a new
        leading axis ``L``); shapes already checked against the config.
      names: the tensors' names in the file (for messages).
      stacked: whether the leaf is ``[L, ...]`` over ``parts``.
      np_dtype: the leaf's dtype.
      source: the file or directory (for messages).
      check: refuse NaN / inf (`check_finite`) in every part read.
      sharding: a `jax.sharding.Sharding`: the leaf is built with
        `jax.make_array_from_callback`, so each process reads only the slices its devices
        hold and no device ever receives more than its shard; None: the whole leaf is read
        into one array on the default device.

    Returns:
      The leaf (a `jax.Array`).
    """
    import jax
    import jax.numpy as jnp

    shape = ((len(parts),) if stacked else ()) + parts[0].shape

    def read(index: tuple[slice, ...]) -> np.ndarray:
        index = tuple(index) + (slice(None),) * (len(shape) - len(index))
        if stacked:
            chosen = range(*index[0].indices(len(parts)))
            pieces = [_cast(parts[i].read(index[1:]), np_dtype, names[i], source, check)
                      for i in chosen]
            return np.stack(pieces) if pieces else np.zeros((0, *parts[0].shape), np_dtype)
        return _cast(parts[0].read(index), np_dtype, names[0], source, check)

    if sharding is None:
        return jnp.asarray(read(tuple(slice(None) for _ in shape)))
    return jax.make_array_from_callback(shape, sharding, read)


def _cast(arr: np.ndarray, np_dtype: Any, name: str, source: str, check: bool) -> np.ndarray:
    with np.errstate(over="ignore"):  # an overflow becomes inf, refused just below
        out = np.asarray(arr).astype(np_dtype)
    if check:
        check_finite(out, name, source)
    return out
