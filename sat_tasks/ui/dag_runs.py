"""The view's side of Airflow's metadata DB: DAG runs as `RunRef`s, and what the actions change there.

Only the API server imports this module (the plugin builds the app on its first request):
it reads and writes through the request's session, as Airflow's own routes do.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from airflow.api_fastapi.common.dagbag import get_dag_for_run, get_latest_version_of_dag
from airflow.api_fastapi.core_api.datamodels.dag_run import (
    DagRunMutableStates,
    TriggerDAGRunPostBody,
)
from airflow.api_fastapi.core_api.services.public.dag_run import patch_dag_run_state
from airflow.models.connection import Connection
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XCOM_RETURN_KEY, XComModel
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunTriggeredByType, DagRunType
from sqlalchemy import select

from sat_tasks.backends.launch import SPEC_TASK_ID
from sat_tasks.ui.create import RegistryLogin
from sat_tasks.ui.jobs import RunRef

ACTIVE = ("queued", "running")  # the DAG-run states of a job that can be stopped, or holds a workspace's nodes


def run_state(run: DagRun) -> str:
    """The DAG run's state as a word (`running`)."""
    return str(getattr(run.state, "value", run.state))


def run_ref(run: DagRun, next_run: datetime | None = None, validated: dict[str, Any] | None = None) -> RunRef:
    """The run as the view's data reads it (`validated`: its recorded job, `validated_specs`)."""
    return RunRef(dag_id=run.dag_id, run_id=run.run_id, state=run_state(run), start_date=run.start_date,
                  end_date=run.end_date, conf=dict(run.conf or {}), next_run=next_run, validated=validated)


def validated_specs(session: Any, runs: list[DagRun]) -> dict[int, dict[str, Any]]:
    """validate_spec's XCom (the job as the run's tasks use it: its results prefix, ADR 0024) by DagRun.id."""
    if not runs:
        return {}
    rows = session.execute(select(XComModel.dag_run_id, XComModel.value).where(
        XComModel.dag_run_id.in_([run.id for run in runs]), XComModel.task_id == SPEC_TASK_ID,
        XComModel.key == XCOM_RETURN_KEY, XComModel.map_index == -1)).all()
    specs = {row.dag_run_id: XComModel.deserialize_value(row) for row in rows}
    return {run_id: spec for run_id, spec in specs.items() if isinstance(spec, dict)}


def recorded_run_ref(session: Any, run: DagRun) -> RunRef:
    """The run as the view's data reads it, with the job it recorded at validate_spec."""
    return run_ref(run, validated=validated_specs(session, [run]).get(run.id))


def latest_runs(session: Any, dag_ids: set[str], *, limit: int, scheduled: set[str]) -> list[RunRef]:
    """The newest `limit` runs of `dag_ids`, with their recorded jobs; those of the `scheduled` DAGs carry
    the DAG's next run."""
    next_runs = dict(session.execute(
        select(DagModel.dag_id, DagModel.next_dagrun_create_after).where(DagModel.dag_id.in_(dag_ids))).all())
    runs = session.scalars(select(DagRun).where(DagRun.dag_id.in_(dag_ids)).order_by(DagRun.id.desc())
                           .limit(limit)).all()
    validated = validated_specs(session, list(runs))
    return [run_ref(run, next_runs.get(run.dag_id) if run.dag_id in scheduled else None, validated.get(run.id))
            for run in runs]


def active_runs(session: Any, dag_ids: set[str]) -> list[RunRef]:
    """The queued and running runs of `dag_ids`."""
    return [run_ref(run) for run in session.scalars(
        select(DagRun).where(DagRun.state.in_(ACTIVE), DagRun.dag_id.in_(dag_ids))).all()]


def find_run(session: Any, dag_id: str, run_id: str) -> DagRun | None:
    """The DAG run `run_id` of `dag_id`, or None."""
    return session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))


def training_launched(session: Any, dag_id: str, run_id: str) -> bool:
    """Whether one of the run's attempts is in its `launch` task now (the training may be running): the task
    runs, or it deferred to the triggerer while the training runs (`[sat] local_launch_watch = triggerer`)."""
    return bool(session.scalars(select(TaskInstance.task_id).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.state.in_(("running", "deferred")),
        TaskInstance.task_id.like("attempt_%.launch"))).all())


def end_run(run: DagRun, session: Any, dag_bag: Any) -> None:
    """Mark the run failed, as the Grid's "Mark as failed" does: its running tasks are stopped (on_kill)."""
    patch_dag_run_state(dag=get_dag_for_run(dag_bag, run, session=session), dag_run=run,
                        state=DagRunMutableStates.FAILED, session=session)


def start_run(dag_bag: Any, session: Any, dag_id: str, conf: dict[str, Any], *, user_name: str,
              note: str) -> DagRun:
    """Start a run of `dag_id`'s latest version with `conf`, as the REST API's trigger does (queued, by the UI)."""
    dag = get_latest_version_of_dag(dag_bag, dag_id, session)
    params = TriggerDAGRunPostBody(logical_date=None, conf=conf, note=note).validate_context(dag)
    run = dag.create_dagrun(
        run_id=params["run_id"], logical_date=params["logical_date"], data_interval=params["data_interval"],
        run_after=params["run_after"], conf=params["conf"], run_type=DagRunType.MANUAL,
        triggered_by=DagRunTriggeredByType.UI, triggering_user_name=user_name, state=DagRunState.QUEUED,
        partition_key=params.get("partition_key"), partition_date=params.get("partition_date"), session=session)
    session.flush()
    return run


def delete_run(session: Any, run: DagRun) -> None:
    """Delete the run from Airflow's history (its task instances go with it)."""
    session.delete(run)
    session.flush()


def connection_exists(session: Any, conn_id: str) -> bool:
    """Whether the Airflow connection `conn_id` exists (storing over it needs the permission to edit it)."""
    return session.scalar(select(Connection.id).where(Connection.conn_id == conn_id)) is not None


def store_registry_login(session: Any, login: RegistryLogin) -> None:
    """Create or update the Airflow connection that holds a created job's registry login (Fernet-encrypted)."""
    extra = json.dumps({"insecure": True}) if login.insecure else None
    conn = session.scalar(select(Connection).where(Connection.conn_id == login.conn_id))
    if conn is None:
        session.add(Connection(conn_id=login.conn_id, conn_type="generic", host=login.host, login=login.login,
                               password=login.password, extra=extra,
                               description="registry login of a Training Job, from the Create Training Job form"))
        return
    conn.host, conn.login, conn.password = login.host, login.login, login.password
    conn.set_extra(extra)
