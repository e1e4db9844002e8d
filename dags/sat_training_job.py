"""Airflow DAG file: the generic Training Job DAG: its trigger form is the "Create Training Job" page in the UI.

Trigger it with the form (sections Job, Compute, Container image, Data and results,
Advanced) or with `sat run SPEC.yaml`, which fills the same form from a spec file.
"""

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID, build_job_dag
from sat_tasks.airflow.params import generic_params

dag = build_job_dag(None, dag_id=GENERIC_DAG_ID, params=generic_params(), doc_md=__doc__, fileloc=__file__)
