"""GRPO with FP8 rollouts and AIS: ``python -m ais_jax.train --config PATH [a.b=value ...]``.

Parses the command line, loads the config and runs it (`ais_jax.run.loop.run`, also
importable from here); maps user errors to one line on stderr and exit status 2,
signals to 143 / 130.  Compiled programs go to a persistent compilation
cache (``runtime.compile_cache``), so a rerun or resume starts in seconds;
``--profile`` writes a JAX profiler trace of a few RL steps (`ais_jax.run.runtime`).

Multi-host (TPU pod, GPU cluster): every host runs the same command with
``--distributed`` (``jax.distributed.initialize()`` auto-detects the cluster),
or sets ``AIS_JAX_COORDINATOR=host:port``, ``AIS_JAX_NUM_PROCESSES`` and
``AIS_JAX_PROCESS_ID`` (`ais_jax.run.distributed`: checked, and bounded by
``runtime.init_timeout_s``; then `ais_jax.run.agree` checks that every process runs the same
run).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from ais_jax.core import storage
from ais_jax.core.errors import StorageError, UsageError, storage_error, xla_link_error
from ais_jax.run.loop import RunResult, run
from ais_jax.run.multihost import PeerFailed, peer_lost, release_dead_main_lock
from ais_jax.run.signals import Interrupted

__all__ = ["RunResult", "main", "run"]


def _init_distributed(flag: bool, timeout_s: float = 60.0) -> None:
    from ais_jax.run.distributed import init_distributed

    init_distributed(flag, timeout_s)  # bounded by runtime.init_timeout_s


def _quiet_until_exit(out_dir: str | None = None) -> None:
    """After a storage failure orbax's background threads go on logging it (hundreds of lines)
    until the process exits: point file descriptor 2 at /dev/null. Only in the CLI process
    (stderr is descriptor 2), which is about to exit with status 2, its one line printed.

    A bucket ``out_dir``: the writes orbax still has in flight (TensorStore) retry with their
    own backoff for many minutes when the endpoint is gone, and the interpreter's exit would
    wait for them; the process ends here with status 2 (the checkpoints written before are
    complete; the one in flight never got its commit marker)."""
    try:
        if sys.stderr.fileno() != 2:
            return
    except (AttributeError, OSError, ValueError):  # a captured stream (tests, notebooks)
        return
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    if out_dir is not None and storage.is_remote(out_dir):
        sys.stdout.flush()
        os._exit(2)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _exit_multi_process(e: BaseException) -> None:
    """In a multi-process run, end this process now after an unexpected error: its peers
    wait in a collective, and the normal exit would wait too (JAX's shutdown barrier, then an
    abort with a long log). A collective that failed because a peer died is reported in one
    line; any other error keeps its traceback. Returns when there is one process."""
    import jax

    try:
        if jax.process_count() < 2:
            return
    except Exception:  # no backend (the error came before JAX started)
        return
    if peer_lost(e):
        release_dead_main_lock()  # process 0 may be the one that died: its lock goes too
        print(f"error: process {jax.process_index()}: another process of this "
              f"{jax.process_count()}-process run died ({_one_line(e)[:200]}); see its log, "
              "then rerun the same command on every host to resume from the latest "
              "checkpoint", file=sys.stderr, flush=True)
    else:
        traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    ap = argparse.ArgumentParser(
        prog="python -m ais_jax.train",
        description="GRPO with FP8 rollouts and AIS. Overrides: a.b=value (e.g. train.steps=5).")
    ap.add_argument("--config", help="YAML config file (default: configs/tiny_arithmetic.yaml)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.precision=bf16")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config")
    ap.add_argument("--profile", action="store_true",
                    help="write a JAX profiler trace of runtime.profile_steps RL steps (after the "
                    "compiling one) to runtime.profile_dir, by default out_dir/profile")
    ap.add_argument("--distributed", action="store_true",
                    help="call jax.distributed.initialize() (multi-host)")
    ap.add_argument("--overwrite", action="store_true",
                    help="start over in an out_dir that holds an earlier run's results but no "
                    "checkpoint (refused otherwise)")
    args = ap.parse_intermixed_args(argv)  # --overwrite before or after the overrides

    from ais_jax.config.bounds import check_host_memory
    from ais_jax.config.load import format_config, load_config
    from ais_jax.config.schema import DEFAULT_CONFIG_PATH

    try:
        cfg = load_config(args.config or DEFAULT_CONFIG_PATH, args.overrides)
        if args.profile:
            from ais_jax.run.runtime import with_profile_flag

            cfg = with_profile_flag(cfg)
        if args.print_config:
            print(format_config(cfg))
            return 0
        check_host_memory(cfg)  # before any problem is generated or any array allocated
        _init_distributed(args.distributed, cfg.runtime.init_timeout_s)
        run(cfg, overwrite=args.overwrite)
    except UsageError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr, flush=True)
        if isinstance(e, StorageError):
            _quiet_until_exit(cfg.out_dir if "cfg" in locals() else None)
        return 2
    except PeerFailed as e:  # process 0 failed (its traceback is on its own stderr)
        print(f"error: {_one_line(e)}", file=sys.stderr, flush=True)
        return 1
    except Interrupted as e:
        print(str(e), file=sys.stderr, flush=True)
        return e.status
    except Exception as e:
        # A full disk, a quota, permissions or a bad path, wherever it was raised (orbax,
        # safetensors, trackers): the user's to fix; written checkpoints are intact.
        out_dir = cfg.out_dir if "cfg" in locals() else None
        se = (storage_error(e, out_dir) or storage.remote_failure(e, out_dir)  # gs:// too
              or xla_link_error(e))  # XLA:CPU without F16C (issue 58)
        if se is None:
            _exit_multi_process(e)
            raise
        print(f"error: {_one_line(se)}", file=sys.stderr, flush=True)
        _quiet_until_exit(out_dir)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume from the latest checkpoint",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
