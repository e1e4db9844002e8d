"""Airflow plugin: the Training Jobs API under /sat in Airflow's API server (its logic lives in sat_tasks.ui)."""

from airflow.plugins_manager import AirflowPlugin

from sat_tasks.ui.api import LazyApp, create_app


class SatTrainingJobsPlugin(AirflowPlugin):
    name = "sat_training_jobs"
    fastapi_apps = [{"app": LazyApp(create_app), "url_prefix": "/sat", "name": "SAT Training Jobs"}]
    # "Training Jobs" in Airflow's navigation: the list, shown inside the UI.
    external_views = [{"name": "Training Jobs", "href": "/sat/jobs", "destination": "nav",
                       "url_route": "training-jobs", "nav_top_level": True}]
