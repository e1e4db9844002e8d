"""The view's routes, one APIRouter per resource: `jobs` (the list, Create), `runs` (a job page and its actions), `workspaces`."""
