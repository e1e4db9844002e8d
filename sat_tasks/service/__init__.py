"""SAT as a running service on this host (`make up`): the Airflow components, the embedded Object Storage, and their secrets."""
