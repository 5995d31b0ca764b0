"""The in-memory GCS emulator of the ``gs://`` tests (``gcp-storage-emulator``, the test extra).

`start_emulator` runs it on a free loopback port and points the standard variables at it
(``STORAGE_EMULATOR_HOST`` for gcsfs, ``TENSORSTORE_GCS_HTTP_URL`` and
``GOOGLE_AUTH_TOKEN_FOR_TESTING`` for TensorStore / orbax); subprocesses inherit them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

ENV = (
    "STORAGE_EMULATOR_HOST",
    "TENSORSTORE_GCS_HTTP_URL",
    "GOOGLE_AUTH_TOKEN_FOR_TESTING",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
)


# the emulator with x-goog-generation on downloads and ifGenerationMatch=0 on uploads
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_gcs_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_emulator(
    port: int | None = None, data_dir: str | None = None
) -> tuple[subprocess.Popen, str]:
    """Start the emulator, in memory or (``data_dir``) keeping its objects in that folder, so
    that one started again on the same folder and port serves them again; returns
    ``(process, http://127.0.0.1:PORT)`` once it answers, the variables set in ``os.environ``."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    where = ["--in-memory"] if data_dir is None else []
    proc = subprocess.Popen(
        [
            sys.executable,
            SERVER,
            *(["--data-dir", data_dir] if data_dir else []),
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *where,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the GCS emulator did not start") from None
            time.sleep(0.1)
    os.environ.update(
        {
            "STORAGE_EMULATOR_HOST": url,
            "TENSORSTORE_GCS_HTTP_URL": url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",
            # gcsfs's bucket-type probe speaks gRPC, which the emulator lacks
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }
    )
    return proc, url


def make_bucket(url: str, name: str) -> str:
    """Create bucket ``name`` in the emulator at ``url``; returns ``gs://name``."""
    import json

    req = urllib.request.Request(
        f"{url}/storage/v1/b?project=test",
        method="POST",
        data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()
    return f"gs://{name}"


def refuse(url: str, bucket: str, code: int | None, writes_only: bool = False) -> None:
    """Make the emulator at ``url`` answer every request on ``bucket`` (or every write) with
    ``code`` (403: permission denied, 401: no usable credentials), or serve it again (None)."""
    name = bucket.removeprefix("gs://")
    tail = "/writes" if writes_only else ""
    req = urllib.request.Request(
        f"{url}/_ais/refuse/{name}/{code or 403}{tail}",
        method="DELETE" if code is None else "POST",
    )
    urllib.request.urlopen(req, timeout=10).read()
