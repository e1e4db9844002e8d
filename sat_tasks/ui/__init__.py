"""The Training Jobs view: its data (`jobs`) and its API (`api`), mounted by the Airflow plugin in plugins/."""
