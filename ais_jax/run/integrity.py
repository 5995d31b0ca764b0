"""Checkpoint integrity: checksums written with every checkpoint and checked on restore, a
finite-values check of the restored state, and pruning that never deletes the checkpoint a run
resumed from.

A checkpoint whose bytes changed on disk (a bad disk, a partial copy, a stray write) restores
without error through orbax and would poison the run: the next step is NaN, and the pruning of
``checkpoint.keep`` then deletes the last good checkpoint. So:

* `write_checksums` stores the CRC-32 of every file of a finalized step directory in
  ``<step>/ais_jax_checksums.json`` (about 1-3 GB/s of hashing on the host; the state is read
  back once per save);
* `verify_checksums` fails a restore whose files differ (or are missing); the run then falls
  back to the previous checkpoint as for an unreadable one (`ais_jax.run.runguard`);
* `check_finite` fails a restored state with a NaN or an infinity in a float leaf;
* `prune` keeps the newest ``keep`` steps and, always, ``protect`` (the step the run restored).

Checkpoints written before checksums existed have no checksum file and are only
finite-checked.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.core.errors import CheckpointError

CHECKSUMS = "ais_jax_checksums.json"
_CHUNK = 8 << 20
_ADVICE = "; use a new out_dir or delete it"  # runguard drops it when it falls back


def _crc32(path: str) -> str:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _files(step_dir: str) -> list[str]:
    out = []
    for d, _, files in os.walk(step_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(d, name), step_dir)
            if rel != CHECKSUMS:
                out.append(rel)
    return sorted(out)


def write_checksums(step_dir: str) -> None:
    """Write the CRC-32 of every file under the finalized ``step_dir`` into it (atomically)."""
    sums = {rel: _crc32(os.path.join(step_dir, rel)) for rel in _files(step_dir)}
    tmp = os.path.join(step_dir, CHECKSUMS + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"algorithm": "crc32", "files": sums}, f, indent=0, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(step_dir, CHECKSUMS))


def verify_checksums(step_dir: str) -> None:
    """Check ``step_dir``'s files against the checksums written with it (none written: pass).

    Raises:
      CheckpointError: a file is missing or its bytes changed; the message names it.
    """
    path = os.path.join(step_dir, CHECKSUMS)
    if not os.path.exists(path):
        return
    try:
        with open(path) as f:
            sums = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"checkpoint {step_dir}: unreadable {CHECKSUMS} ({e}){_ADVICE}") from None
    for rel, want in sorted(sums.items()):
        full = os.path.join(step_dir, rel)
        if not os.path.exists(full):
            raise CheckpointError(f"checkpoint {step_dir} is damaged: {rel} is missing{_ADVICE}")
        if _crc32(full) != want:
            raise CheckpointError(f"checkpoint {step_dir} is damaged: the bytes of {rel} differ "
                                  f"from the checksum written with it{_ADVICE}")


@jax.jit
def _finite_flags(leaves: list[Any]) -> jax.Array:
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]) if leaves else jnp.ones((0,),
                                                                                         bool)


def check_finite(state: Any, step_dir: str) -> None:
    """Raise `CheckpointError` naming the first float leaf of ``state`` holding a NaN / inf."""
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    named = [(jax.tree_util.keystr(p), x) for p, x in flat
             if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
    if not named:
        return
    flags = jax.device_get(_finite_flags([x for _, x in named]))
    bad = [name for (name, _), ok in zip(named, flags, strict=True) if not ok]
    if bad:
        more = f" and {len(bad) - 1} more leaves" if len(bad) > 1 else ""
        raise CheckpointError(
            f"checkpoint {step_dir} holds non-finite values (in {bad[0]}{more}){_ADVICE}")


def prune(manager: Any, keep: int, protect: int | None = None) -> list[int]:
    """Delete the oldest steps beyond the newest ``keep``, never ``protect``; returns the
    deleted steps."""
    manager.reload()
    steps = sorted(manager.all_steps())
    newest = set(steps[-keep:])
    gone = [s for s in steps if s not in newest and s != protect]
    for s in gone:
        manager.delete(s)
    return gone
