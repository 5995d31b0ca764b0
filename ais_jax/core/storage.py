"""Run directories on a local disk or in a bucket: one set of calls for both.

A path with a scheme (``gs://bucket/run``) lives in object storage and goes through
``fsspec`` (``gcsfs`` for ``gs://``, the ``[gcs]`` extra); any other path is a local one and
keeps the plain file calls it always had (atomic rename, fsync).  Object storage has no
append and no rename, so a run writes each of its small files there as one whole object:
an object is either the old or the new one, never a torn mix (the local temporary-file
rename gives the same guarantee).  The checkpoints go through orbax, which writes ``gs://``
itself (TensorStore) and marks a finished step with ``commit_success.txt``.

Errors of the store (a missing bucket, no credentials, permission denied, the endpoint
gone after the client's own retries) become one `StorageError` line naming the object.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

from ais_jax.core.errors import StorageError, UsageError, storage_error

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
SERVED = {"gs": ("gcsfs", "gcs")}  # scheme -> (the module that serves it, the ais_jax extra)


def scheme(path: str | os.PathLike) -> str | None:
    """The URL scheme of ``path`` (``"gs"``), or None for a local path."""
    m = _SCHEME.match(os.fspath(path))
    return m.group(1).lower() if m else None


def is_remote(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an object-store URL (has a scheme) rather than a local path."""
    return scheme(path) is not None


def check_served(path: str, key: str = "out_dir") -> None:
    """Refuse a URL whose scheme nothing serves, or whose client is not installed.

    Args:
      path: the configured value.
      key: the config key, for the message.

    Raises:
      UsageError: one line naming the scheme and the fix (the extra to install).
    """
    s = scheme(path)
    if s is None:
        return
    if s not in SERVED:
        raise UsageError(
            f"{key} {path}: the scheme {s}:// is not served (supported: local "
            "paths and gs://bucket/path); use a local path or a gs:// bucket"
        )
    module, extra = SERVED[s]
    if importlib.util.find_spec(module) is None:
        raise UsageError(
            f"{key} {path}: {s}:// paths need {module}, which is not installed; "
            f"run `pip install 'ais_jax[{extra}]'`"
        )
    bucket = os.fspath(path)[len(s) + 3 :].split("/", 1)[0]
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]", bucket):
        raise UsageError(
            f"{key} {path}: {bucket!r} is not a valid bucket name (3-222 lower-case "
            "letters, digits, '-', '_' or '.'); write gs://<bucket>/<path>"
        )


def _fs(path: str) -> tuple[Any, str]:
    import fsspec

    check_served(path)
    # its bucket-type probe warns per call, and it logs a traceback before raising a failure
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
    s = scheme(path)
    # The instance etils.epath (and so orbax) uses: one listing cache, cleared by each write.
    fs = fsspec.filesystem("gcs", finalize_on_close=True) if s == "gs" else fsspec.filesystem(s)
    return fs, os.fspath(path)[len(s) + 3 :]


def refresh(path: str) -> None:
    """Forget the cached listings of ``path``'s store (objects written by TensorStore or by
    another process are then seen); a local path: nothing to do."""
    if is_remote(path):
        _fs(path)[0].invalidate_cache()
        # etils.epath (and so orbax) keeps the instance it first got (an lru_cache): after
        # fsspec's instance cache was cleared it is another one, with its own listings.
        with contextlib.suppress(ImportError, AttributeError):
            from etils.epath import backend

            backend.fsspec_backend.fs(os.fspath(path)).invalidate_cache()


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:200]


def _status(e: BaseException, low: str, code: int) -> bool:
    """Whether ``e`` is the HTTP status ``code``: its ``code`` / ``status`` attribute, else the
    number standing alone in its text ``low`` (not inside a port, as ``127.0.0.1:40317``, or
    another number)."""
    for attr in ("code", "status"):
        if isinstance(getattr(e, attr, None), int):
            return getattr(e, attr) == code
    return re.search(rf"(?<![:\d.]){code}(?![\d.])", low) is not None


def remote_error(e: BaseException, path: str) -> StorageError:
    """The one-line `StorageError` of a failed object-store call on ``path``."""
    text = _one_line(e)
    low = text.lower()
    if "forbidden" in low or _status(e, low, 403) or isinstance(e, PermissionError):
        why = "permission denied; grant this account access to the bucket"
    elif "credential" in low or _status(e, low, 401) or "unauthorized" in low:
        why = (
            "no usable credentials; run `gcloud auth application-default login` or set "
            "GOOGLE_APPLICATION_CREDENTIALS"
        )
    elif "connect" in low or "timeout" in low or "timed out" in low:
        why = "the storage endpoint does not answer (after retries); check the network"
    else:
        why = f"{type(e).__name__}: {text}"
    return StorageError(
        f"{path}: {why}; fix it, then rerun the same command to resume from the latest checkpoint"
    )


def remote_failure(e: BaseException, path: str | None) -> StorageError | None:
    """The `StorageError` of an error the object-store clients raised for the remote ``path``
    (gcsfs, aiohttp, google-auth, an OSError) wherever it surfaced; None otherwise."""
    if path is None or not is_remote(path):
        return None
    cur: BaseException | None = e
    while cur is not None:
        root = type(cur).__module__.split(".")[0]
        if isinstance(cur, OSError) or root in ("aiohttp", "gcsfs", "google", "fsspec"):
            return remote_error(cur, path)
        cur = cur.__cause__ or cur.__context__
    return None


@contextlib.contextmanager
def translated(path: str) -> Iterator[None]:
    """Turns an error of the block on ``path`` into one `StorageError` line (remote paths), or
    the disk's `StorageError` (local ones); other local errors pass unchanged."""
    try:
        yield
    except (UsageError, KeyboardInterrupt):
        raise
    except Exception as e:
        if is_remote(path):
            if isinstance(e, FileNotFoundError):  # a missing object: the caller's case
                raise
            raise remote_error(e, path) from None
        se = storage_error(e, path)
        if se is None:
            raise
        raise se from None


def join(base: str | os.PathLike, *parts: str) -> str:
    """``base/part/...``: ``/``-joined for URLs, `os.path.join` for local paths."""
    base = os.fspath(base)
    if not is_remote(base):
        return os.path.join(base, *parts)
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def exists(path: str) -> bool:
    """Whether a file, directory or (remote) prefix exists at ``path``."""
    if not is_remote(path):
        return os.path.exists(path)
    fs, inner = _fs(path)
    with translated(path):
        fs.invalidate_cache()
        return bool(fs.exists(inner))


def isdir(path: str) -> bool:
    """Whether ``path`` is a directory (remote: a prefix holding objects)."""
    if not is_remote(path):
        return os.path.isdir(path)
    fs, inner = _fs(path)
    with translated(path):
        fs.invalidate_cache()
        return bool(fs.isdir(inner))


def read_bytes(path: str, start: int | None = None, end: int | None = None) -> bytes:
    """The bytes ``[start, end)`` of the file (remote: one ranged read, nothing else fetched).

    Raises:
      FileNotFoundError: no such file.
    """
    if not is_remote(path):
        with open(path, "rb") as f:
            f.seek(start or 0)
            return f.read() if end is None else f.read(end - (start or 0))
    fs, inner = _fs(path)
    with translated(path):
        return fs.cat_file(inner, start=start, end=end)


def size(path: str) -> int:
    """The size in bytes of the file ``path`` (FileNotFoundError if missing)."""
    if not is_remote(path):
        return os.path.getsize(path)
    fs, inner = _fs(path)
    with translated(path):
        return int(fs.size(inner))


def read_text(path: str) -> str:
    """The UTF-8 text of the file at ``path`` (FileNotFoundError if missing)."""
    return read_bytes(path).decode("utf-8")


def write_bytes(path: str, data: bytes, *, create_only: bool = False) -> bool:
    """Write ``data`` as the whole file ``path`` atomically, durably (local: temporary file,
    fsync, rename; remote: one object upload).

    Args:
      path: the file.
      data: its new content.
      create_only: write only if ``path`` does not exist (local: a hard link; remote: the
        ``ifGenerationMatch=0`` precondition).

    Returns:
      False when ``create_only`` and the file exists; True when written.
    """
    if not is_remote(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with translated(path):
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if not create_only:
                os.replace(tmp, path)
                return True
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
    fs, inner = _fs(path)
    with translated(path):
        try:
            fs.pipe_file(inner, data, **({"mode": "create"} if create_only else {}))
        except FileExistsError:
            if create_only:
                return False
            raise
        return True


def write_text(path: str, text: str, *, create_only: bool = False) -> bool:
    """`write_bytes` of ``text`` in UTF-8."""
    return write_bytes(path, text.encode("utf-8"), create_only=create_only)


def makedirs(path: str) -> None:
    """Create the directory ``path`` (local); remote: check that the bucket exists (object
    stores have no directories)."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)
        return
    fs, inner = _fs(path)
    bucket = inner.split("/", 1)[0]
    with translated(path):
        fs.invalidate_cache()
        found = fs.exists(bucket)
    if not found:
        raise StorageError(
            f"{path}: the bucket {bucket} does not exist; create it (gcloud "
            f"storage buckets create gs://{bucket}) or fix the path"
        )


def remove(path: str) -> None:
    """Delete the file ``path`` if it exists."""
    if not is_remote(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    fs, inner = _fs(path)
    with translated(path), contextlib.suppress(FileNotFoundError):
        fs.rm_file(inner)


def rmtree(path: str) -> None:
    """Delete the directory ``path`` and everything in it, if it exists."""
    if not is_remote(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        return
    for rel in files(path):
        remove(join(path, rel))


def files(directory: str) -> list[str]:
    """Every file under ``directory``, as sorted paths relative to it (``[]`` if none)."""
    if not is_remote(directory):
        out = []
        for d, _, names in os.walk(directory):
            out += [os.path.relpath(os.path.join(d, n), directory) for n in names]
        return sorted(out)
    fs, inner = _fs(directory)
    with translated(directory):
        fs.invalidate_cache()
        try:
            found = fs.find(inner.rstrip("/"))
        except FileNotFoundError:
            return []
    prefix = inner.rstrip("/") + "/"
    return sorted(p[len(prefix) :] for p in found if p.startswith(prefix))


def move(src: str, dst: str) -> None:
    """Move the directory ``src`` to ``dst`` (local: a rename; remote: copy, then delete)."""
    if not is_remote(src):
        os.rename(src, dst)
        return
    for rel in files(src):
        write_bytes(join(dst, rel), read_bytes(join(src, rel)))
    rmtree(src)


def upload_dir(local_dir: str, remote_dir: str) -> None:
    """Copy every file of ``local_dir`` to ``remote_dir`` (one object per file)."""
    fs, inner = _fs(remote_dir)
    for rel in files(local_dir):
        with translated(join(remote_dir, rel)):
            fs.put_file(os.path.join(local_dir, rel), f"{inner.rstrip('/')}/{rel}")


@contextlib.contextmanager
def local_staging(prefix: str = "ais_jax_") -> Iterator[str]:
    """A temporary local directory, deleted at the end (an export before its upload)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        yield d


# Lines appended to remote files since their last upload: path -> the file's whole content.
_PENDING: dict[str, bytearray] = {}
_DIRTY: set[str] = set()


def append_lines(path: str, lines: list[str]) -> None:
    """Append whole lines (each ending in ``\\n``) to the file ``path``.

    Local: appended, flushed and fsynced before returning.  Remote (no append on object
    storage): kept in memory and uploaded as the whole object by `flush_appends`, which a run
    calls before each checkpoint and at its end; a crash loses only lines newer than the last
    checkpoint, which a resume drops anyway.
    """
    data = "".join(lines).encode("utf-8")
    if not is_remote(path):
        with translated(path), open(path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return
    if path not in _PENDING:
        try:
            _PENDING[path] = bytearray(read_bytes(path))
        except FileNotFoundError:
            _PENDING[path] = bytearray()
    _PENDING[path] += data
    _DIRTY.add(path)


def rewrite_lines(path: str, lines: list[str]) -> None:
    """Replace the file ``path`` by ``lines`` atomically (local: temporary file and rename;
    remote: one object, and the pending appends start from it)."""
    data = "".join(lines).encode("utf-8")
    if is_remote(path):
        _PENDING[path] = bytearray(data)
        _DIRTY.discard(path)
    write_bytes(path, data)


def flush_appends(quiet: bool = False, forget: bool = False) -> None:
    """Upload every remote file with lines appended since its last upload (`append_lines`).

    Args:
      quiet: drop an upload error (an error already ends the run: that one is reported).
      forget: then drop the in-memory copies (the end of a run).
    """
    try:
        for path in sorted(_DIRTY):
            write_bytes(path, bytes(_PENDING[path]))
            _DIRTY.discard(path)
    except Exception:
        if not quiet:
            raise
    finally:
        if forget:
            forget_appends()


def forget_appends() -> None:
    """Drop the in-memory copies of remote appended files (the end of a run)."""
    _PENDING.clear()
    _DIRTY.clear()
