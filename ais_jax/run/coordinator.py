"""JAX's distributed service in a child process of process 0, so that its death reads like any.

``jax.distributed.initialize`` runs the coordination service inside process 0. When process
0 died (SIGKILL, out of memory), the service died with it and every survivor's JAX client,
polling the service for errors, aborted in C++ (exit 134, a 16-line log), while the death of
any other process reached the survivors as a failed collective: one line and exit 1
(`ais_jax.run.cli`). With `service_in_child` the service runs in a child process of process 0
(started in its own session, deaf to SIGINT / SIGTERM), so that process 0's death, too,
reaches the survivors as a failed collective or barrier.

The child ends with the run: process 0's normal shutdown tells it to stop. When process 0
dies instead, the child keeps serving the survivors for up to `LINGER_S` seconds (the time
they take to reach their next collective and exit), then ends; a new process 0 of a rerun
on the same port ends a lingering child at once (`release_lingering`), so the rerun does not
wait for it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

LINGER_S = 120.0  # past JAX's default heartbeat timeout (100 s): survivors are gone by then

_CHILD = r"""
import json, os, signal, socket, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
from jax._src.lib import _jax
a = json.loads(sys.argv[1])
service = _jax.get_distributed_runtime_service(a["address"], a["num_nodes"], **a["kw"])
os.write(1, b"ready\n")
if sys.stdin.buffer.read() != b"done":  # process 0 died: serve the survivors a while
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(a["linger_name"])
        s.listen(1)
        s.settimeout(a["linger_s"])
        s.accept()  # a rerun's process 0 wants the port now
    except OSError:
        pass
service.shutdown()
"""


def linger_name(port: int) -> str:
    """The abstract socket a lingering service of ``port`` listens on."""
    return f"\0ais_jax-coordinator-lingering-{port}"


def release_lingering(port: int, wait_s: float = 5.0) -> bool:
    """End a service of ``port`` left lingering by a dead process 0 of this host.

    Returns:
      True when one was there (it is asked to end; its port is then free within ``wait_s``).
    """
    if not sys.platform.startswith("linux"):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(linger_name(port))
        except OSError:
            return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                t.bind(("0.0.0.0", port))
                break
            except OSError:
                time.sleep(0.05)
    return True


class ChildService:
    """Stands for the service object ``jax.distributed`` keeps: ``shutdown`` ends the child."""

    def __init__(self, proc: subprocess.Popen) -> None:
        """Args:
        proc: the child running the service (its stdin open for the stop word).
        """
        self.proc = proc

    def shutdown(self) -> None:
        """Tell the child to stop the service (process 0's normal shutdown) and wait for it."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(b"done")
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)


def start_child_service(address: str, num_nodes: int, **kw: Any) -> ChildService:
    """``jax._src.lib._jax.get_distributed_runtime_service``'s signature, run in a child.

    Args:
      address: the bind address (``[::]:port``).
      num_nodes: the number of processes.
      **kw: JAX's service options (heartbeat_timeout, shutdown_timeout, ...).

    Raises:
      RuntimeError: the child did not start the service (e.g. the port is taken).
    """
    port = int(address.rpartition(":")[2])
    args = {"address": address, "num_nodes": num_nodes, "linger_s": LINGER_S,
            "kw": {k: v for k, v in kw.items() if v is not None},
            "linger_name": linger_name(port)}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    if proc.stdout.readline() != b"ready\n":
        proc.kill()
        raise RuntimeError(f"the distributed service could not start on {address}")
    return ChildService(proc)


class _WithChildService:
    """Stands for the module ``jax._src.lib._jax`` in ``jax._src.distributed``, its service
    started by `start_child_service`."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        if name == "get_distributed_runtime_service":
            return start_child_service
        return getattr(self._module, name)


@contextlib.contextmanager
def service_in_child() -> Iterator[None]:
    """Within the block, ``jax.distributed.initialize`` starts its service in a child."""
    from jax._src import distributed

    module = distributed._jax
    distributed._jax = _WithChildService(module)
    try:
        yield
    finally:
        distributed._jax = module
