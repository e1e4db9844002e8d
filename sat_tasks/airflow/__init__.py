"""The Airflow face of SAT: the DAG factory, the generic DAG's form, and loading job DAGs from spec files.

`airflow.sdk` is imported here (and by the backends' launch operators), nowhere below.
"""
