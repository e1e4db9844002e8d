"""The planner decides what a checkpoint saves without threads, buffers or a file system."""

from __future__ import annotations

import pytest
import torch

from ckpt_engine.contract import TMP_PREFIX
from ckpt_engine.formats import BytesFile
from ckpt_engine.planner import (
    GIB,
    check_options,
    host_buffer_bytes,
    plan_save,
    plan_state,
    retention,
    temp_dir_name,
)


def test_state_plans_one_file_per_key_by_kind() -> None:
    """Flat tensor dicts become safetensors, anything else a torch file; every tensor byte is a blob."""
    model = {"w": torch.zeros(4, 3), "b": torch.zeros(3, dtype=torch.bfloat16)}
    optimizer = {"state": {0: {"exp_avg": torch.zeros(5)}}, "param_groups": [{"lr": 0.1}]}
    files, keys = plan_state({"model": model, "optimizer": optimizer, "extra.v1": {"epoch": 3}})
    assert keys == {"model": "model.safetensors", "optimizer": "optimizer.pt", "extra.v1": "extra.v1.pt"}
    assert [plan.name for plan in files] == ["model.safetensors", "optimizer.pt", "extra.v1.pt"]
    assert [plan.payload_bytes for plan in files] == [4 * 3 * 4 + 3 * 2, 5 * 4, 0]


@pytest.mark.parametrize("key", [pytest.param("a/b", id="slash"), pytest.param("", id="empty"),
                                 pytest.param(3, id="not-a-string"), pytest.param("x y", id="space")])
def test_state_keys_that_cannot_be_file_names_are_refused(key: object) -> None:
    with pytest.raises(ValueError, match="becomes a file name"):
        plan_state({key: {"w": torch.zeros(1)}})


def test_save_plan_holds_a_copy_of_the_metadata_and_sums_the_payload() -> None:
    metadata = {"keys": {"model": "model.safetensors"}}
    files, _ = plan_state({"model": {"w": torch.zeros(10)}})
    plan = plan_save(7, [*files, BytesFile("args.json", data=b"{}")], temp_dir=temp_dir_name(7, "abcd1234"),
                     layout="state", metadata=metadata)
    metadata["keys"] = {}
    assert plan.metadata == {"keys": {"model": "model.safetensors"}}
    assert (plan.step, plan.layout, plan.temp_dir) == (7, "state", f"{TMP_PREFIX}7-abcd1234")
    assert plan.payload_bytes == 40  # the json file's bytes do not pass through the host buffers
    assert plan_save(1, [], temp_dir="t").metadata == {}


def test_host_buffer_budget_is_gib() -> None:
    assert host_buffer_bytes(1.0) == GIB
    assert host_buffer_bytes(0.5) == GIB // 2
    assert host_buffer_bytes(64 / 1024) == 64 << 20


@pytest.mark.parametrize("options", [
    pytest.param({"on_error": "ignore"}, id="on-error"),
    pytest.param({"parser_threads": 0}, id="no-writer"),
    pytest.param({"max_in_flight": 0}, id="no-slot"),
    pytest.param({"keep_last": -1}, id="negative-retention"),
    pytest.param({"host_cache_size": 0}, id="no-host-buffers"),
])
def test_unworkable_options_are_refused(options: dict[str, object]) -> None:
    defaults: dict[str, object] = {"on_error": "continue", "parser_threads": 1, "max_in_flight": 1, "keep_last": 3,
                                   "host_cache_size": 1.0}
    check_options(**defaults)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        check_options(**{**defaults, **options})  # type: ignore[arg-type]


@pytest.mark.parametrize(("committed", "keep_last", "newest", "protected", "kept", "deleted"), [
    pytest.param([5, 4, 3, 2, 1], 2, 5, set(), [5, 4], [3, 2, 1], id="keep-the-highest"),
    pytest.param([5, 4, 3, 2, 1], 0, 5, set(), [5, 4, 3, 2, 1], [], id="zero-keeps-all"),
    pytest.param([5, 4, 3, 2, 1], 2, 5, {2, 9}, [5, 4, 2], [3, 1], id="protected-if-committed"),
    # a resumed run commits a step below older ones: it is kept though not among the highest
    pytest.param([9, 8, 3], 2, 3, set(), [9, 8, 3], [], id="newest-always-kept"),
])
def test_retention(committed: list[int], keep_last: int, newest: int, protected: set[int], kept: list[int],
                   deleted: list[int]) -> None:
    assert retention(committed, keep_last=keep_last, newest=newest, protected=protected) == (kept, deleted)
