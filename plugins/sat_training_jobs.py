"""Airflow plugin: the Training Jobs view and API under /sat in Airflow's API server (its logic lives in sat_tasks.ui)."""

from airflow.plugins_manager import AirflowPlugin

from sat_tasks.core.links import AIRFLOW_VIEWS
from sat_tasks.ui.lazy import LazyApp


class SatTrainingJobsPlugin(AirflowPlugin):
    name = "sat_training_jobs"
    # Built on its first request (sat_tasks.ui.app.create_app): task processes load this plugin too.
    fastapi_apps = [{"app": LazyApp("sat_tasks.ui.app:create_app"), "url_prefix": "/sat",  # noqa: RUF012
                     "name": "SAT Training Jobs"}]  # Airflow reads these class attributes; nothing mutates them
    # In Airflow's navigation, shown inside the UI: the list (with its Create button), the Create form,
    # the Workspaces and the Nodes.
    external_views = [{"name": name, "href": href, "destination": "nav", "url_route": route,  # noqa: RUF012
                       "nav_top_level": True} for name, href, route in AIRFLOW_VIEWS]
