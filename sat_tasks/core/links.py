"""The address of a run's page in the Training Jobs view, spelled as Airflow's navigation keeps it.

Airflow's embedded view (its plugin page) follows the frame: on each load it copies the frame's
address into its own route, and when its route changes it rebuilds the frame's address from the
route's *decoded* path and loads the frame again if the two differ. A run ID's ':' and '+'
percent-encoded (``%3A``, ``%2B``) made them differ: seconds after a job page opened inside
Airflow it was loaded again, losing what the page showed (a refused tag edit, what was typed).
A path segment may hold these characters literally (RFC 3986: sub-delims, ':' and '@'), browsers
keep them as they are, and Starlette's path parameters read them the same; everything else is
still encoded ('/', '%', '?', '#', spaces, quotes, non-ASCII).
"""

from __future__ import annotations

from urllib.parse import quote

SEGMENT_SAFE = ":@+,;=!$*()"


def path_segment(value: str) -> str:
    """One path segment: reserved characters encoded, those a segment may hold kept literal."""
    return quote(value, safe=SEGMENT_SAFE)


def job_page_path(dag_id: str, run_id: str) -> str:
    """The run's page in the Training Jobs view (a path on the API server)."""
    return f"/sat/jobs/{path_segment(dag_id)}/runs/{path_segment(run_id)}"


#: The view's entries in Airflow's navigation (the plugin's `external_views`): (name, href, url_route).
#: Inside Airflow a page shows under `/plugin/<url_route><its own path>`; a page that belongs to one
#: entry moves Airflow's navigation there when it was reached from another (`airflow_view.js`).
AIRFLOW_VIEWS: tuple[tuple[str, str, str], ...] = (
    ("Training Jobs", "/sat/jobs", "training-jobs"),
    ("Create Training Job", "/sat/jobs/new", "create-training-job"),
    ("Workspaces", "/sat/workspaces", "workspaces"),
    ("Nodes", "/sat/nodes", "nodes"),
)
#: The entries that open a form rather than a place: Airflow's menu lists them, the view's own top
#: links do not (the list page has the button).
FORM_VIEWS = frozenset({"create-training-job"})


MAX_RUN_REF = 500  # characters of one `<dag_id>/<run_id>` a request may name (compare, bulk actions)


def split_run_ref(value: str) -> tuple[str, str] | None:
    """`(dag_id, run_id)` of `<dag_id>/<run_id>` (a DAG id holds no `/`); None when it is not one, or too long."""
    dag_id, slash, run_id = value.partition("/")
    if not slash or not dag_id or not run_id or len(value) > MAX_RUN_REF:
        return None
    return dag_id, run_id
