"""Airflow DAG file: watches the data prefixes that asset-scheduled job specs name, and emits their Asset events.

No asset-scheduled spec: this file defines no DAG. Only the spec files whose text may say
`asset:` are validated here, within the file's parse budget (ADR 0023).
"""

import time

_started = time.monotonic()  # the file's parse budget counts from here

from sat_tasks.airflow.job_dags import asset_scheduled_jobs
from sat_tasks.airflow.parse_budget import parse_budget
from sat_tasks.airflow.watch import WATCH_DAG_ID, build_watch_dag
from sat_tasks.config import sat_setting

_jobs = asset_scheduled_jobs(sat_setting("jobs_dir"), __file__, parse_budget(__file__, _started))
_dag = build_watch_dag(_jobs, fileloc=__file__)
if _dag is not None:
    globals()[WATCH_DAG_ID] = _dag
