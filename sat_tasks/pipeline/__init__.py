"""The task functions of a Training Job DAG (`steps`) and its report (`report`): backend-agnostic, no Airflow."""
