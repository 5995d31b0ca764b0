"""SIGTERM / SIGINT in a run: one line on stderr for every signal, and a stop at a safe point.

`StopFlag` records the first signal and says what will happen in the run's current phase:

* warm start: it stops after its current step; the warm start is not checkpointed, so the rerun
  of the same command starts it again (nothing else was written yet);
* GRPO loop: the step in flight finishes and is checkpointed; the rerun resumes from it;
* final evaluation and export: they finish (the results are then complete); the run exits 0.

A second signal of the same kind stops at once (exit status 143 for SIGTERM, 130 for SIGINT),
after one line saying so; every checkpoint already written stays valid.  While a checkpoint is
being written (`StopFlag.saving`), that stop waits for the save and its checksums to finish, so
no step is left finalized but unverified (issue 39 row 2). `Interrupted` carries
the exit status ``128 + signum`` of a stop at a safe point.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

# Phase -> what the first signal does there (the line printed when it arrives).
PHASES = {
    "start": "stopping before any work is written; rerun the same command to start again",
    "warm start": "the warm start stops after its current step; it is not checkpointed, so "
                  "rerunning the same command starts it again",
    "grpo": "the current GRPO step finishes and is checkpointed; rerun the same command to "
            "resume",
    "finish": "the final evaluation and export finish first (the results are then complete)",
}


class Interrupted(Exception):  # noqa: N818 - it is not an error
    """The run stopped on a signal at a safe point; ``status`` is 128 + signum."""

    def __init__(self, signum: int, message: str) -> None:
        """Args:
        signum: the signal received.
        message: the one line to print.
        """
        super().__init__(message)
        self.signum = signum
        self.status = 128 + signum


class StopFlag:
    """Handlers for SIGTERM and SIGINT that record the signal and print one line (main thread).

    Attributes:
      signum: the first signal received, or None.
      phase: the run's phase, a key of `PHASES` (set by the run as it goes).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        """No handler is installed until the context is entered."""
        self.signum: int | None = None
        self.phase = "start"
        self._old: dict[int, Any] = {}
        self._saving = False
        self._deferred: int | None = None

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum == signum:
            if self._saving:
                self._deferred = signum
                print(f"received {name} again: stopping once the checkpoint being written is "
                      "complete (with its checksums)", file=sys.stderr, flush=True)
                return
            print(f"received {name} again: stopping at once; checkpoints already written are "
                  "kept: rerun the same command to resume from the latest", file=sys.stderr,
                  flush=True)
            self._stop_now(signum)
        self.signum = signum
        print(f"received {name}: {PHASES.get(self.phase, PHASES['grpo'])}; send it again to "
              "stop at once", file=sys.stderr, flush=True)

    @staticmethod
    def _stop_now(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """A checkpoint is being written inside: a second signal waits for the block's end,
        then stops at once (as it would have), unless the block raised."""
        self._saving, self._deferred = True, None
        try:
            yield
        finally:
            self._saving = False
        if self._deferred is not None:
            self._stop_now(self._deferred)

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        """Install the handlers for the ``with`` block; the previous ones come back after."""
        try:
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        except ValueError:  # not the main thread: keep the default behaviour
            pass
        try:
            yield self
        finally:
            for s, old in self._old.items():
                signal.signal(s, old)
            self._old.clear()

    def agreed(self) -> int | None:
        """The received signal or None; with several processes, the largest any received.

        Every process must call it at the same point (a collective when
        ``jax.process_count() > 1``), so that all of them stop after the same step.
        """
        signum = self.signum or 0
        import jax

        if jax.process_count() > 1:
            import numpy as np
            from jax.experimental import multihost_utils

            signum = int(np.max(multihost_utils.process_allgather(np.int32(signum))))
        return signum or None
