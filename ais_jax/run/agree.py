"""One run, one config: every process of a multi-process run checks it runs process 0's run.

Processes started with different overrides (another seed, learning rate or step count on
one host) used to train silently on a mix of both runs, or abort in a collective. At the
start of a run (`ais_jax.run.loop.run`, before any collective or compilation) every process
publishes its *identity* in the JAX distributed key-value store: the flat resolved config
(`ais_jax.run.runguard.run_record`, with the base model's digest) without the keys that are
per process by nature (`PER_PROCESS`), the digest of the ``ais_jax`` source and the JAX
version, the digests of the files the config names (a dataset, a reward module, an adapter)
and the process count it was started with. Every process reads every identity and finds the
first key in which a process differs from process 0; then all of them raise the same one
line naming that key, the process and both values (exit 2 from the CLI). A process that
never publishes (it died) is waited for up to ``runtime.init_timeout_s``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Iterable
from typing import Any

from ais_jax.core.errors import UsageError

# Keys that may differ between processes: where each process writes (out_dir is checked to
# be one shared directory by `ais_jax.run.multihost.check_shared_dir`) and process settings.
PER_PROCESS = ("out_dir", "runtime.*")
CODE_KEY = "code.ais_jax_digest"  # the digest of the package's .py files
JAX_KEY = "code.jax_version"
COUNT_KEY = "processes.count"  # the count the process was started with
FILE_SUFFIX = " (file contents)"  # a key naming a file: the digest of its contents
_KV_PREFIX = "ais_jax/run_identity"
_MAX_FILES = 256  # files hashed per directory a key names
_calls = 0  # runs started by this process (each exchange uses its own keys)


def code_digest() -> str:
    """``sha256:<16 hex>`` of the ``ais_jax`` package's Python sources (paths and bytes)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read())
    return "sha256:" + h.hexdigest()[:16]


def _files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        out += [os.path.join(dirpath, n) for n in sorted(filenames)]
        if len(out) >= _MAX_FILES:
            break
    return out[:_MAX_FILES]


def path_digest(path: str) -> str | None:
    """The digest of the file or directory ``path`` (`ais_jax.models.base_digest.file_digest`
    per file: name, size and three slices), or None when nothing is there."""
    from ais_jax.models.base_digest import file_digest

    if not os.path.exists(path):
        return None
    h = hashlib.sha256()
    for f in _files(path):
        h.update(os.path.relpath(f, path).encode() + b"\0" + file_digest(f).encode())
    return "sha256:" + h.hexdigest()[:16]


def _named_paths(flat: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """``(key, path)`` for every config value naming an existing file or directory (a
    ``path:function`` reference names its file)."""
    for key, value in flat.items():
        named = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in named:
            if not isinstance(v, str) or not v:
                continue
            for cand in dict.fromkeys((v, v.rsplit(":", 1)[0])):
                if (os.sep in cand or os.path.isfile(cand)) and os.path.exists(cand):
                    yield (key if sub is None else f"{key}.{sub}"), cand
                    break


def identity(cfg: Any, dataset: Any = None) -> dict[str, Any]:
    """What must be equal on every process: the config, the code, the data.

    Args:
      cfg: the run's config.
      dataset: the rows given to `ais_jax.run.loop.run` (replacing ``task.train_file``).

    Returns:
      ``{key: JSON value}``: the flat config without `PER_PROCESS` keys, the model's base
      digest, `CODE_KEY`, `JAX_KEY`, `COUNT_KEY` and ``<key> (file contents)`` digests.
    """
    import jax

    from ais_jax.run.runguard import run_record

    flat = {k: v for k, v in run_record(cfg).items()
            if not any(fnmatch.fnmatchcase(k, p) for p in PER_PROCESS)}
    for key, path in list(_named_paths(flat)):
        flat[key + FILE_SUFFIX] = path_digest(path)
    if dataset is not None:
        rows = getattr(dataset, "_fingerprint", None) or json.dumps(
            list(dataset), sort_keys=True, default=str)
        flat["dataset (the rows given to run)"] = hashlib.sha256(
            str(rows).encode()).hexdigest()[:16]
    flat[CODE_KEY], flat[JAX_KEY] = code_digest(), jax.__version__
    flat[COUNT_KEY] = int(os.environ.get("AIS_JAX_NUM_PROCESSES") or jax.process_count())
    return flat


def first_difference(records: list[dict[str, Any]]) -> str | None:
    """The one line naming the first key in which a process differs from process 0, or None.

    Args:
      records: every process's `identity`, by process index.
    """
    base = records[0]
    for i, rec in enumerate(records[1:], start=1):
        for key in [*base, *(k for k in rec if k not in base)]:
            a, b = base.get(key, "<unset>"), rec.get(key, "<unset>")
            if a != b:
                shown = (f"{_short(a)} on process 0, {_short(b)} on process {i}")
                return (f"the processes of this run differ: process {i} has another {key} "
                        f"({shown}); start every process with the same code, config, "
                        "overrides and files (only out_dir and runtime.* may differ)")
    return None


def _short(v: Any) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= 80 else s[:77] + "..."


def check_one_run(cfg: Any, dataset: Any = None) -> None:
    """Every process runs process 0's run; a no-op with one process. Call on every process
    at the same point, before any collective.

    Raises:
      UsageError: on every process alike, naming the first differing key and process
        (`first_difference`), or a process whose identity did not arrive within
        ``runtime.init_timeout_s``.
    """
    import jax

    global _calls
    if jax.process_count() < 2:
        return
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:  # not started by jax.distributed.initialize: nothing to exchange over
        return
    _calls += 1
    prefix = f"{_KV_PREFIX}/{_calls}"
    client.key_value_set(f"{prefix}/{jax.process_index()}", json.dumps(identity(cfg, dataset)))
    records = []
    for i in range(jax.process_count()):
        try:
            got = client.blocking_key_value_get(f"{prefix}/{i}",
                                                int(cfg.runtime.init_timeout_s * 1000))
        except Exception as e:
            raise UsageError(
                f"process {i} did not send its config within runtime.init_timeout_s="
                f"{cfg.runtime.init_timeout_s:g} s ({' '.join(str(e).split())[:200]}); see "
                "its log") from None
        records.append(json.loads(got))
    line = first_difference(records)
    if line:
        raise UsageError(line)
