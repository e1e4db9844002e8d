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

__all__ = [
    "FaultyStorage", "FileStorage", "MemoryStorage", "Storage", "StorageFactory", "StorageWriter", "fsync_dir",
    "open_storage", "register_scheme",
]
