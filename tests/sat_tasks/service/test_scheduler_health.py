"""`sat up`'s one scheduler does not reset its own running tasks when a burst slows its loop (issue 48).

Under 50 submissions at once on 2 cores the scheduler's heartbeat lagged 30-80 s; at Airflow's default
`[scheduler] scheduler_health_check_threshold` of 30 s its orphan check marked that scheduler itself failed and reset
the 9 tasks it had running (each killed, "TaskInstance not in live table but archived in history", and run again).
The components get a threshold above that lag; an operator's own value stands. The burst itself:
tests/e2e/test_service_burst.py (slow).
"""

from __future__ import annotations

from sat_tasks.service.concurrency import SCHEDULER_HEALTH_CHECK_THRESHOLD_S, scheduler_env
from sat_tasks.service.stack import ServiceStack

KEY = "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD"


def _config(tmp_path, text: str = "[core]\nexecutor = LocalExecutor\n") -> dict[str, str]:
    cfg = tmp_path / "airflow.cfg"
    cfg.write_text(text)
    return {"AIRFLOW_CONFIG": str(cfg)}


def test_the_components_get_a_threshold_above_the_lag_a_burst_caused(tmp_path):
    assert SCHEDULER_HEALTH_CHECK_THRESHOLD_S >= 2 * 80  # the longest lag measured, twice over
    assert scheduler_env(_config(tmp_path)) == {KEY: str(SCHEDULER_HEALTH_CHECK_THRESHOLD_S)}
    env = ServiceStack(home=tmp_path / "home", extra_env={"AIRFLOW__SAT__WORKSPACES_DIR": str(tmp_path / "none")}
                       ).environment()
    assert env[KEY] == str(SCHEDULER_HEALTH_CHECK_THRESHOLD_S)  # what every component reads


def test_an_operators_own_threshold_stands(tmp_path):
    assert scheduler_env({**_config(tmp_path), KEY: "45"}) == {}
    assert scheduler_env(_config(tmp_path, "[scheduler]\nscheduler_health_check_threshold = 45\n")) == {}
    env = ServiceStack(home=tmp_path / "home", extra_env={KEY: "45", "AIRFLOW__SAT__WORKSPACES_DIR": str(
        tmp_path / "none")}).environment()
    assert env[KEY] == "45"
