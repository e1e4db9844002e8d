"""SAT task library: everything a Training Job DAG task does, testable without a scheduler."""
