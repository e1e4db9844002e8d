"""Airflow DAG file: one DAG per Training Job spec in include/jobs/*.yaml (generated at parse time).

A spec that breaks a rule yields no DAG here; `sat_job_spec_errors.py` turns its problems
into an import error that names the file, and the other DAGs still load.
"""

from sat_tasks.airflow.job_dags import load_job_dags
from sat_tasks.config import sat_setting

_jobs = load_job_dags(sat_setting("jobs_dir"), fileloc=__file__)
globals().update(_jobs.dags)
