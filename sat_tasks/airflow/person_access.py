"""What the person who triggered a run may use, asked of Airflow's auth manager from validate_spec (issue 29.6).

Create checks the person's permissions when it starts a run (`sat_tasks.ui.security`); a run
triggered through Airflow's REST API with a crafted conf skips Create, so `validate_spec`
asks again for `dag_run.triggering_user_name` (Airflow 3): GET on the workspace's pool
`sat-workspace-<name>` and GET on the registry connection the job names (ADR 0024).

The auth manager answers for a user object, and a task has only the person's name: the
simple auth manager's people (and their roles) are its configured users
(`[core] simple_auth_manager_users`, everyone an admin with `simple_auth_manager_all_admins`);
another auth manager is asked to `deserialize_user({"sub": name})`. A person it does not
know may use nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

# dag.test() (`airflow dags test`, `sat run`, the tests) names this person: whoever runs it has the
# deployment's files and metadata DB already, so its run is the deployment's, as a scheduled one is.
DAG_TEST_PERSON = "dag_test"


@dataclass(frozen=True)
class PersonAccess:
    """The auth manager's answers for one person (`steps.PersonAccess`), asked only when a job needs them."""

    name: str

    @cached_property
    def user(self) -> Any:
        """The auth manager's user object; None: a person it does not know."""
        return find_user(self.name)

    def may_use_workspace(self, workspace: str) -> bool:
        from airflow.api_fastapi.auth.managers.models.resource_details import (
            PoolDetails,
        )

        from sat_tasks.backends.base import workspace_pool_name

        return self.user is not None and _auth_manager().is_authorized_pool(
            method="GET", details=PoolDetails(name=workspace_pool_name(workspace)), user=self.user)

    def may_use_connection(self, conn_id: str) -> bool:
        from airflow.api_fastapi.auth.managers.models.resource_details import (
            ConnectionDetails,
        )

        return self.user is not None and _auth_manager().is_authorized_connection(
            method="GET", details=ConnectionDetails(conn_id=conn_id), user=self.user)


def _auth_manager() -> Any:
    from airflow.api_fastapi.app import create_auth_manager

    return create_auth_manager()


def find_user(name: str) -> Any:
    """The auth manager's user named `name`, or None when it knows no such person."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import (
        SimpleAuthManager,
    )
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.configuration import conf

    manager = _auth_manager()
    if isinstance(manager, SimpleAuthManager):
        if conf.getboolean("core", "simple_auth_manager_all_admins", fallback=False):
            return SimpleAuthManagerUser(username=name, role="admin")
        return next((user for user in manager.get_users() if user.get_name() == name), None)
    try:
        return manager.deserialize_user({"sub": name})
    except Exception:  # noqa: BLE001 - an auth manager that cannot name the person: it may use nothing
        return None


def triggering_person(dag_run: Any) -> PersonAccess | None:
    """The person who triggered `dag_run` (the task context's), or None for a run no person triggered.

    None: a scheduled, asset-triggered or backfill run (no triggering person: the spec file's
    author is the deployment) and dag.test()'s runs (`DAG_TEST_PERSON`).
    """
    name = getattr(dag_run, "triggering_user_name", None)
    run_type = str(getattr(getattr(dag_run, "run_type", None), "value", getattr(dag_run, "run_type", "")))
    if not name or name == DAG_TEST_PERSON or run_type != "manual":
        return None
    return PersonAccess(name)
