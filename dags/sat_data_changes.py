"""Airflow DAG file: watches the data prefixes that asset-scheduled job specs name, and emits their Asset events.

No asset-scheduled spec: this file defines no DAG.
"""

from sat_tasks.airflow.job_dags import load_job_dags
from sat_tasks.airflow.watch import WATCH_DAG_ID, build_watch_dag
from sat_tasks.config import sat_setting

_dag = build_watch_dag(list(load_job_dags(sat_setting("jobs_dir"), build=False).jobs.values()), fileloc=__file__)
if _dag is not None:
    globals()[WATCH_DAG_ID] = _dag
