"""``python tests/_gcs_server.py start ...``: gcp-storage-emulator with two GCS behaviours it
lacks and the runs rely on, added in this process only:

* downloads carry ``x-goog-generation``: without it TensorStore reads an object's generation
  as 0 and its next conditional write (OCDBT's manifest, as orbax saves) fails with
  "Malformed StorageGeneration";
* uploads honour ``ifGenerationMatch=0`` (create only if absent): 412 when the object exists,
  as GCS answers (the run lock relies on it);
* a refused bucket (`refuse` in tests/_gcs.py: ``POST /_ais/refuse/<bucket>/<code>``, undone
  by ``DELETE``) answers every request with GCS's 403 (the account lacks the permission) or
  401 (no usable credentials), as GCS does when access is revoked or the token is missing:
  the runs' one-line errors for both, end to end.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from http import HTTPStatus

from gcp_storage_emulator import storage as storage_mod
from gcp_storage_emulator.handlers import objects

_local = threading.local()
_download, _insert = objects.download, objects.insert
_create_file = storage_mod.Storage.create_file
_CONTROL = re.compile(r"/_ais/refuse/([^/]+)/(401|403)(/writes)?")
_BUCKET = re.compile(r"/b/([^/?]+)")
_MESSAGES = {
    401: "Anonymous caller does not have storage.objects.get access to the bucket",
    403: "the caller does not have storage.objects.create access to the bucket",
}
_refused: dict[str, tuple[int, bool]] = {}  # bucket -> (the status it answers, writes only)


class _ExistsError(Exception):
    pass


def _answer(h, code: int, obj: dict) -> None:
    body = json.dumps(obj).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def download(request, response, storage, *args, **kwargs):
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
    except Exception:  # a missing object: the handler answers 404 itself
        pass
    return _download(request, response, storage, *args, **kwargs)


def insert(request, response, storage, *args, **kwargs):
    _local.create_only = request.query.get("ifGenerationMatch", [None])[0] == "0"
    try:
        return _insert(request, response, storage, *args, **kwargs)
    except _ExistsError:
        response.status = HTTPStatus.PRECONDITION_FAILED
        response.json({"error": {"code": 412, "message": "Precondition Failed"}})
    finally:
        _local.create_only = False


def create_file(self, bucket_name, file_name, content, file_obj, file_id=None):
    if getattr(_local, "create_only", False):
        try:
            self.get_file_obj(bucket_name, file_name)
        except Exception:
            pass
        else:
            raise _ExistsError(file_name)
    return _create_file(self, bucket_name, file_name, content, file_obj, file_id)


def handle(self, method):
    h = self._request_handler
    control = _CONTROL.fullmatch(h.path)
    if control is not None:  # the tests' switch
        name, code = control.group(1), int(control.group(2))
        if method == "DELETE":
            _refused.pop(name, None)
        else:
            _refused[name] = (code, control.group(3) is not None)
        return _answer(h, 200, {})
    bucket = _BUCKET.search(h.path)
    code, writes_only = _refused.get(bucket.group(1), (None, False)) if bucket else (None, 0)
    if code is None or (writes_only and method == "GET"):
        return _handle(self, method)
    h.rfile.read(int(h.headers.get("content-length") or 0))  # the upload's body, unread
    return _answer(h, code, {"error": {"code": code, "message": _MESSAGES[code]}})


objects.download, objects.insert = download, insert
storage_mod.Storage.create_file = create_file
# the routes keep the handlers they were given when imported: only after the patches above
from gcp_storage_emulator import server as server_mod  # noqa: E402

_handle, server_mod.Router.handle = server_mod.Router.handle, handle

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main  # imports the routes: after the patches

    main(sys.argv[1:])
