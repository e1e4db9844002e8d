"""The core of a Training Job run: status, attempt record, the typed hand-offs between tasks (handoffs.py) and the restart policy.

Pure Python: nothing here talks to Object Storage, a cluster or Airflow.
"""
