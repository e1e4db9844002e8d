"""Backends: where training runs. Each is a package exporting `BACKEND` (a Backend), named by a `sat.backends` entry point.

`get_backend("kubernetes")` imports the Kubernetes backend only when asked, so a DAG on the
local backend never imports the Kubernetes provider. Adding a backend (ADR 0010): a
package with `BACKEND` and its `capabilities`, an entry point in the `sat.backends` group,
and the conformance suite (`tests/sat_tasks/backends/test_conformance.py`) green; nothing
above this package changes. A subpackage of this one is found without its entry point too
(a checkout whose install predates the entry point).
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from sat_tasks.backends.base import Backend, BackendCapabilities, Capacity, DataCheck
from sat_tasks.config import sat_setting
from sat_tasks.spec import TrainingJob
from sat_tasks.spec.model import BACKENDS_ENTRY_POINTS, BackendKind, installed_backends

__all__ = ["Backend", "BackendCapabilities", "Capacity", "DataCheck", "backend_for", "get_backend",
           "installed_backends"]


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {entry.name: entry for entry in entry_points(group=BACKENDS_ENTRY_POINTS)}


def get_backend(kind: BackendKind | str) -> Backend:
    """The backend installed as `kind` (`local`, `kubernetes`, ...): its entry point's object, else `<this package>.<kind>.BACKEND`."""
    name = BackendKind(kind).value  # ValueError for a name nothing installs
    entry = _entry_points().get(name)
    if entry is not None:
        return entry.load()
    return importlib.import_module(f"{__name__}.{name}").BACKEND


def backend_for(job: TrainingJob | None) -> Backend:
    """The backend of a job: its spec's `backend`, else `[sat] backend` (the generic DAG: the config's)."""
    if job is not None and job.backend is not None:
        return get_backend(job.backend)
    return get_backend(sat_setting("backend"))
