"""Airflow's concurrency follows the local pool (issue 45.5): `[core] parallelism = 4` below 5 nodes hid every node-slot
wait behind an unexplained Airflow queue. `sat up`'s components get limits sized from the nodes and their slots; an
operator's own value stands."""

from __future__ import annotations

import configparser

import pytest

from sat_tasks.backends.local.pool import NodePool, airflow_concurrency
from sat_tasks.service.concurrency import sized_env
from sat_tasks.service.stack import ServiceStack
from tests.support.paths import REPO

KEYS = ("AIRFLOW__CORE__PARALLELISM", "AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG", "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG")


@pytest.mark.parametrize(("nodes", "slots", "workspace_nodes"), [(1, 1, 0), (3, 1, 0), (5, 1, 0), (5, 2, 0), (5, 1, 2),
                                                                  (40, 1, 0)])
def test_the_limits_follow_the_nodes_and_their_slots(nodes, slots, workspace_nodes):
    sized = airflow_concurrency(NodePool(tuple(f"n{i}" for i in range(nodes)), slots), workspace_nodes)
    attempts = nodes * slots + workspace_nodes
    assert sized.attempts == attempts
    # every slot held by a launch and an attempt waiting in line on the board behind each, with workers to spare
    assert sized.max_active_runs_per_dag == 2 * attempts
    assert sized.parallelism == 2 * attempts + 4 > sized.max_active_runs_per_dag >= attempts
    assert sized.max_active_tasks_per_dag >= 4


def _env(tmp_path, **sat) -> dict[str, str]:
    cfg = tmp_path / "airflow.cfg"
    if not cfg.exists():
        cfg.write_text("[core]\nexecutor = LocalExecutor\n")
    return {"AIRFLOW_CONFIG": str(cfg), "AIRFLOW__SAT__BACKEND": "local",
            "AIRFLOW__SAT__WORKSPACES_DIR": str(tmp_path / "no-workspaces"),
            **{f"AIRFLOW__SAT__{key.upper()}": value for key, value in sat.items()}}


def test_sat_ups_components_get_the_limits_of_the_pool_they_configure(tmp_path):
    five = sized_env(_env(tmp_path, local_nodes="a,b,c,d,e"))
    assert five == {KEYS[0]: "14", KEYS[1]: "10", KEYS[2]: "16"}
    assert int(five[KEYS[0]]) > 5  # the bug: 4 workers for 5 nodes
    three_by_two = sized_env(_env(tmp_path, local_nodes="a,b,c", local_node_slots="2"))
    assert three_by_two[KEYS[0]] == "16" and three_by_two[KEYS[1]] == "12"
    env = ServiceStack(home=tmp_path / "home", extra_env={
        "AIRFLOW__SAT__LOCAL_NODES": "a,b,c,d,e,f,g", "AIRFLOW__SAT__WORKSPACES_DIR": str(tmp_path / "none")}
    ).environment()
    assert (env[KEYS[0]], env[KEYS[1]]) == ("18", "14")  # as the components read the pool: their own environment


def test_a_workspaces_nodes_count_too(tmp_path):
    defs = tmp_path / "no-workspaces"
    defs.mkdir()
    (defs / "team-a.yaml").write_text("name: team-a\nresources: {server_type: cpu, gpus_per_node: 0}\nnodes: 3\n"
                                      "contract: {start: '2026-01-01', end: '2099-12-31'}\n")
    assert sized_env(_env(tmp_path, local_nodes="a,b"))[KEYS[0]] == str(2 * 5 + 4)


def test_an_operators_own_values_stand_and_another_backend_is_left_alone(tmp_path):
    assert KEYS[0] not in sized_env({**_env(tmp_path, local_nodes="a,b,c,d,e"), KEYS[0]: "64"})
    (tmp_path / "airflow.cfg").write_text("[core]\nmax_active_runs_per_dag = 3\n")
    kept = sized_env(_env(tmp_path, local_nodes="a,b,c,d,e"))
    assert KEYS[1] not in kept and kept[KEYS[0]] == "14"
    assert sized_env(_env(tmp_path, local_nodes="a,b", backend="kubernetes")) == {}


def test_the_shipped_config_leaves_the_limits_to_sat_up():
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read(REPO / "airflow.cfg")
    assert not {"parallelism", "max_active_runs_per_dag", "max_active_tasks_per_dag"} & set(parser.options("core"))


def test_the_generic_dag_runs_as_many_runs_as_airflow_is_told(monkeypatch):
    from sat_tasks.airflow.dag_factory import build_job_dag

    monkeypatch.setenv("AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG", "14")
    assert build_job_dag(None, dag_id="sat_generic_sized").max_active_runs == 14
