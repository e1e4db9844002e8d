"""`sat up` supervises its components: one that exits is restarted with backoff; one that keeps failing stops the service.

Stand-in components (a sleeping or an exiting Python) under `ServiceStack`'s own supervisor; the
real service's DAG processor is killed and restarted in tests/e2e/test_service_supervision.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from sat_tasks.service import stack as stack_module
from sat_tasks.service.stack import ServiceError, ServiceStack

SLEEPS = "import time; time.sleep(300)"
EXITS = "import sys; sys.exit(3)"


@pytest.fixture
def components(monkeypatch):
    """What each stand-in component runs: `SLEEPS` unless the test says otherwise."""
    codes: dict[str, str] = {}
    monkeypatch.setattr(stack_module, "component_command",
                        lambda component, args: [sys.executable, "-c", codes.get(component, SLEEPS), component])
    return codes


def _stack(tmp_path, lines: list[str], **kwargs) -> ServiceStack:
    stack = ServiceStack(home=tmp_path / "home", log=lines.append, **kwargs)
    stack.logs_dir.mkdir(parents=True)
    return stack


def _start(stack: ServiceStack, *names: str) -> None:
    for name in names:
        stack._start_component(name, [], dict(os.environ))


def _until(condition, deadline_s: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {deadline_s}s: {what}"
        time.sleep(0.05)


def test_a_component_that_dies_is_restarted_and_the_others_are_left_alone(tmp_path, components):
    lines: list[str] = []
    stack = _stack(tmp_path, lines, restart_backoff_s=0.1)
    _start(stack, "scheduler", "dag-processor")
    first, scheduler = stack.processes["dag-processor"], stack.processes["scheduler"]
    try:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)

        def restarted() -> bool:
            stack.supervise()
            return stack.restarts.get("dag-processor") == 1

        _until(restarted, what="the DAG processor restarted")
        again = stack.processes["dag-processor"]
        assert again.pid != first.pid and again.poll() is None
        assert stack.processes["scheduler"] is scheduler and scheduler.poll() is None
        assert stack.restarts == {"dag-processor": 1}
        assert any(line.startswith("[sat] the dag-processor exited with status -9 (1 in the last 300s): "
                                   "restarting it in 0.1s") for line in lines), lines
        assert f"[sat] restarted the dag-processor (pid {again.pid}, restart 1)" in lines
    finally:
        stack.stop(grace=10)
    assert all(proc.poll() is not None for proc in stack.processes.values())


def test_the_backoff_doubles_and_five_exits_in_five_minutes_stop_the_service(tmp_path, components):
    components["triggerer"] = EXITS
    lines: list[str] = []
    stack = _stack(tmp_path, lines, restart_backoff_s=1.0, restart_backoff_max_s=4.0)
    _start(stack, "triggerer")
    clock = 1000.0
    try:
        with pytest.raises(ServiceError) as keeps_failing:
            for _ in range(20):
                stack.processes["triggerer"].wait(timeout=30)
                stack.supervise(now=clock)  # notes the exit, restarts it when its backoff has passed
                clock += 5.0
                stack.supervise(now=clock)
        message = str(keeps_failing.value)
        assert "the triggerer exited 5 times within 300s (last status 3): it keeps failing" in message
        assert str(stack.logs_dir / "triggerer.log") in message
        waits = [line.split("restarting it in ")[1].split(";")[0] for line in lines if "restarting it in" in line]
        assert waits == ["1s", "2s", "4s", "4s"], lines  # doubled, at most restart_backoff_max_s
        assert stack.restarts == {"triggerer": 4}
    finally:
        stack.stop(grace=10)


def test_exits_further_apart_than_the_window_do_not_add_up(tmp_path, components):
    components["scheduler"] = EXITS
    stack = _stack(tmp_path, [], restart_backoff_s=0.1)
    _start(stack, "scheduler")
    try:
        for k in range(8):  # one exit every 100 s: at most 4 within any 300 s
            stack.processes["scheduler"].wait(timeout=30)
            stack.supervise(now=100.0 * k)
            stack.supervise(now=100.0 * k + 1)
        assert stack.restarts == {"scheduler": 8}
    finally:
        stack.stop(grace=10)


def test_nothing_is_restarted_once_a_stop_is_asked(tmp_path, components):
    lines: list[str] = []
    stack = _stack(tmp_path, lines, restart_backoff_s=0.1)
    _start(stack, "api-server")
    os.killpg(stack.processes["api-server"].pid, signal.SIGKILL)
    stack.processes["api-server"].wait(timeout=30)
    stack.stop(grace=10)
    stack.supervise(now=time.monotonic() + 60)
    assert stack.restarts == {} and not any("restart" in line for line in lines), lines
