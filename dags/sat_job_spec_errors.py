"""Airflow DAG file: report job spec files that break a rule as an Airflow import error (one line per problem).

Airflow keys import errors by DAG file; this file exists so that a bad spec shows up in
"DAG Import Errors" with `<spec file>: <field>: <rule>` lines while `sat_jobs.py` keeps
every good spec's DAG loaded. No bad spec: nothing is raised and this file defines no DAG.
"""

from sat_tasks.airflow.job_dags import load_job_dags
from sat_tasks.config import sat_setting
from sat_tasks.spec import SpecFileErrors

_errors = load_job_dags(sat_setting("jobs_dir"), build=False).errors
if _errors:
    raise SpecFileErrors(_errors)
