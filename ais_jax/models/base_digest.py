"""The digest of a base model's weight files: binds a LoRA adapter or a run to its base.

A run from pretrained weights (``model.source`` an HF directory or a ``.gguf`` file)
records `source_digest` of its base in every checkpoint (``model.base_digest`` in the
stored config) and beside an exported PEFT adapter (`DIGEST_FILE`); a resume, a
``model.adapter`` load or an export on weights with another digest is refused
(`check_same_base`) unless ``model.allow_base_change`` is set.

The digest is cheap whatever the model's size: per weight file its name, its size and a
SHA-256 of three fixed 1 MiB slices (start, middle, end; a file of up to 3 MiB is hashed
whole).  Another model of the same shapes differs in the slices' bytes; a file edited only
outside the slices is not detected (the checkpoints' own checksums cover the train state).
"""

from __future__ import annotations

import hashlib
import json
import os

from ais_jax.core import storage
from ais_jax.core.errors import UsageError

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".npz")
SLICE = 1 << 20  # bytes per hashed slice
DIGEST_FILE = "ais_jax_base.json"  # beside a PEFT adapter: {"base_digest": ...}
ALLOW_KEY = "model.allow_base_change"


def _weight_files(path: str) -> list[str]:
    if storage.is_remote(path):  # a bucket prefix: its weight objects (ranged reads below)
        return [storage.join(path, f) for f in storage.files(path)
                if "/" not in f and f.endswith(WEIGHT_SUFFIXES)]
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        return []
    return sorted(os.path.join(path, n) for n in os.listdir(path)
                  if n.endswith(WEIGHT_SUFFIXES) and os.path.isfile(os.path.join(path, n)))


def file_digest(path: str) -> str:
    """SHA-256 hex of ``path``'s name, size and three fixed `SLICE`-byte slices."""
    size = storage.size(path)
    h = hashlib.sha256(f"{path.rstrip('/').rsplit('/', 1)[-1]}\0{size}\0".encode())
    if storage.is_remote(path):  # the same bytes as a local copy's: the same digest
        spans = [(0, size)] if size <= 3 * SLICE else [
            (o, o + SLICE) for o in (0, size // 2 - SLICE // 2, size - SLICE)]
        for a, b in spans:
            h.update(storage.read_bytes(path, a, b))
        return h.hexdigest()
    with open(path, "rb") as f:
        if size <= 3 * SLICE:
            h.update(f.read())
        else:
            for offset in (0, size // 2 - SLICE // 2, size - SLICE):
                f.seek(offset)
                h.update(f.read(SLICE))
    return h.hexdigest()


def source_digest(source: str) -> str | None:
    """The digest ``sha256:<16 hex>`` of the weight files of ``source`` (an HF / LLaDA
    directory or a weight file); None for ``"scratch"`` or a path without weight files."""
    if source == "scratch":
        return None
    if source == "smollm2":
        from ais_jax.models.pretrained import smollm2_gguf_path

        source = smollm2_gguf_path()
    files = _weight_files(source)
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(file_digest(f).encode())
    return "sha256:" + h.hexdigest()[:16]


def check_same_base(recorded: str | None, current: str | None, what: str, source: str,
                    allow: bool) -> None:
    """Refuse ``what`` (e.g. "cannot resume runs/x from step 2") on another base.

    Args:
      recorded: the digest of the base ``what`` was trained on (None: not recorded).
      current: the digest of ``model.source`` now (None: a scratch model).
      what: the start of the message.
      source: ``model.source``, named in the message.
      allow: ``model.allow_base_change``: the user means it; nothing is refused.

    Raises:
      UsageError: both digests are known and differ, and ``allow`` is False.
    """
    if allow or recorded is None or current is None or recorded == current:
        return
    raise UsageError(f"{what}: it was trained on base {recorded} but model.source {source} is "
                     f"{current}; point model.source at the base it was trained on, or set "
                     f"{ALLOW_KEY}=true to continue on this base")


def write_adapter_base(adapter_dir: str, digest: str | None) -> None:
    """Write `DIGEST_FILE` into an exported adapter directory (nothing when ``digest`` is None)."""
    if digest is not None:
        with open(os.path.join(adapter_dir, DIGEST_FILE), "w") as f:
            json.dump({"base_digest": digest}, f)


def read_adapter_base(adapter_dir: str) -> str | None:
    """The base digest recorded beside a PEFT adapter, or None (none recorded, unreadable)."""
    try:
        value = json.loads(storage.read_text(storage.join(adapter_dir, DIGEST_FILE))).get(
            "base_digest")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None
