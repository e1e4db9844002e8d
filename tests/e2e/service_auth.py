"""The service e2e's auth manager: per-DAG refusals for `outsider` in the real API server (issue 29).

The simple auth manager that `make up` runs has global roles only (viewer, user, op, admin):
nobody there lacks one DAG's permissions. Deployments with per-DAG permissions (FAB, Keycloak)
answer `is_authorized_dag` per DAG id; `tests.support.dag_scoped_auth.DagScopedAuthManager`
does so for the in-process API tests, and this subclass adds the e2e's own job DAG, so the
deployment's API server, its `/sat` routes and Airflow's own REST API meet a real "no".
The components import it by name (`[core] auth_manager`): the repository root is on their
`PYTHONPATH`.
"""

from __future__ import annotations

from tests.support.dag_scoped_auth import DagScopedAuthManager

OUTSIDER = "outsider"
# user name -> DAG ids that user may not touch (read or write), besides DagScopedAuthManager's
DENIED: dict[str, set[str]] = {OUTSIDER: {"svc-tenancy"}}


class ServiceDagScopedAuthManager(DagScopedAuthManager):
    """DagScopedAuthManager that also says no to the (user, DAG) pairs in `DENIED`."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        if details is not None and details.id in DENIED.get(user.get_name(), set()):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
