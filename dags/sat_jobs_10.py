"""Airflow DAG file: the Training Job DAGs of the job specs in shard 10 (one DAG per include/jobs/*.yaml).

The specs are spread over sixteen files alike, `sat_jobs_00.py` .. `sat_jobs_15.py`, by a stable hash
of the spec file's name (ADR 0023), so each file parses within the DAG processor's limits. A file
that runs out of its parse budget logs the specs it skipped, and `sat_job_spec_errors.py` shows
them as an import error; a bad spec yields no DAG here and is reported there too.
"""

import time

_started = time.monotonic()  # the file's parse budget counts from here

from sat_tasks.airflow.job_dag_file import shard_dags
from sat_tasks.config import sat_setting

globals().update(shard_dags(__file__, sat_setting("jobs_dir"), _started))
