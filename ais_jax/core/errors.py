"""The user-error types: every error caused by user input is a `UsageError` (CLI: one line, exit 2).

`CheckpointError` is the user error of files that hold weights or train
state (an HF directory, a GGUF file, an orbax checkpoint): a missing path, a
malformed file, a tree that does not match.  `StorageError` is the disk's refusal
(full, quota, read-only, permissions, a bad path), recognized by `storage_error`
wherever it is raised.  Anything else that escapes the CLI is an internal error
and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator


class UsageError(ValueError):
    """Bad user input (config, paths, datasets, command line); one line naming it and the fix."""


class CheckpointError(UsageError):
    """A model file or train-state checkpoint that cannot be loaded or saved; one line."""


class StorageError(UsageError):
    """The disk refused a write or read of the run's files (full, quota, read-only, permissions,
    a bad path); one line naming the path and the fix. The run stays resumable."""


# errno -> what the user can do about it.
_STORAGE_ERRNOS = {
    errno.ENOSPC: "free space on the device",
    errno.EDQUOT: "free space or raise the disk quota",
    errno.EROFS: "use a writable out_dir",
    errno.EACCES: "fix the permissions or use another out_dir",
    errno.EPERM: "fix the permissions or use another out_dir",
    errno.ENAMETOOLONG: "use a shorter out_dir name",
    errno.ENOTDIR: "a part of the path is a file, not a directory: use another out_dir",
    errno.EISDIR: "a directory stands where a file is written: move it away",
}
# Texts of storage failures that libraries (orbax / tensorstore) re-raise without an errno.
_STORAGE_TEXTS = {
    "no space left on device": errno.ENOSPC,
    "disk quota exceeded": errno.EDQUOT,
    "read-only file system": errno.EROFS,
    "permission denied": errno.EACCES,
    "file name too long": errno.ENAMETOOLONG,
}


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e`` and the exceptions it chains (``__cause__``, else ``__context__``), each once."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def storage_error(e: BaseException, path: str | None = None) -> StorageError | None:
    """The `StorageError` that ``e`` (or an exception it chains) amounts to, else None.

    Recognizes an `OSError` with one of the storage errnos anywhere in the chain, and the
    texts orbax / tensorstore use when they wrap such an error (``ValueError:
    RESOURCE_EXHAUSTED ... No space left on device``).

    Args:
      e: the exception raised by a write or read.
      path: the file or directory being written, named in the message when the error has none.

    Returns:
      A one-line `StorageError` ("<path>: <what happened>; <fix>, then rerun the same command
      to resume"), or None when ``e`` is not a storage failure.
    """
    for cur in _chain(e):
        code = cur.errno if isinstance(cur, OSError) else None
        text = str(cur).lower()
        if code not in _STORAGE_ERRNOS:
            code = next((c for t, c in _STORAGE_TEXTS.items() if t in text), None)
        if code is not None:
            where = (cur.filename if isinstance(cur, OSError) and cur.filename else path) or ""
            what = os.strerror(code)
            return StorageError(f"{where + ': ' if where else ''}{what}; {_STORAGE_ERRNOS[code]}, "
                                "then rerun the same command to resume from the latest checkpoint")
    return None


# XLA:CPU's message when its JIT cannot resolve a symbol a compiled program calls.
_LINK_FAILURE = "failed to materialize symbols"


def xla_link_error(e: BaseException) -> UsageError | None:
    """The `UsageError` that an XLA:CPU link failure ``e`` (or one it chains) amounts to.

    jaxlib 0.10.2's XLA:CPU lowers some 16-bit float conversions (bfloat16 -> float8_e5m2, and
    under its older elemental emitters every FP8 one) to calls of ``__extendhfsf2`` /
    ``__truncsfhf2``, which its JIT does not link where the code may not use F16C
    (``XLA_FLAGS=--xla_cpu_max_isa=SSE4_2``, or a CPU without F16C): compiling the program then
    fails with "Failed to materialize symbols" (issue 58).

    Args:
      e: the exception a compile raised.

    Returns:
      A one-line `UsageError` naming the cause and the fixes, or None for any other error.
    """
    for cur in _chain(e):
        if _LINK_FAILURE in str(cur).lower():
            return UsageError(
                "XLA:CPU could not link a compiled program (a 16-bit float conversion needs "
                "F16C, which this CPU or the XLA_FLAGS --xla_cpu_max_isa cap lacks): drop the "
                "--xla_cpu_max_isa cap or --xla_cpu_use_fusion_emitters=false, or use "
                "rollout.precision=bf16 (or rollout.fp8_format=e4m3) on this CPU")
    return None
