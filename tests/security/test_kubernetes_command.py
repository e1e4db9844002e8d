"""The kubelet's `$(VAR)` / `$$` expansion gives the shell back the job's command exactly as written."""

from __future__ import annotations

import inspect

import pytest

from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.core.handoffs import Plan
from sat_tasks.spec import parse_spec

RUN_ID = "manual__2026-12-02T05:00:00+00:00"


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet does to a container's command (Kubernetes' forked `expansion` package)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            following = text[i + 1]
            if following == "$":  # `$$` -> `$`
                out.append("$")
                i += 2
                continue
            if following == "(" and (end := text.find(")", i + 2)) != -1:
                name = text[i + 2:end]  # a defined variable is replaced; an undefined one stays
                out.append(env.get(name, text[i:end + 1]))
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def job_with(command: str):
    return parse_spec({
        "name": "tiny-job", "learning_type": "on-demand", "framework": "pytorch", "nodes": 1,
        "resources": {"gpus_per_node": 0, "server_type": "cpu", "memory": "8Gi", "shared_memory": "1Gi"},
        "image": {"url": "registry.example.com/team/train:1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
        "results": {"destination": "s3://sat-demo/results/"},
        "command": command,
    }, source="test")


def first_attempt() -> dict:
    """Attempt 1, as `render_attempt_manifests` takes it (a `Plan` since issue 28; `attempt=` before)."""
    if "plan" in inspect.signature(k8s_pods.render_attempt_manifests).parameters:
        return {"plan": Plan(attempt=1)}
    return {"attempt": 1}


@pytest.mark.parametrize("command", [
    pytest.param('python train.py --run "$(SAT_RUN_ID)"', id="defined-variable"),
    pytest.param("python train.py --pid $$ --cost '$$5'", id="double-dollar"),
    pytest.param('python train.py --seed "$(date +%s)" $$$(SAT_NODE)', id="substitution-and-mixed"),
    pytest.param('python train.py --out "$SAT_OUTPUT_DIR" --end $', id="plain-and-trailing"),
])
def test_the_kubelet_hands_the_shell_the_command_as_written(command: str) -> None:
    (pod,) = [m for m in k8s_pods.render_attempt_manifests(job_with(command), run_id=RUN_ID, **first_attempt(),
                                                            settings=KubernetesSettings()) if m["kind"] == "Pod"]
    container = pod["spec"]["containers"][0]
    env = {var["name"]: var["value"] for var in container["env"] if "value" in var}
    assert "SAT_RUN_ID" in env  # the variable the person's `$(SAT_RUN_ID)` would otherwise become
    assert kubelet_expand(container["command"][4], env) == command


def test_the_escape_doubles_each_dollar_the_kubelet_would_read() -> None:
    assert k8s_pods.kubelet_literal("a $(X) $$ $$( $x $") == "a $$(X) $$$ $$$$( $x $"
