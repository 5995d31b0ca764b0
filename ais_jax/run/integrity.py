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

* `check_verifiable`: a run does not resume a step without its checksum file (a save cut
  short before the file was written, or a copy without it) unless
  ``checkpoint.allow_unverified``; the step is then only finite-checked.  The checksum
  file names its step, so a step directory copied over another is refused.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import jax
import jax.numpy as jnp

from ais_jax.core import storage
from ais_jax.core.errors import CheckpointError
from ais_jax.run import multihost

CHECKSUMS = "ais_jax_checksums.json"
_CHUNK = 8 << 20
_ADVICE = "; use a new out_dir or delete it"  # runguard drops it when it falls back


def _crc32(path: str) -> str:
    crc = 0
    if storage.is_remote(path):  # ranged reads: never the whole object in memory at once
        total = storage.size(path)
        for start in range(0, total, _CHUNK):
            crc = zlib.crc32(storage.read_bytes(path, start, min(start + _CHUNK, total)), crc)
        return f"{crc:08x}"
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _files(step_dir: str) -> list[str]:
    return [rel for rel in storage.files(step_dir) if rel != CHECKSUMS]


def _step_name(step_dir: str) -> str:
    return os.path.basename(os.path.normpath(step_dir)) if not storage.is_remote(step_dir) \
        else step_dir.rstrip("/").rsplit("/", 1)[-1]


def write_checksums(step_dir: str) -> None:
    """Write the CRC-32 of every file under the finalized ``step_dir`` into it (atomically),
    with the step it belongs to (its directory name)."""
    sums = {rel: _crc32(storage.join(step_dir, rel)) for rel in _files(step_dir)}
    data: dict[str, Any] = {"algorithm": "crc32", "files": sums}
    if _step_name(step_dir).isdigit():
        data["step"] = int(_step_name(step_dir))
    if storage.is_remote(step_dir):  # one object: present whole or not at all
        storage.write_text(storage.join(step_dir, CHECKSUMS), json.dumps(data, indent=0,
                                                                          sort_keys=True))
        return
    tmp = os.path.join(step_dir, CHECKSUMS + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=0, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(step_dir, CHECKSUMS))


def check_verifiable(step_dir: str, allow_unverified: bool) -> None:
    """Refuse a step without its checksum file unless the user accepts it unverified.

    A finalized step without checksums was cut short between orbax's rename and
    `write_checksums` (a second signal, a crash), copied without the file, or written by a
    version before checksums: its bytes cannot be checked.

    Raises:
      CheckpointError: no checksum file and not ``allow_unverified``
        (``checkpoint.allow_unverified``).
    """
    if allow_unverified or storage.exists(storage.join(step_dir, CHECKSUMS)):
        return
    raise CheckpointError(f"checkpoint {step_dir} has no {CHECKSUMS} (a save cut short, or a "
                          "copy without it), so its files cannot be verified; set "
                          f"checkpoint.allow_unverified=true to restore it unverified{_ADVICE}")


def verify_checksums(step_dir: str) -> None:
    """Check ``step_dir``'s files against the checksums written with it (none written: pass;
    runs refuse that with `check_verifiable`), and that they were written for this step.

    Raises:
      CheckpointError: a file is missing or its bytes changed, or the checksums name another
        step (a copied step directory); the message names it.
    """
    path = storage.join(step_dir, CHECKSUMS)
    try:
        data = json.loads(storage.read_text(path))
        sums, named = data["files"], data.get("step")
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"checkpoint {step_dir}: unreadable {CHECKSUMS} ({e}){_ADVICE}") from None
    if isinstance(named, int) and str(named) != _step_name(step_dir):
        raise CheckpointError(f"checkpoint {step_dir} holds the files of step {named} (a copied "
                              f"step directory); its state is not step {_step_name(step_dir)}'s"
                              f"{_ADVICE}")
    for rel, want in sorted(sums.items()):
        full = storage.join(step_dir, rel)
        if not storage.exists(full):
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
    deleted steps.

    With several processes every process reloads the step list, then waits for the others
    before anything is deleted: a process still listing the directory while process 0 deletes
    a step failed on the vanished step (``FileNotFoundError``, seen once in CI).
    """
    storage.refresh(os.fspath(manager.directory))
    manager.reload()
    steps = sorted(manager.all_steps())
    newest = set(steps[-keep:])
    gone = [s for s in steps if s not in newest and s != protect]
    multihost.all_flags(True)  # a barrier: every process has listed the steps
    for s in gone:
        manager.delete(s)
    return gone
