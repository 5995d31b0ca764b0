"""What one process decides for all in a multi-host run, and the check that out_dir is shared.

With several processes (``jax.process_count() > 1``) every process runs the same program
and must reach the same collectives in the same order: a process that fails alone, or
takes another branch, leaves its peers waiting in a collective until a timeout (a gloo
``DEADLINE_EXCEEDED`` traceback, or a hang). So what only one process may decide (the
lock, the refusal to overwrite, the resume step, whether a checkpoint step exists, the
export) is decided by process 0 and broadcast (`decide`): every process then goes on
together, or fails with the same one line. `check_shared_dir` proves at start that
``out_dir`` is one directory all processes see (host-local disks fail in seconds).

Rules for code that runs on process 0 only (``if is_main:``): it may write files, but
never joins a collective (``process_allgather``, `ais_jax.training.placement.to_host`,
``device_get`` of a non-addressable array, an orbax save, ``sync_global_devices``); such a
collective is hoisted before the branch so that every process joins it.
With one process every function here is a plain call (no collective).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ais_jax.core import storage
from ais_jax.core.errors import UsageError

T = TypeVar("T")
MARKER_PREFIX = ".ais_jax_shared_"
# How long a process looks for process 0's marker (network file systems may publish a new
# file to other hosts a little late).
SHARED_WAIT_S = 5.0


# What a collective raises on the survivors when a peer process died (gloo on CPU, the
# coordination service anywhere).
_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "heartbeat timeout",
              "stopped sending heartbeats", "DEADLINE_EXCEEDED")


def peer_lost(e: BaseException) -> bool:
    """``e`` is what a collective raises when another process of the run died."""
    return type(e).__name__ == "JaxRuntimeError" and any(s in str(e) for s in _PEER_LOST)


# Process 0's lock of the run in progress, as every process knows it (`share_lock`).
_main_lock: dict[str, Any] = {}


def share_lock(path: str, info: dict[str, Any] | None) -> None:
    """Remember process 0's lock (its file and content; None: the run ended) so that a
    survivor of process 0's death can release it (`release_dead_main_lock`)."""
    _main_lock.clear()
    if info is not None and _count() > 1:
        _main_lock.update(path=path, info=info)


def release_dead_main_lock() -> bool:
    """After process 0 died (a failed collective), remove its lock file if it is still the
    one process 0 took for this run; process 0 cannot, and from another host the rerun could
    not take it over. Returns whether it was removed."""
    if not _main_lock or is_main():
        return False
    try:
        if json.loads(storage.read_text(_main_lock["path"])) != _main_lock["info"]:
            return False
        storage.remove(_main_lock["path"])
    except (OSError, ValueError):
        return False
    return True


class PeerFailed(Exception):  # noqa: N818 - the peer's failure, not this process's
    """Process 0 failed with an internal (non-usage) error while deciding for all."""


def _count() -> int:
    import jax

    return jax.process_count()


def is_main() -> bool:
    """Process 0 (the only one in a single-process run)."""
    import jax

    return jax.process_index() == 0


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def broadcast_json(value: Any) -> Any:
    """Process 0's ``value`` (JSON-serializable) on every process; a collective.

    Args:
      value: what process 0 sends (ignored on the other processes).

    Returns:
      Process 0's value, decoded from JSON on every process.
    """
    if _count() == 1:
        return value
    from jax.experimental import multihost_utils

    data = json.dumps(value).encode() if is_main() else b""
    n = int(multihost_utils.broadcast_one_to_all(np.int32(len(data))))
    buf = np.frombuffer(data, np.uint8) if is_main() else np.zeros(n, np.uint8)
    out = multihost_utils.broadcast_one_to_all(buf)
    return json.loads(np.asarray(out, np.uint8).tobytes().decode())


def all_flags(flag: bool) -> list[bool]:
    """Every process's ``flag``, by process index; a collective (also a barrier)."""
    if _count() == 1:
        return [bool(flag)]
    from jax.experimental import multihost_utils

    got = multihost_utils.process_allgather(np.int32(bool(flag)))
    return [bool(x) for x in np.asarray(got).reshape(-1)]


def decide(fn: Callable[[], T]) -> T:
    """Run ``fn`` on process 0 and give its result, or its error, to every process.

    Every process must call it at the same point (a collective). ``fn`` returns a
    JSON-serializable value (tuples come back as lists on the other processes).

    Args:
      fn: the decision; it runs on process 0 only.

    Returns:
      ``fn()``'s value on every process.

    Raises:
      UsageError: ``fn`` raised one on process 0: process 0 re-raises it, every other
        process raises a `UsageError` with the same message (the same one line).
      PeerFailed: on the other processes, when ``fn`` failed otherwise on process 0
        (which re-raises its own error).
    """
    if _count() == 1:
        return fn()
    if not is_main():
        got = broadcast_json(None)
        if "usage" in got:
            raise UsageError(got["usage"])
        if "failed" in got:
            raise PeerFailed(f"process 0 failed: {got['failed']}")
        return got["value"]
    try:
        value = fn()
    except UsageError as e:
        broadcast_json({"usage": str(e)})
        raise
    except Exception as e:
        broadcast_json({"failed": f"{type(e).__name__}: {_one_line(e)}"})
        raise
    broadcast_json({"value": value})
    return value


def check_shared_dir(out_dir: str) -> None:
    """Check that ``out_dir`` is one directory every process sees (not host-local disks).

    Process 0 writes a marker file holding a random token into ``out_dir``; after a barrier
    every process reads it (waiting up to `SHARED_WAIT_S` for it to appear); then the
    marker is removed. A single process checks nothing.

    Args:
      out_dir: the run directory, created by every process.

    Raises:
      UsageError: a process does not see process 0's marker (one line naming the
        processes and the fix), raised on every process alike.
    """
    if _count() == 1:
        return
    token, main_dir = broadcast_json([secrets.token_hex(16), out_dir] if is_main() else None)
    path = storage.join(out_dir, MARKER_PREFIX + token)  # a bucket too (one object)
    written = True
    if is_main():
        try:
            storage.write_text(path, token)
        except (OSError, UsageError):
            written = False
    if not all_flags(written)[0]:  # the barrier: the marker exists (or never will)
        raise UsageError(f"cannot write into out_dir {main_dir} on process 0; use a writable "
                         "out_dir shared by every host")
    seen, deadline = False, time.monotonic() + SHARED_WAIT_S
    while True:
        try:
            seen = storage.read_text(path) == token
        except (OSError, UsageError):
            seen = False
        if seen or is_main() or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    flags = all_flags(seen)
    if is_main():
        with contextlib.suppress(OSError, UsageError):
            storage.remove(path)
    blind = [i for i, ok in enumerate(flags) if not ok]
    if blind:
        raise UsageError(
            f"out_dir {main_dir} is not one directory shared by the {len(flags)} processes: "
            f"process(es) {', '.join(map(str, blind))} do not see the file process 0 wrote "
            "there (host-local disks?); put out_dir on a file system every host mounts at the "
            "same path (NFS, a FUSE-mounted bucket)")
