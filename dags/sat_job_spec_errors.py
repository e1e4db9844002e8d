"""Airflow DAG file: report job spec files that break a rule as an Airflow import error (one line per problem).

Airflow keys import errors by DAG file; this file exists so that a bad spec shows up in
"DAG Import Errors" with `<spec file>: <field>: <rule>` lines while the `sat_jobs_NN.py` files
keep every good spec's DAG loaded. It also names the specs a SAT DAG file (this one included)
left out of its last pass because it ran out of its parse budget (ADR 0023). All is well:
nothing is raised and this file defines no DAG.
"""

import time

_started = time.monotonic()  # the file's parse budget counts from here

from sat_tasks.airflow.job_dags import spec_problems
from sat_tasks.airflow.parse_budget import parse_budget
from sat_tasks.config import sat_setting

_problems = spec_problems(sat_setting("jobs_dir"), parse_budget(__file__, _started), fileloc=__file__)
if _problems is not None:
    raise _problems
