"""Experiment trackers (``log.backends``) and the completions table (``log.completions_every``).

Every backend receives the same record the CLI loop writes to
``out_dir/metrics.jsonl`` (`ais_jax.run.cli`), so metric names agree everywhere:

* ``jsonl``: ``out_dir/metrics.jsonl``; always written (a resume reads it back),
  listing it is optional.
* ``tensorboard``: event files in ``out_dir/tb`` (needs ``log.tensorboard: true``
  too, the older switch, kept so existing configs behave the same).
* ``wandb``: a Weights & Biases run in ``log.wandb_project``; offline by default
  (``log.wandb_mode``; a set ``WANDB_MODE`` wins), its files under ``WANDB_DIR`` or
  ``out_dir``; a resumed run continues the same wandb run (id in ``out_dir/wandb_id``).
* ``trackio``: a trackio run in the same project (its own local store).

Every ``log.completions_every`` RL steps the first ``log.completions_rows``
sampled completions of the step go to ``out_dir/completions.jsonl`` (and as a
table to wandb / trackio): prompt, completion, reward and the per-token
log-ratio ``log rho = logp_old - logp_rollout`` statistics of the row.  Such a
step scores ``logp_old`` with the trainer's score program, an extra forward
when the update takes ``logp_old`` from its own forward.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ais_jax.core import storage
from ais_jax.core.errors import UsageError, storage_error
from ais_jax.run.results import json_safe

BACKENDS = ("jsonl", "tensorboard", "wandb", "trackio")
WANDB_MODES = ("offline", "online")
COLUMNS = ("step", "row", "prompt", "completion", "reward", "tokens", "log_ratio_abs_mean",
           "log_ratio_abs_max", "log_ratio_sum")
_HINTS = {"wandb": "pip install wandb", "trackio": "pip install trackio"}


def parse_backends(log: Any) -> tuple[str, ...]:
    """The backends of a ``log`` section (`ais_jax.config.schema.LogSection`), checked.

    Args:
      log: the section; ``log.backends`` is a comma-separated string of names.

    Returns:
      The names in order, without duplicates; ``tensorboard`` is dropped when
      ``log.tensorboard`` is false.

    Raises:
      UsageError: an unknown or not installed backend, a bad wandb mode, or a
        negative completions setting.
    """
    names: list[str] = []
    for raw in str(log.backends or "").split(","):
        name = raw.strip().lower()
        if not name or name in names:
            continue
        if name not in BACKENDS:
            raise UsageError(f"log.backends: unknown backend {name!r}; choose from "
                             f"{', '.join(BACKENDS)} (comma-separated, e.g. \"jsonl,wandb\")")
        if name in _HINTS and importlib.util.find_spec(name) is None:
            raise UsageError(f"log.backends lists {name} but it is not installed; run "
                             f"`{_HINTS[name]}` or drop it from log.backends")
        names.append(name)
    if log.wandb_mode not in WANDB_MODES:
        raise UsageError(f"log.wandb_mode must be one of {', '.join(WANDB_MODES)}, "
                         f"got {log.wandb_mode!r}")
    for key in ("completions_every", "completions_rows"):
        if getattr(log, key) < 0:
            raise UsageError(f"log.{key} must be >= 0, got {getattr(log, key)}")
    if not log.tensorboard and "tensorboard" in names:
        names.remove("tensorboard")
    return tuple(names)


def _import(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError as e:
        raise UsageError(f"log.backends lists {name} but it is not installed "
                         f"({e}); run `{_HINTS[name]}` or drop it from log.backends") from None


class Trackers:
    """The run's tracker backends besides ``metrics.jsonl``: TensorBoard, wandb, trackio.

    Args:
      cfg: the run config (`ais_jax.config.schema.Config`).
      config: the flat config logged with the run (`ais_jax.run.runguard.flat_config`).
      enabled: False on processes other than the main one (nothing is opened).

    Raises:
      UsageError: a bad ``log`` section or a missing optional package.
    """

    def __init__(self, cfg: Any, config: dict[str, Any], enabled: bool = True) -> None:
        self.out_dir = cfg.out_dir
        self.names = parse_backends(cfg.log) if enabled else ()
        self.tb: Any = None
        self.wandb: Any = None  # the wandb run
        self.trackio: Any = None
        for name in self.names:
            try:
                self._open(name, cfg, config)
            except UsageError:
                raise
            except Exception as e:  # e.g. wandb online without a login: fail before any work
                se = storage_error(e, cfg.out_dir)
                if se is not None:
                    raise se from None
                msg = " ".join(str(e).split())[:200] or type(e).__name__
                raise UsageError(f"log.backends: {name} could not start ({type(e).__name__}: "
                                 f"{msg}); fix its setup or drop it from log.backends") from None

    def _open(self, name: str, cfg: Any, config: dict[str, Any]) -> None:
        if name == "tensorboard":
            from tensorboardX import SummaryWriter

            if storage.is_remote(cfg.out_dir):
                raise UsageError(f"log.backends: tensorboard cannot write into the bucket "
                                 f"out_dir {cfg.out_dir}; set log.tensorboard=false (metrics.jsonl "
                                 "is written there) or use a local out_dir")

            self.tb = SummaryWriter(os.path.join(cfg.out_dir, "tb"))
        elif name == "wandb":
            self._wandb_init(_import("wandb"), cfg, config)
        elif name == "trackio":
            self.trackio = _import("trackio")
            self.trackio.init(project=cfg.log.wandb_project, config=config,
                              name=os.path.basename(os.path.abspath(cfg.out_dir)))

    def _wandb_init(self, wandb: Any, cfg: Any, config: dict[str, Any]) -> None:
        id_path = storage.join(cfg.out_dir, "wandb_id")
        run_id = None
        with contextlib.suppress(FileNotFoundError):
            run_id = storage.read_text(id_path).strip() or None
        mode = os.environ.get("WANDB_MODE") or cfg.log.wandb_mode
        self.wandb_table = wandb.Table
        self.wandb = run = wandb.init(project=cfg.log.wandb_project, config=config, mode=mode,
                              dir=os.environ.get("WANDB_DIR") or _local_dir(cfg.out_dir), id=run_id,
                              resume="allow", name=os.path.basename(os.path.abspath(cfg.out_dir)))
        if run_id is None and getattr(run, "id", None):
            storage.write_text(id_path, run.id)

    def log(self, record: dict[str, Any], rows: Sequence[dict[str, Any]] = ()) -> None:
        """Send one step's record (and its completion rows, if any) to every backend.

        Args:
          record: the ``metrics.jsonl`` record; ``record["step"]`` is the step.
          rows: `completion_rows` of this step, logged as a ``completions`` table.
        """
        step = int(record["step"])
        if self.tb is not None:
            for name, v in record.items():
                if name != "step" and isinstance(v, float) and math.isfinite(v):
                    self.tb.add_scalar(name, v, step)
        for sink, table in ((self.wandb, getattr(self, "wandb_table", None)),
                            (self.trackio, getattr(self.trackio, "Table", None))):
            if sink is None:
                continue
            data = dict(record)
            if sink is self.trackio:  # trackio reserves "step": it is the step= argument
                data.pop("step", None)
            if rows and table is not None:
                data["completions"] = table(
                    columns=list(COLUMNS), data=[[r[c] for c in COLUMNS] for r in rows])
            sink.log(data, step=step)

    def close(self) -> None:
        """Flush and close every backend."""
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        for attr in ("wandb", "trackio"):
            mod = getattr(self, attr)
            if mod is not None:
                mod.finish()
                setattr(self, attr, None)


def _num(x: Any) -> float | None:
    v = float(x)
    return v if math.isfinite(v) else None


def completion_rows(step: int, prompts: Sequence[str], completions: Sequence[str],
                    rewards: Any, stats: dict[str, np.ndarray],
                    limit: int = 0, rows: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The completions-table rows of one step (non-finite numbers become None).

    Args:
      step: the RL step (as in ``metrics.jsonl``, 1-based).
      prompts: the prompt text of each row.
      completions: the decoded completion of each row.
      rewards: ``[B]`` total rewards.
      stats: `ais_jax.method.corrections.ratio_stats` of the rows.
      limit: keep the first ``limit`` rows; 0 keeps all.
      rows: the batch row of each entry (a multi-process run passes the rows its process
        scored, `ais_jax.training.placement.owned_rows`); None: ``0, 1, ...``.

    Returns:
      One dict per row with the keys of `COLUMNS`.
    """
    n = len(completions) if limit <= 0 else min(limit, len(completions))
    rew = np.asarray(rewards).reshape(-1)
    ids = range(n) if rows is None else [int(r) for r in rows]
    return [{"step": step, "row": ids[i], "prompt": prompts[i], "completion": completions[i],
             "reward": _num(rew[i]), "tokens": int(stats["tokens"][i]),
             **{k: _num(stats[k][i]) for k in COLUMNS[6:]}} for i in range(n)]


def samples_hook(log: Any, step: int, rows: list[dict[str, Any]]) -> Any:
    """The ``on_samples`` callback of RL step ``step`` (`ais_jax.training.rl`), or None
    off-schedule.

    Args:
      log: the ``log`` section (``completions_every``, ``completions_rows``).
      step: the 1-based RL step.
      rows: receives the step's `completion_rows`.

    Returns:
      ``on_samples(prompts, completions, rewards, stats, batch_rows)``, or None when ``step``
      is not a multiple of ``log.completions_every`` (or it is 0).
    """
    every = log.completions_every
    if not every or step % every:
        return None

    def on_samples(prompts: list[str], completions: list[str], rewards: np.ndarray,
                   stats: dict[str, np.ndarray], batch_rows: np.ndarray) -> None:
        rows.extend(completion_rows(step, prompts, completions, rewards, stats,
                                    limit=log.completions_rows, rows=batch_rows))

    return on_samples


def completions_path(out_dir: str) -> str:
    """``out_dir/completions.jsonl``."""
    return storage.join(out_dir, "completions.jsonl")


def write_rows(out_dir: str, rows: Sequence[dict[str, Any]]) -> None:
    """Append completion rows to ``out_dir/completions.jsonl`` (whole lines, fsynced; a
    bucket: uploaded at the next checkpoint, `ais_jax.core.storage.append_lines`)."""
    storage.append_lines(completions_path(out_dir),
                         [json.dumps(json_safe(row), allow_nan=False) + "\n" for row in rows])


def truncate_rows(out_dir: str, upto: int) -> None:
    """On a resume, keep the completion rows of steps ``<= upto`` (and no torn last line)."""
    path = completions_path(out_dir)
    if not storage.exists(path):
        return
    kept = []
    for raw in storage.read_bytes(path).splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            break
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= upto:
            kept.append(raw.decode("utf-8"))
    storage.rewrite_lines(path, kept)


def _local_dir(out_dir: str) -> str:
    """``out_dir``, or for a bucket a local temporary directory (wandb writes local files)."""
    if not storage.is_remote(out_dir):
        return out_dir
    import tempfile

    return tempfile.mkdtemp(prefix="ais_jax_wandb_")
