"""What keeps a run directory consistent through crashes, signals and reruns (`ais_jax.run.cli`).

* `RunLock`: one run per ``out_dir``.  The lock file ``out_dir/run.lock``
  holds ``{"pid", "host", "since", "start"}``; it is published complete with
  ``os.link`` of a private temporary file (atomic, fails if the lock exists,
  works on NFS, unlike ``flock``), so a reader never sees a half-written lock.
  A lock whose process is gone (same host, and the pid is dead or belongs to a
  process started at another time) is stale and is taken over with a warning;
  a lock of another host is never taken over: its pid cannot be checked from
  here, so that host's run is never provably gone (the message says to delete
  the lock file once it is).  With several processes only process 0 takes the
  lock, and its outcome is every process's (`ais_jax.run.multihost.decide`): a
  pod restarted with another host as process 0 finds the lock of the old
  process 0's host and stops on every host with the same line until the user
  deletes ``out_dir/run.lock``.
* The resolved config travels with every checkpoint; `check_resume_config`
  refuses a resume whose config differs in anything but `RESUMABLE` keys.
* `restore_latest`: the newest checkpoint that restores; unrestorable newer
  steps are reported in one line and moved aside (never deleted).
* `append_record` / `truncate_metrics`: ``metrics.jsonl`` holds whole lines
  only (flush + fsync per line; a resume rewrites it atomically).
* Signals (SIGTERM / SIGINT) are `ais_jax.run.signals`'.
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import json
import os
import socket
import sys
from typing import Any

from ais_jax.core import storage
from ais_jax.core.errors import CheckpointError, UsageError
from ais_jax.run.results import json_safe

LOCK_NAME = "run.lock"
# Config keys that may differ between a checkpoint and the run resuming it: they
# change neither the state nor the trajectory of the steps already taken.
RESUMABLE = ("train.steps", "out_dir", "log.*", "runtime.*", "eval.every",
             "checkpoint.every", "checkpoint.keep", "checkpoint.allow_unverified", "mesh.*",
             "model.allow_base_change")
BASE_KEY = "model.base_digest"  # in a checkpoint's stored config: its base's digest
UNRESTORABLE_DIR = "checkpoints.unrestorable"


def warn(message: str) -> None:
    """Print one ``warning: ...`` line on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the lock


def _proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux ``/proc``; None elsewhere or if unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _proc_start(pid)
    return start is None or now is None or now == start  # else the pid was reused


class RunLock:
    """The exclusive lock of a run directory; use as a context manager."""

    def __init__(self, out_dir: str) -> None:
        """Args:
        out_dir: the (existing) run directory.
        """
        self.path = storage.join(out_dir, LOCK_NAME)
        self.remote = storage.is_remote(out_dir)
        self.info = {"pid": os.getpid(), "host": socket.gethostname(),
                     "since": datetime.datetime.now().isoformat(timespec="seconds"),
                     "start": _proc_start(os.getpid())}
        self.held = False

    def _read(self) -> dict[str, Any] | None:
        try:
            return json.loads(storage.read_text(self.path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    def _publish(self) -> bool:
        if self.remote:  # create-if-absent (ifGenerationMatch=0), then read back: a store
            # that ignores the precondition (an emulator) still lets only the last writer in
            if storage.exists(self.path) or not storage.write_text(
                    self.path, json.dumps(self.info), create_only=True):
                return False
            return self._read() == self.info
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.info, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def acquire(self) -> None:
        """Take the lock, or take over a stale one with a warning.

        Raises:
          UsageError: another live run (or one on another host) holds it.
        """
        for _ in range(5):
            if self._publish():
                self.held = True
                return
            holder = self._read()
            if holder is None:
                continue  # released meanwhile
            who = f"{holder.get('pid', '?')}@{holder.get('host', '?')}"
            same_host = holder.get("host") == self.info["host"]
            pid = holder.get("pid")
            if not (same_host and isinstance(pid, int) and not _alive(pid, holder.get("start"))):
                raise UsageError(
                    f"{self.path.rsplit('/', 1)[0]} is in use by run {who} since "
                    f"{holder.get('since', '?')} (lock {self.path}); wait for it, use another "
                    "out_dir, or delete the lock file if that run is gone")
            if self.remote:  # no rename: delete the stale lock, then race to create it again
                storage.remove(self.path)
                warn(f"took over the stale lock of run {who} (since {holder.get('since', '?')}; "
                     "that process is gone)")
                continue
            stale = f"{self.path}.stale.{os.getpid()}"
            try:
                os.rename(self.path, stale)
            except FileNotFoundError:
                continue  # another run took it over first
            with open(stale) as f:
                moved = f.read()
            if json.loads(moved or "{}").get("pid") != pid:  # not the stale lock: put it back
                with contextlib.suppress(FileExistsError):
                    os.link(stale, self.path)
                os.unlink(stale)
                continue
            os.unlink(stale)
            warn(f"took over the stale lock of run {who} (since {holder.get('since', '?')}; "
                 "that process is gone)")
        raise UsageError(f"cannot take the lock {self.path}; retry, or use another out_dir")

    def release(self) -> None:
        """Remove the lock file if this process holds it."""
        if self.held and (self._read() or {}).get("pid") == self.info["pid"]:
            storage.remove(self.path)
        self.held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ----------------------------------------------------------------------------- config


def flat_config(cfg: Any) -> dict[str, Any]:
    """The config as ``{"a.b": value}`` of JSON values (what checkpoints store)."""
    from ais_jax.config.yaml_io import config_to_dict

    out: dict[str, Any] = {}

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and v and prefix + k != "task.difficulty":
                walk(v, f"{prefix}{k}.")
            else:
                out[prefix + k] = v

    walk(config_to_dict(cfg), "")
    return json.loads(json.dumps(out, default=str))


def run_record(cfg: Any) -> dict[str, Any]:
    """What each checkpoint stores of its run: `flat_config`, and with pretrained weights
    the digest of the base (`BASE_KEY`, `ais_jax.models.base_digest.source_digest`)."""
    from ais_jax.models.base_digest import source_digest

    out = flat_config(cfg)
    digest = source_digest(cfg.model.source)
    if digest is not None:
        out[BASE_KEY] = digest
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, old, new)`` for every key that differs and is not `RESUMABLE`, sorted."""
    out = []
    for key in sorted(set(old) | set(new)):
        if any(fnmatch.fnmatchcase(key, pat) for pat in RESUMABLE):
            continue
        if old.get(key, "<unset>") != new.get(key, "<unset>"):
            out.append((key, old.get(key, "<unset>"), new.get(key, "<unset>")))
    return out


def check_resume_config(meta: dict[str, Any], cfg: Any, step: int, out_dir: str) -> None:
    """Refuse to resume checkpoint ``step`` under a config that changes its run.

    Args:
      meta: the checkpoint's metadata (its ``config``, when stored).
      cfg: the config of this run.
      step: the checkpoint step (for the messages).
      out_dir: the run directory (for the messages).

    Raises:
      UsageError: a key outside `RESUMABLE` differs (one line, up to 4 keys), or the base
        model's weights are not the checkpoint's (`BASE_KEY`; ``model.allow_base_change``).
    """
    old = meta.get("config")
    if not isinstance(old, dict):
        warn(f"checkpoint step {step} in {out_dir} stores no config (an older run); "
             "resuming without checking that the config is unchanged")
        return
    from ais_jax.models.base_digest import check_same_base, source_digest

    old = dict(old)
    recorded = old.pop(BASE_KEY, None)
    check_same_base(recorded if isinstance(recorded, str) else None,
                    source_digest(cfg.model.source), f"cannot resume {out_dir} from step {step}",
                    cfg.model.source, cfg.model.allow_base_change)
    new = flat_config(cfg)
    # keys added after the checkpoint was written (e.g. lora.*) at their defaults change nothing
    defaults = flat_config(type(cfg)())
    old = {**{k: v for k, v in defaults.items() if k not in old and new.get(k) == v}, **old}
    changes = config_changes(old, new)
    if changes:
        shown = ", ".join(f"{k} {a!r}->{b!r}" for k, a, b in changes[:4])
        more = f" (and {len(changes) - 4} more)" if len(changes) > 4 else ""
        raise UsageError(
            f"cannot resume {out_dir} from step {step}: the config differs from the "
            f"checkpoint's: {shown}{more}; only {', '.join(RESUMABLE)} may change on resume; "
            "use the old values or a new out_dir")


# ----------------------------------------------------------------------------- checkpoints


def latest_readable_meta(ckpt: Any, manager: Any) -> tuple[int | None, dict[str, Any]]:
    """The newest step whose metadata reads, with its metadata (``(None, {})`` if none)."""
    for step in reversed(ckpt.all_steps(manager)):
        try:
            return step, ckpt.read_metadata(manager, step)
        except CheckpointError:
            continue
    return None, {}


def resume_plan(ckpt: Any, manager: Any, cfg: Any, overwrite: bool
                ) -> tuple[int | None, bool, Any]:
    """What a run in ``cfg.out_dir`` does: ``(latest readable step or None, whether its results
    are complete, its eval_before)``; with several processes process 0 decides it for all.

    Raises:
      UsageError: a fresh start over an earlier run's results without ``overwrite``
        (`ais_jax.run.results.check_fresh_out_dir`), or a resume under a changed config.
    """
    from ais_jax.run import results

    last, meta = latest_readable_meta(ckpt, manager)
    if last is None:
        results.check_fresh_out_dir(cfg.out_dir, overwrite)
        return None, False, None
    check_resume_config(meta, cfg, last, cfg.out_dir)
    # Done only when the results name a step >= train.steps and >= the latest checkpoint
    # (with checkpoint.every=0 only checkpoint 0 is kept besides the results).
    done = results.finished(cfg.out_dir, max(cfg.train.steps, last))
    return last, done, meta.get("eval_before")


def restore_latest(ckpt: Any, manager: Any, out_dir: str, target: Any, is_main: bool,
                   allow_unverified: bool = False) -> tuple[int, Any, dict[str, Any]]:
    """Restore the newest checkpoint that restores into ``target`` (and, unless
    ``allow_unverified``, has its checksum file: `ais_jax.run.integrity.check_verifiable`).
    ``target`` may be ``target(metadata)``: the structure then follows each checkpoint's
    metadata (the in-flight batches of ``rollout.staleness``).

    Newer steps that fail are reported in one line and, once an older step
    has restored, moved (by the main process) to
    ``out_dir/checkpoints.unrestorable/<step>`` so that the run can write those
    steps again; nothing is deleted.

    Returns:
      ``(step, restored state, metadata)``.

    Raises:
      CheckpointError: no step restores (names ``out_dir``; suggests a new one).
    """
    from ais_jax.run import integrity, multihost

    steps = multihost.decide(lambda: ckpt.all_steps(manager))
    failed: list[str] = []
    for step in reversed(steps):
        error = None
        try:
            meta = ckpt.read_metadata(manager, step)
            integrity.check_verifiable(storage.join(os.fspath(manager.directory), str(step)),
                                       allow_unverified)
            state = ckpt.restore(manager, step, target(meta) if callable(target) else target)
        except CheckpointError as e:
            error = _reason(e)
        # With several processes a step restores only if it restores on every one of them.
        flags = multihost.all_flags(error is None)
        if error is not None or not all(flags):
            error = error or (f"does not restore on process(es) "
                              f"{', '.join(str(i) for i, ok in enumerate(flags) if not ok)}")
            failed.append(f"step {step}: {error}")
            continue
        bad = [s for s in steps if s > step]
        if bad:
            dest = storage.join(out_dir, UNRESTORABLE_DIR)
            if is_main:
                storage.makedirs(dest)
                for s in bad:
                    storage.move(storage.join(os.fspath(manager.directory), str(s)),
                                 storage.join(dest, str(s)))
            multihost.all_flags(True)  # a barrier: the steps are moved before any reload
            manager.reload()
            warn(f"checkpoint {'; '.join(failed)}; resuming from step {step} instead "
                 f"(moved the unrestorable step(s) {bad} to {dest}, not deleted)")
        return step, state, meta
    raise CheckpointError(
        f"no checkpoint in {out_dir} can be restored ({'; '.join(failed[:2])}); the files are "
        "left in place; start over with a new out_dir")


def _reason(e: Exception) -> str:
    """A CheckpointError's line without its advice (it may suggest deleting the checkpoints)."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    return msg.split("; use a new out_dir", 1)[0]


# ----------------------------------------------------------------------------- metrics.jsonl


def append_record(path: str, record: dict[str, Any]) -> None:
    """Append one JSON line and make it durable (flush + fsync) before returning; in a
    bucket the line is uploaded with the whole object at the next checkpoint or the run's end
    (`ais_jax.core.storage.append_lines`).

    Non-finite floats are written as ``null`` (`ais_jax.run.results.json_safe`), so every
    line is valid JSON.
    """
    storage.append_lines(path, [json.dumps(json_safe(record), allow_nan=False) + "\n"])


def truncate_metrics(path: str, upto: int, rewrite: bool = True) -> list[dict[str, Any]]:
    """Keep the complete records of steps ``<= upto``; drop torn lines and later steps.

    Args:
      path: the ``metrics.jsonl`` file (need not exist).
      upto: the last step kept (the restored checkpoint's; 0 keeps nothing).
      rewrite: rewrite the file to the kept records, atomically (temporary file,
        fsync, rename); False only reads (processes other than the main one).

    Returns:
      The kept records, in order.
    """
    kept: list[dict[str, Any]] = []
    with contextlib.suppress(FileNotFoundError):
        for raw in storage.read_bytes(path).splitlines(keepends=True):
            if not raw.endswith(b"\n"):
                break  # a torn last line
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) \
                    and rec["step"] <= upto and (not kept or rec["step"] > kept[-1]["step"]):
                kept.append(rec)
    if rewrite:
        storage.rewrite_lines(path, [json.dumps(rec) + "\n" for rec in kept])
    return kept
