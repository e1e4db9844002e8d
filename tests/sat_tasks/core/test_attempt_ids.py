"""The one parse of an attempt group's task ids (the DAG, the CLI's progress lines and pod labels use it)."""

import pytest

from sat_tasks.core.attempt import attempt_group_id, attempt_in_task_id


@pytest.mark.parametrize("k", [1, 2, 7, 12])
def test_round_trip_of_the_group_id(k):
    assert attempt_in_task_id(f"{attempt_group_id(k)}.launch") == (k, "launch")
    assert attempt_in_task_id(f"{attempt_group_id(k)}.launch_rank_1") == (k, "launch_rank_1")


@pytest.mark.parametrize("task_id", [
    "upload_results",          # outside the groups
    "attempt_1",               # the group, not a task in it
    "attempt_1.",              # no task
    "attempt_.launch",         # no number
    "attempt_x1.launch",       # not a number
    "attempt_-1.launch",       # not a plain number
    "attempts_1.launch",       # another prefix
    "stage.attempt_1.launch",  # a group of another name around it
    "",
])
def test_near_misses_are_not_attempt_tasks(task_id):
    assert attempt_in_task_id(task_id) is None
