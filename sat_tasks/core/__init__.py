"""The core of a Training Job run: status, attempt record, the typed task contracts and the restart policy.

Pure Python: nothing here talks to Object Storage, a cluster or Airflow.
"""
