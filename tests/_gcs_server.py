"""``python tests/_gcs_server.py start ...``: gcp-storage-emulator with two GCS behaviours it
lacks and the runs rely on, added in this process only:

* downloads carry ``x-goog-generation``: without it TensorStore reads an object's generation
  as 0 and its next conditional write (OCDBT's manifest, as orbax saves) fails with
  "Malformed StorageGeneration";
* uploads honour ``ifGenerationMatch=0`` (create only if absent): 412 when the object exists,
  as GCS answers (the run lock relies on it).
"""

from __future__ import annotations

import sys
import threading
from http import HTTPStatus

from gcp_storage_emulator import storage as storage_mod
from gcp_storage_emulator.handlers import objects

_local = threading.local()
_download, _insert = objects.download, objects.insert
_create_file = storage_mod.Storage.create_file


class _ExistsError(Exception):
    pass


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


objects.download, objects.insert = download, insert
storage_mod.Storage.create_file = create_file

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main  # imports the routes: after the patches

    main(sys.argv[1:])
