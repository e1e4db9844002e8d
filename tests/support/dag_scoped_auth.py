"""An auth manager with per-DAG permissions for the tests: Airflow's simple one, minus the DAGs a user may not see.

The simple auth manager's roles are global (viewer, user, op, admin); deployments with
per-DAG permissions (FAB, Keycloak) answer `is_authorized_dag` per DAG id. This one does
the same for the users listed in `DENIED`, so the Training Jobs view's per-DAG checks
meet a real "no" from the auth manager.
"""

from __future__ import annotations

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import (
    SimpleAuthManager,
)

# user name -> DAG ids that user may not touch (read or write)
DENIED: dict[str, set[str]] = {"outsider": {"tiny-llama-demo"}}


class DagScopedAuthManager(SimpleAuthManager):
    """SimpleAuthManager whose `is_authorized_dag` also says no to the (user, DAG) pairs in `DENIED`."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        if details is not None and details.id in DENIED.get(user.get_name(), set()):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
