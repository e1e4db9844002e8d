"""Exceptions raised by the checkpoint engine."""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class of every error the checkpoint engine raises."""


class ConfigError(CheckpointError, ValueError):
    """A runtime_config key is unknown or one of its values is invalid."""


class StorageError(CheckpointError, OSError):
    """A storage backend could not read, write or rename something."""


class UnsupportedSchemeError(StorageError):
    """No storage backend is registered for the URL's scheme."""


class PersistError(CheckpointError):
    """Writing or committing a checkpoint failed; the previous checkpoint is untouched."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint is incomplete or fails verification against its manifest."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No complete, verified checkpoint matches the request."""


class UnreadableCheckpointError(CorruptCheckpointError):
    """A checkpoint file is not in a format this engine reads (another engine's, truncated, or from a newer SAT)."""


class NotCommittedError(CheckpointError, FileNotFoundError):
    """A checkpoint is still being written (or its save failed): it has no manifest yet."""
