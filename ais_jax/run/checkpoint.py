"""Orbax save / restore of the train state in ``out_dir/checkpoints``.

Each checkpoint is one step directory holding two items: ``state``, the train state pytree
(params, optimizer state, step, RNG key data, data position, counters; any pytree of arrays
and Python scalars), and ``metadata``, a small JSON dict (the config, ...).

Atomicity: orbax writes a step into ``<step>.orbax-checkpoint-tmp`` and renames
it to ``<step>`` only once every file is written, and it lists only renamed
(finalized) steps; so a crash mid-save leaves the previous latest checkpoint
as the latest.  `save` blocks until the rename, so a SIGKILL after it returns
leaves a complete checkpoint; it then writes the step's checksums, checked by
`restore` with a finite-values check of the state (`ais_jax.run.integrity`).

PRNG keys: typed key arrays (``jax.random.key``) are stored as ``jax.random.key_data`` and
rebuilt with the target's key implementation on restore; raw ``uint32`` key data as it is.

Errors: a checkpoint that cannot be restored into the target (missing or
mismatched leaves, shapes or dtypes, corrupt files) raises `CheckpointError`
with one line naming the step directory and the fix.  Nothing on disk is
deleted or overwritten on an error; only the pruning after a successful save
deletes old steps (the newest ``keep``, and the step a run restored, are kept).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from ais_jax.core import storage
from ais_jax.core.errors import CheckpointError, storage_error
from ais_jax.run import integrity
from ais_jax.run.stderr_hold import stderr_held

STATE = "state"
METADATA = "metadata"
SUBDIR = "checkpoints"


def open_manager(out_dir: str | os.PathLike, keep: int) -> ocp.CheckpointManager:
    """The checkpoint manager of the run directory ``out_dir`` (uses ``out_dir/checkpoints``).

    Args:
      out_dir: run directory; ``checkpoints/`` inside it is created if needed.
      keep: number of checkpoints kept (``max_to_keep``), >= 1; older steps
        are deleted after each successful save.

    Returns:
      An ``orbax.checkpoint.CheckpointManager``; close it with `close`.

    Raises:
      CheckpointError: ``keep < 1`` or the directory cannot be used.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise CheckpointError(f"keep must be an int >= 1, got {keep!r}")
    directory = storage.join(os.fspath(out_dir), SUBDIR)  # a bucket: orbax writes it directly
    if not storage.is_remote(directory):
        directory = os.path.abspath(directory)
    if not storage.is_remote(directory) and os.path.exists(directory) and \
            not os.path.isdir(directory):
        raise CheckpointError(
            f"checkpoint path {directory} is not a directory; use a new out_dir or move it away"
        )
    # Orbax keeps every step; `save` prunes to `keep` itself (`integrity.prune`), so that the
    # step a run restored from is never deleted.
    options = ocp.CheckpointManagerOptions(max_to_keep=None, create=True,
                                           cleanup_tmp_directories=True)
    handlers = {STATE: ocp.StandardCheckpointHandler(), METADATA: ocp.JsonCheckpointHandler()}
    try:
        manager = ocp.CheckpointManager(directory, options=options, item_handlers=handlers)
    except OSError as e:
        if storage.is_remote(directory):
            raise storage.remote_error(e, directory) from None
        raise (storage_error(e, directory) or CheckpointError(
            f"cannot open checkpoint directory {directory}: {e}; use a writable out_dir")
               ) from None
    manager.ais_jax_keep = keep  # read by `save`
    _wait_for_startup(manager)
    return manager


def _wait_for_startup(manager: ocp.CheckpointManager) -> None:
    """Wait for the background cleanup of temporary step directories the manager starts.

    Orbax runs ``cleanup_tmp_directories`` in a thread of its own that ``close`` does not
    wait for: closed right after opening (a run stopping on bad input), the thread then
    submitted work to the closed manager's executor and printed a traceback after the CLI's
    one-line error (seen once in CI).  Waiting here makes the manager idle once opened.
    """
    fut = getattr(manager, "_cleanup_tmp_directory_future", None)
    if fut is not None:
        fut.result()


def _is_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _keys_to_data(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _step_dir(manager: ocp.CheckpointManager, step: int) -> str:
    return storage.join(os.fspath(manager.directory), str(step))


def all_steps(manager: ocp.CheckpointManager) -> list[int]:
    """Finalized checkpoint steps, ascending (temporary, unfinished saves are not listed).

    Raises:
      StorageError: the store refused the listing (a bucket: permission, credentials, the
        endpoint gone), in one line naming the directory.
    """
    directory = os.fspath(manager.directory)
    with storage.translated(directory):
        storage.refresh(directory)
        manager.reload()
        return sorted(manager.all_steps())


def latest_step(manager: ocp.CheckpointManager) -> int | None:
    """The newest finalized checkpoint step, or None when there is none."""
    steps = all_steps(manager)
    return steps[-1] if steps else None


def save(
    manager: ocp.CheckpointManager,
    step: int,
    state: Any,
    metadata: dict[str, Any] | None = None,
    *,
    keep: int | None = None,
    protect: int | None = None,
) -> bool:
    """Write the train state and a JSON metadata dict as checkpoint ``step``; then write its
    checksums and prune old steps (`ais_jax.run.integrity`).

    Args:
      manager: from `open_manager`.
      step: the step number (the directory name), >= 0.
      state: pytree of jax / numpy arrays and Python scalars; may be sharded.
        Typed PRNG keys are stored as their key data.
      metadata: JSON-serializable dict (e.g. ``config_to_dict(cfg)``).
      keep: steps kept (the newest); None: the ``keep`` of `open_manager`.
      protect: a step never deleted by the pruning (the one the run restored).

    Returns:
      True if written; False if checkpoint ``step`` already exists (it is kept
      unchanged).

    Raises:
      CheckpointError: ``step`` is older than the latest checkpoint (it would
        be pruned or mistaken for progress), or ``metadata`` is not JSON.
      StorageError: the disk refused the write (full, quota, permissions); the
        checkpoints written before are intact.
    """
    from ais_jax.run import multihost

    def exists() -> bool:  # process 0 decides for all (a collective with several processes)
        steps = all_steps(manager)
        if steps and step < steps[-1]:
            raise CheckpointError(f"cannot save step {step}: {manager.directory} already "
                                  f"holds the later step {steps[-1]}; use a new out_dir or "
                                  "delete it")
        return step in steps

    if multihost.decide(exists):
        return False
    metadata = dict(metadata or {})
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as e:
        raise CheckpointError(
            f"cannot save checkpoint {_step_dir(manager, step)}: metadata is not "
            f"JSON-serializable ({e}); pass plain dicts, lists, strings and numbers"
        ) from None
    args = ocp.args.Composite(
        **{
            STATE: ocp.args.StandardSave(_keys_to_data(state)),
            METADATA: ocp.args.JsonSave(metadata),
        }
    )
    with stderr_held() as held:
        try:
            saved = manager.save(step, args=args)
            manager.wait_until_finished()
            if saved and jax.process_index() == 0:
                integrity.write_checksums(_step_dir(manager, step))
        except Exception as e:  # orbax / tensorstore wrap the OSError in their own types
            se = storage_error(e, _step_dir(manager, step))
            if se is None and storage.is_remote(_step_dir(manager, step)):
                se = storage.remote_error(e, _step_dir(manager, step))
            if se is None:
                # a peer died mid-save: orbax's threads log it at length; the CLI says it once
                held.drop = multihost.peer_lost(e)
                raise
            # Let orbax's background threads finish failing while stderr is held: they log
            # the same failure many times over; the run reports it in one line.
            with contextlib.suppress(Exception):
                manager.wait_until_finished()
            held.drop = True
            raise se from None
    integrity.prune(manager, keep or getattr(manager, "ais_jax_keep", 1), protect)
    return bool(saved)


def _path_name(path: tuple[Any, ...]) -> str:
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def _stored_leaves(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
    """Path name -> orbax array metadata of the stored state (empty when unreadable)."""
    try:
        meta = manager.item_metadata(step)[STATE]
        tree = getattr(meta, "tree", meta)
        flat = jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
        )[0]
    except Exception:  # diagnosis only; restore reports the real error
        return {}
    return {_path_name(p): m for p, m in flat if m is not None}


def _check_compatible(target: Any, stored: dict[str, Any], step_dir: str) -> None:
    """Raises CheckpointError for a target leaf whose stored shape or dtype differs."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
        name = _path_name(path)
        meta = stored.get(name)
        if meta is None or not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            continue
        got = (tuple(meta.shape), np.dtype(meta.dtype))
        want = (tuple(leaf.shape), np.dtype(leaf.dtype))
        if got != want:
            raise CheckpointError(
                f"checkpoint {step_dir} does not match the train state: leaf {name!r} is "
                f"{got[1]}{list(got[0])} on disk but {want[1]}{list(want[0])} in the target; "
                "use a new out_dir or delete it"
            )


def _structure_diff(target: Any, stored: dict[str, Any]) -> str:
    """A description of the first leaf only in the target or only on disk ("" if none found)."""
    if not stored:
        return ""
    names = [_path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(target)[0]]
    missing = [n for n in names if n not in stored]
    if missing:
        return f"leaf {missing[0]!r} of the train state is not in the checkpoint"
    extra = sorted(set(stored) - set(names))
    if extra:
        return f"the checkpoint has leaf {extra[0]!r} that the train state lacks"
    return ""


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(":")[:300]


def restore(manager: ocp.CheckpointManager, step: int, target: Any) -> Any:
    """Read checkpoint ``step`` into the structure, dtypes and shardings of ``target``.

    Args:
      manager: from `open_manager`.
      step: a step from `all_steps` / `latest_step`.
      target: a pytree like the saved state: concrete arrays (possibly
        sharded over a ``Mesh``) or ``jax.ShapeDtypeStruct`` with
        ``sharding``; restored arrays take their shardings.  Typed PRNG key
        leaves must be concrete key arrays; they come back as typed keys of
        the same implementation.

    Returns:
      The restored state pytree, bit-exact.

    Raises:
      CheckpointError: no such step, a structure / shape / dtype mismatch with
        ``target``, or unreadable files; the files are left in place.
      TypeError: an abstract (``ShapeDtypeStruct``) typed PRNG key in ``target``.
    """
    step_dir = _step_dir(manager, step)
    if step not in all_steps(manager):
        raise CheckpointError(
            f"no checkpoint {step_dir}; available steps: {all_steps(manager) or 'none'}"
        )
    for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
        if _is_key(leaf) and not isinstance(leaf, jax.Array):
            raise TypeError(
                f"target leaf {_path_name(path)!r} is an abstract PRNG key; pass a concrete "
                "key array, or keep jax.random.key_data in the train state"
            )
    key_leaves = jax.tree.map(_is_key, target)
    target_data = _keys_to_data(target)
    integrity.verify_checksums(step_dir)
    _check_compatible(target_data, _stored_leaves(manager, step), step_dir)
    try:
        restored = manager.restore(
            step, args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore(target_data)})
        )[STATE]
    except Exception as e:  # orbax / tensorstore raise many types
        reason = _structure_diff(target_data, _stored_leaves(manager, step)) or _first_line(e)
        raise CheckpointError(
            f"cannot restore checkpoint {step_dir} into the train state ({reason}); "
            "use a new out_dir or delete it"
        ) from e
    integrity.check_finite(restored, step_dir)
    return jax.tree.map(
        lambda is_key, t, r: (
            jax.random.wrap_key_data(r, impl=jax.random.key_impl(t)) if is_key else r
        ),
        key_leaves,
        target,
        restored,
    )


def read_metadata(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
    """The JSON metadata dict saved with checkpoint ``step``.

    Read from the file `ocp.args.JsonSave` wrote, not by ``manager.restore`` (a barrier of
    all processes): process 0 reads it alone to decide the resume step (`run.multihost`).

    Raises:
      CheckpointError: no such step or an unreadable metadata file.
    """
    step_dir, steps = _step_dir(manager, step), all_steps(manager)
    if step not in steps:
        raise CheckpointError(f"no checkpoint {step_dir}; available steps: {steps or 'none'}")
    try:
        meta = json.loads(storage.read_text(storage.join(step_dir, METADATA, METADATA)))
    except Exception as e:  # missing, unreadable or not JSON
        raise CheckpointError(f"cannot read the metadata of checkpoint {step_dir} "
                              f"({_first_line(e)}); use a new out_dir or delete it") from e
    return dict(meta or {})


def close(manager: ocp.CheckpointManager) -> None:
    """Finish pending saves and release the manager's resources."""
    manager.wait_until_finished()
    manager.close()


@contextlib.contextmanager
def closed_on_error(manager: ocp.CheckpointManager) -> Iterator[None]:
    """Closes ``manager`` when the block raises, then lets the error propagate.

    An open manager runs background threads (e.g. cleaning up temporary paths); left
    running at interpreter exit they print tracebacks after the CLI's one-line error.  A
    failure of the close itself is dropped: the block's error is the one to report.
    """
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            close(manager)
        raise
