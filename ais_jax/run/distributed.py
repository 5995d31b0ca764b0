"""Joining a multi-process run: start-up that ends in one line instead of hanging.

``python -m ais_jax.train`` joins a multi-process run with ``--distributed``
(``jax.distributed.initialize()`` finds the cluster) or with ``AIS_JAX_COORDINATOR=host:port``,
``AIS_JAX_NUM_PROCESSES`` and ``AIS_JAX_PROCESS_ID``. `init_distributed` bounds the start-up:

* the environment is checked before JAX is asked: the count an integer >= 1, the process id
  an integer in ``0..count-1``, the coordinator ``host:port`` (one line, exit 2, at once);
* process 0 checks that it can bind the coordinator's port (a second process 0, or another
  program on the port, is refused at once instead of aborting in C++), and runs JAX's
  distributed service in a child process (`ais_jax.run.coordinator`), so that its own death
  reaches the other processes as any process's does (one line, exit 1);
* a watchdog ends the process with one line and exit 2 when the processes have not all
  joined within ``runtime.init_timeout_s`` seconds: a coordinator that does not answer, a
  process that never starts, a duplicate id, or processes started with different counts
  (JAX alone waits 300 s, then aborts with a C++ log).

Once joined, `ais_jax.run.agree` checks that every process runs the same run.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
from collections.abc import Callable, Mapping

from ais_jax.core.errors import UsageError
from ais_jax.run.coordinator import release_lingering, service_in_child

ENV_COORDINATOR = "AIS_JAX_COORDINATOR"
ENV_COUNT = "AIS_JAX_NUM_PROCESSES"
ENV_ID = "AIS_JAX_PROCESS_ID"
# JAX's own deadline is set past ours, so that our line comes first (its end is a C++ abort).
_JAX_MARGIN_S = 60


def _int_env(environ: Mapping[str, str], name: str) -> int:
    raw = environ.get(name, "")
    try:
        return int(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer; set {ENV_COUNT} to the number of "
                         f"processes and {ENV_ID} to this process's index 0..count-1") from None


def env_ids(environ: Mapping[str, str] | None = None) -> tuple[str, int, int] | None:
    """The coordinator, process count and process id the environment gives, checked.

    Args:
      environ: the environment (default ``os.environ``).

    Returns:
      ``(coordinator, count, process_id)``, or None when ``AIS_JAX_COORDINATOR`` is unset.

    Raises:
      UsageError: a missing or malformed variable, a count < 1, an id outside
        ``0..count-1``, or a coordinator that is not ``host:port``.
    """
    environ = os.environ if environ is None else environ
    coord = environ.get(ENV_COORDINATOR, "").strip()
    if not coord:
        return None
    host, _, port = coord.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{ENV_COORDINATOR}={coord!r} is not host:port; set it to process 0's "
                         "host and a free port, e.g. host0:1234")
    for name in (ENV_COUNT, ENV_ID):
        if name not in environ:
            raise UsageError(f"{ENV_COORDINATOR} is set but {name} is not; set {ENV_COUNT} "
                             f"(the number of processes) and {ENV_ID} (0..count-1) too")
    count, pid = _int_env(environ, ENV_COUNT), _int_env(environ, ENV_ID)
    if count < 1:
        raise UsageError(f"{ENV_COUNT}={count} must be >= 1 (the number of processes)")
    if not 0 <= pid < count:
        raise UsageError(f"{ENV_ID}={pid} is outside 0..{count - 1} ({ENV_COUNT}={count}); "
                         "give each process a distinct id in that range")
    return coord, count, pid


_claims: list[socket.socket] = []  # process 0's claim on its port, held for the process's life


def _claim(port: int) -> bool:
    """Bind the host-wide name ``ais_jax-coordinator-<port>`` (a Linux abstract socket, gone
    with the process): False when another process of this host holds it."""
    if not sys.platform.startswith("linux"):
        return True
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(f"\0ais_jax-coordinator-{port}")
    except OSError:
        s.close()
        return False
    _claims.append(s)
    return True


def check_port_free(port: int) -> None:
    """Process 0: no other process 0 of this host uses ``port`` (`_claim`, atomic) and the
    coordinator's port can be bound (JAX binds ``[::]:port``).

    Raises:
      UsageError: the port is in use (a second process 0, or another program).
    """
    busy = UsageError(f"the coordinator port {port} is already in use on this host (another "
                      f"process with {ENV_ID}=0, or another program): give every process a "
                      f"distinct {ENV_ID}, or choose a free port in {ENV_COORDINATOR}")
    if not _claim(port):
        raise busy
    release_lingering(port)  # the service a dead process 0 of this host left serving
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host: try IPv4
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no use
            try:
                s.bind((addr, port))
                return
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    if _claims:  # the claim goes with the refusal
                        _claims.pop().close()
                    raise busy from None


def _watchdog(timeout_s: float, message: str) -> threading.Event:
    """A thread that prints ``message`` and ends the process with status 2 unless the
    returned event is set within ``timeout_s`` (JAX's connect releases the GIL)."""
    joined = threading.Event()

    def watch() -> None:
        if not joined.wait(timeout_s):
            print(f"error: {message}", file=sys.stderr, flush=True)
            os._exit(2)

    threading.Thread(target=watch, name="ais_jax-init-watchdog", daemon=True).start()
    return joined


def joined_within(timeout_s: float, message: str, connect: Callable[[], None]) -> None:
    """Run ``connect`` under a `_watchdog` of ``timeout_s`` seconds; its failure is one line.

    Raises:
      UsageError: ``connect`` raised (its error, in one line, after ``message``).
    """
    joined = _watchdog(timeout_s, message)
    try:
        connect()
    except Exception as e:
        raise UsageError(f"{message} ({' '.join(str(e).split())[:300]})") from None
    finally:
        joined.set()


def init_distributed(flag: bool, timeout_s: float) -> None:
    """Join the multi-process run the environment or ``--distributed`` asks for, or do nothing.

    Args:
      flag: ``--distributed`` (``jax.distributed.initialize()`` auto-detects the cluster).
      timeout_s: ``runtime.init_timeout_s``: every process must have joined by then.

    Raises:
      UsageError: a bad environment (`env_ids`), a busy coordinator port on process 0, or
        ``jax.distributed.initialize`` failing; a start-up that does not finish within
        ``timeout_s`` ends the process with one line and status 2 (`_watchdog`).
    """
    import jax

    ids = env_ids()
    deadline = int(timeout_s) + _JAX_MARGIN_S
    if ids is None:
        if flag:
            joined_within(timeout_s, f"the processes of this run did not all join within "
                          f"runtime.init_timeout_s={timeout_s:g} s (jax.distributed.initialize "
                          "auto-detection); start the same command on every host, or raise it",
                          lambda: jax.distributed.initialize(initialization_timeout=deadline))
        return
    coord, count, pid = ids
    if pid == 0:
        check_port_free(int(coord.rpartition(":")[2]))
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu") or not flag:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    message = (f"process {pid} of {count}: the processes did not all join the coordinator "
               f"{coord} within runtime.init_timeout_s={timeout_s:g} s; start every process "
               f"with the same {ENV_COORDINATOR} and {ENV_COUNT}={count} and a distinct "
               f"{ENV_ID} in 0..{count - 1}, and check that the coordinator's host and port "
               "are reachable")

    def connect() -> None:
        with service_in_child():  # process 0's death then reads like any process's
            jax.distributed.initialize(coordinator_address=coord, num_processes=count,
                                       process_id=pid, initialization_timeout=deadline)

    joined_within(timeout_s, message, connect)
