"""Backends: where training runs. One subpackage per `BackendKind` value, each exporting `BACKEND` (a Backend).

`get_backend("kubernetes")` imports `sat_tasks.backends.kubernetes` only when asked, so a
DAG on the local backend never imports the Kubernetes provider. A third backend is a
third subpackage (and a `BackendKind` value): nothing above this package changes.
"""

from __future__ import annotations

import importlib

from sat_tasks.backends.base import Backend, Capacity, DataCheck
from sat_tasks.config import sat_setting
from sat_tasks.spec import BackendKind, TrainingJob

__all__ = ["Backend", "Capacity", "DataCheck", "backend_for", "get_backend"]


def get_backend(kind: BackendKind | str) -> Backend:
    """The backend serving `kind` (`local`, `kubernetes`)."""
    kind = BackendKind(kind)
    module = importlib.import_module(f"{__name__}.{kind.value}")
    return module.BACKEND


def backend_for(job: TrainingJob | None) -> Backend:
    """The backend of a job: its spec's `backend`, else `[sat] backend` (the generic DAG: the config's)."""
    if job is not None and job.backend is not None:
        return get_backend(job.backend)
    return get_backend(sat_setting("backend"))
