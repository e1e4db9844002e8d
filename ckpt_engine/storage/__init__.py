"""Where checkpoints are written: a small interface (`base`) and backends chosen by URL scheme.

`file.FileStorage` (``file://``), `s3.S3Storage` (``s3://``, the mirror), and the test doubles
in `testing` (``memory://``, `FaultyStorage`). SDKs are imported by the backend that needs them.
"""

from ckpt_engine.storage.base import (
    Storage,
    StorageFactory,
    StorageWriter,
    open_storage,
    register_scheme,
)
from ckpt_engine.storage.file import FileStorage, fsync_dir
from ckpt_engine.storage.testing import FaultyStorage, MemoryStorage


def _file_factory(url: str) -> Storage:
    return FileStorage(url.removeprefix("file://"))


def _s3_factory(url: str) -> Storage:
    from ckpt_engine.storage.s3 import S3Storage  # boto3 itself is imported when the first request is made

    return S3Storage(url)


register_scheme("file", _file_factory)
register_scheme("memory", lambda url: MemoryStorage.named(url[len("memory://"):]))
register_scheme("s3", _s3_factory)

__all__ = [
    "FaultyStorage", "FileStorage", "MemoryStorage", "Storage", "StorageFactory", "StorageWriter", "fsync_dir",
    "open_storage", "register_scheme",
]
