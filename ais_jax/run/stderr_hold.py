"""Holding file descriptor 2 while orbax saves, without losing a fatal message.

A checkpoint save holds what is written to descriptor 2 (Python and C++ alike) in a
temporary file and writes it out afterwards, or drops it on a storage failure: orbax's and
tensorstore's background threads then log the same failure hundreds of times, and the run
reports it in one line instead.

A process can die inside the hold: in a multi-host run the JAX distributed service aborts
a survivor whose peer died (it writes why to descriptor 2, then aborts), and a C++ fatal
error aborts likewise. Python runs no cleanup then, so the held text would be lost with the
process. A watchdog child process (started before the hold) shares the temporary file and
waits on a pipe: when the pipe closes without the "done" byte (this process died), it
copies the held text to the real stderr, so the fatal message is seen after all.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

# The watchdog: reads its stdin to EOF; without the done byte it copies its stdout (the held
# file, from its start; opened for reading too) to its stderr (this process's stderr before
# the hold).
_WATCHDOG = (
    "import os, sys\n"
    "if not sys.stdin.buffer.read():\n"
    "    os.lseek(1, 0, 0)\n"
    "    while chunk := os.read(1, 1 << 16):\n"
    "        os.write(2, chunk)\n"
)


class Held:
    """The state of one hold: set ``drop`` to discard the held text instead of writing it."""

    drop = False


def _settle(buf: Any, quiet_s: float = 0.5, limit_s: float = 10.0) -> None:
    """Wait until nothing more is written to ``buf`` for ``quiet_s`` (at most ``limit_s``)."""
    t0 = last_change = time.monotonic()
    size = os.fstat(buf.fileno()).st_size
    while time.monotonic() - last_change < quiet_s and time.monotonic() - t0 < limit_s:
        time.sleep(0.05)
        now = os.fstat(buf.fileno()).st_size
        if now != size:
            size, last_change = now, time.monotonic()


def _watchdog(buf: Any) -> subprocess.Popen | None:
    """Start the watchdog over ``buf`` (None when no process can be started)."""
    try:
        return subprocess.Popen([sys.executable, "-S", "-I", "-c", _WATCHDOG],
                                stdin=subprocess.PIPE, stdout=buf.fileno())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _stop_watchdog(dog: subprocess.Popen | None) -> None:
    """Tell the watchdog this process lived (the done byte) and wait for it to exit."""
    if dog is None or dog.stdin is None:
        return
    with contextlib.suppress(OSError):
        dog.stdin.write(b"x")
        dog.stdin.close()
    with contextlib.suppress(subprocess.SubprocessError):
        dog.wait(timeout=10)


@contextlib.contextmanager
def stderr_held() -> Iterator[Held]:
    """Hold what is written to descriptor 2 during the block; write it out afterwards,
    unless ``drop`` was set; if this process dies inside the block, the watchdog writes
    it out (see the module docstring)."""
    held = Held()
    with contextlib.ExitStack() as stack:
        try:
            buf = stack.enter_context(tempfile.TemporaryFile())
            sys.stderr.flush()
            saved_fd = os.dup(2)
        except OSError:  # no descriptor or no temporary space: hold nothing
            yield held
            return
        dog = _watchdog(buf)
        os.dup2(buf.fileno(), 2)
        try:
            yield held
        finally:
            sys.stderr.flush()
            if held.drop:  # let orbax's failing threads finish logging: quiet for 0.5 s
                _settle(buf)
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            _stop_watchdog(dog)
            if not held.drop:
                buf.seek(0)
                while chunk := buf.read(1 << 16):
                    os.write(2, chunk)
