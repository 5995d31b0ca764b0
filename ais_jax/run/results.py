"""A run's results on disk: ``final/`` and ``summary.json``, written so that they are never stale.

* ``summary.json`` carries the step its results belong to (``"step"``); it is written last,
  atomically (temporary file, fsync, rename), after ``final/``, so a summary that names step N
  means ``final/`` holds the policy of step N.
* ``final/`` is written into ``final.tmp`` and renamed into place (the previous export is
  moved aside first and deleted only after the rename), so a crash never leaves a half export
  that looks whole.
* `finished` tells whether a run directory's results cover its latest checkpoint and
  ``train.steps``; when they do not (an interrupted export, a run extended and stopped in
  its last step), the run restores that checkpoint and finishes the export instead of
  reporting old results.
* `make_out_dir`: creates ``out_dir``; a path error is one line naming it.
* `check_fresh_out_dir`: an ``out_dir`` with results but no checkpoint is refused unless
  ``overwrite`` (the CLI's ``--overwrite``).
* `json_safe`: non-finite floats become ``null`` in every JSON file a run writes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Callable
from typing import Any

from ais_jax.core import storage
from ais_jax.core.errors import UsageError, storage_error
from ais_jax.core.safe_yaml import PATH_CHARS, clip

SUMMARY = "summary.json"
FINAL = "final"
ADAPTER_DIR = "adapter"  # under FINAL with LoRA: the adapters in PEFT's format
METRICS = "metrics.jsonl"


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (valid JSON, no ``Infinity``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically: a temporary file, fsync and rename on
    disk; one whole object in a bucket (`ais_jax.core.storage`)."""
    text = json.dumps(json_safe(data), indent=1, allow_nan=False)
    if storage.is_remote(path):
        storage.write_text(path, text)
        return
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise (storage_error(e, path) or e) from None


def make_out_dir(out_dir: str) -> None:
    """Create the run directory ``out_dir`` (and its parents) if needed.

    Raises:
      StorageError: the disk refused (full, quota, read-only, permissions).
      UsageError: any other path error (a dangling link, a path the OS cannot create,
        e.g. under ``/proc``): one line naming the path and the fix.
    """
    if storage.is_remote(out_dir):  # a bucket: no directories; the bucket must exist
        storage.makedirs(out_dir)
        return
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        se = storage_error(e, out_dir)
        if se is not None:
            raise se from None
        raise UsageError(f"cannot create out_dir {clip(out_dir, PATH_CHARS)}: {e.strerror or e}; "
                         "use another out_dir (a directory path you can write to)") from None


def read_summary(out_dir: str) -> dict[str, Any] | None:
    """``summary.json`` of ``out_dir``, or None when it is missing or unreadable."""
    try:
        data = json.loads(storage.read_text(storage.join(out_dir, SUMMARY)))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def finished(out_dir: str, step: int) -> bool:
    """Whether ``out_dir`` holds complete results of step ``step`` or later.

    True when ``summary.json`` names a step >= ``step`` (``"step"``; files of older versions:
    their ``"steps"``, the configured length, which may be stale) and ``final/`` exists.
    """
    s = read_summary(out_dir)
    if s is None or not storage.isdir(storage.join(out_dir, FINAL)):
        return False
    done = s.get("step", s.get("steps"))
    return isinstance(done, int) and not isinstance(done, bool) and done >= step


def check_fresh_out_dir(out_dir: str, overwrite: bool) -> None:
    """Refuse to start a new run over the results of an earlier one (no checkpoint left).

    Args:
      out_dir: the run directory, which holds no restorable checkpoint.
      overwrite: the user said so (``--overwrite``): the old results are replaced.

    Raises:
      UsageError: ``out_dir`` holds ``summary.json``, ``final/`` or a non-empty
        ``metrics.jsonl``; the message lists them.
    """
    found = [n for n in (SUMMARY, FINAL) if storage.exists(storage.join(out_dir, n))]
    with contextlib.suppress(OSError):
        if storage.read_bytes(storage.join(out_dir, METRICS), 0, 1):
            found.append(METRICS)
    if found and not overwrite:
        raise UsageError(
            f"{out_dir} holds the results of an earlier run ({', '.join(found)}) but no "
            "checkpoint to resume; use a new out_dir, or pass --overwrite to replace them")


def export_final(out_dir: str, save: Callable[[str], None]) -> str:
    """Write the final export with ``save(directory)`` atomically; returns ``out_dir/final``.

    ``save`` writes into ``out_dir/final.tmp``; then an existing ``final/`` is moved to
    ``final.old``, the new one renamed into place and the old one deleted.

    Raises:
      StorageError: the disk refused a write (full, quota, permissions).
    """
    if storage.is_remote(out_dir):
        return _export_remote(out_dir, save)
    final = os.path.join(out_dir, FINAL)
    tmp, old = final + ".tmp", final + ".old"
    for leftover in (tmp, old):
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        save(tmp)
        if os.path.exists(final):
            os.replace(final, old)
        os.replace(tmp, final)
    except Exception as e:  # safetensors / tokenizers wrap OSErrors in their own types
        se = storage_error(e, tmp)
        if se is None:
            raise
        raise se from None
    shutil.rmtree(old, ignore_errors=True)
    return final


def _export_remote(out_dir: str, save: Callable[[str], None]) -> str:
    """`export_final` into a bucket (no rename there): ``save`` writes a local staging
    directory; ``summary.json`` is deleted first (a summary names a complete ``final/`` only),
    then the old ``final/`` objects, then the new files are uploaded; the caller writes the
    summary last."""
    final = storage.join(out_dir, FINAL)
    with storage.local_staging() as staging:
        local = os.path.join(staging, FINAL)
        try:
            save(local)
        except Exception as e:
            se = storage_error(e, local)
            if se is None:
                raise
            raise se from None
        storage.remove(storage.join(out_dir, SUMMARY))
        storage.rmtree(final)
        storage.upload_dir(local, final)
    return final
