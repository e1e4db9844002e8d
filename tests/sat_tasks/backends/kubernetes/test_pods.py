"""Tests of the Kubernetes backend through its rendered manifests (schema-validated offline)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from sat_tasks.backends.kubernetes import cleanup as k8s_cleanup
from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import operator as k8s_operator
from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes import settings as k8s_settings
from sat_tasks.backends.kubernetes import supervisor as k8s_supervisor
from sat_tasks.cli.render import register as register_render
from sat_tasks.config import sat_setting
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.runtime_env import (
    IMAGE_VENDOR_DIR,
    POD_CODE_DIR,
    POD_DATA_DIR,
    POD_OUTPUT_DIR,
)
from sat_tasks.io.run_layout import scoped
from sat_tasks.spec import SERVER_TYPES, TrainingJob, load_spec, parse_spec
from tests.support.paths import REPO

EXAMPLE_SPECS = sorted((REPO / "include" / "jobs").glob("*.yaml"))
# The newest Kubernetes schema kubernetes-validate ships (1.37 at kubernetes-validate 1.37.0).
K8S_VERSION = "1.37.0"
RUN_ID = "manual__2026-11-29T18:00:00+00:00"
SETTINGS = k8s_settings.KubernetesSettings()

LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_1123_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035_LABEL_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _base_spec(**overrides) -> dict:
    spec = {
        "name": "tiny-job",
        "learning_type": "on-demand",
        "framework": "pytorch",
        "nodes": 1,
        "resources": {"gpus_per_node": 0, "server_type": "cpu", "memory": "8Gi", "shared_memory": "1Gi"},
        "image": {"url": "registry.example.com/team/train:1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
        "results": {"destination": "s3://sat-demo/results/"},
        "command": 'python train.py --data_dir "$SAT_DATA_DIR" --output_dir "$SAT_OUTPUT_DIR"',
    }
    spec.update(overrides)
    return spec


EXTRA_SPECS = {
    "deepspeed-g2-2nodes": _base_spec(
        name="llama.70b-pretrain",
        framework="deepspeed",
        nodes=2,
        resources={"gpus_per_node": 8, "server_type": "g2", "memory": "1500Gi", "shared_memory": "64Gi", "cpu": "96"},
        image={"url": "registry.example.com/team/train:1.0", "registry_conn_id": "sat_registry_main"},
        storage={"file_storage_mount": "filestore"},
        command="python -m train.main --deepspeed ds_config.json",
    ),
    "spot-g3": _base_spec(
        name="spot-b300",
        learning_type="spot",
        resources={"gpus_per_node": 8, "server_type": "g3", "memory": "2000Gi", "shared_memory": "128Gi"},
        tags={"team": "research", "cost-center": "42"},
    ),
    "on-demand-pytorch-3nodes": _base_spec(
        name="ddp-3nodes", nodes=3, job_failover=True,
        resources={"gpus_per_node": 4, "server_type": "g2", "memory": "512Gi", "shared_memory": "32Gi"},
    ),
}


@pytest.fixture(scope="session")
def extra_spec_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("specs")
    files = {}
    for key, data in EXTRA_SPECS.items():
        files[key] = folder / f"{key}.yaml"
        files[key].write_text(yaml.safe_dump(data), encoding="utf-8")
    return files


def _job(key: str) -> TrainingJob:
    return parse_spec(EXTRA_SPECS[key], source=key)


def _pods(manifests: list[dict]) -> list[dict]:
    return [m for m in manifests if m["kind"] == "Pod"]


def _container(pod: dict) -> dict:
    (container,) = pod["spec"]["containers"]
    return container


def _env(pod: dict) -> dict[str, str | dict]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(pod)["env"]}


def _render(job: TrainingJob, *, attempt: int = 1, exclude_nodes: list[str] | None = None,
            resume_step: int | None = None, **kwargs) -> list[dict]:
    kwargs.setdefault("run_id", RUN_ID)
    plan = Plan(attempt=attempt, exclude_nodes=exclude_nodes or [], resume_step=resume_step)
    return k8s_pods.render_attempt_manifests(job, plan=plan, settings=SETTINGS, **kwargs)


def _validate(manifest: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


# ---- every manifest of every spec validates against the Kubernetes schema ------------------------
RENDER_CASES = [
    pytest.param({}, id="first-attempt"),
    pytest.param({"attempt": 3, "exclude_nodes": ["gpu-node-7", "gpu-node-2"], "resume_step": -1}, id="failover-resume"),
    pytest.param({"attempt": 2, "resume_step": 140, "pvc_name": "shared-runs", "namespace": "team-a"}, id="shared-claim"),
]


@pytest.mark.parametrize("spec_path", [pytest.param(p, id=p.stem) for p in EXAMPLE_SPECS])
@pytest.mark.parametrize("case", RENDER_CASES)
def test_example_specs_render_schema_valid_manifests(spec_path, case):
    job = load_spec(spec_path)
    manifests = _render(job, **case)
    assert [m["kind"] for m in manifests] == (["Service", "NetworkPolicy"] if job.distributed else []) + ["Pod"] * job.nodes
    for manifest in manifests:
        _validate(manifest)
    _validate(k8s_pods.render_run_volume_claim(job, run_id=RUN_ID, settings=SETTINGS))


@pytest.mark.parametrize("key", [pytest.param(k, id=k) for k in EXTRA_SPECS])
@pytest.mark.parametrize("case", RENDER_CASES)
def test_extra_specs_render_schema_valid_manifests(key, case):
    job = _job(key)
    manifests = _render(job, **case)
    kinds = [m["kind"] for m in manifests]
    assert kinds == (["Service", "NetworkPolicy"] + ["Pod"] * job.nodes if job.distributed else ["Pod"])
    for manifest in manifests:
        _validate(manifest)


def test_schema_validation_is_strict():
    import kubernetes_validate

    pod = _pods(_render(_job("spot-g3")))[0]
    pod["spec"]["containers"][0]["workDir"] = "/opt/sat/code"  # a typo of workingDir
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(pod)


# ---- the pod's contents -------------------------------------------------------------------------
def test_env_contract_with_pod_paths():
    env = _env(_pods(_render(_job("spot-g3")))[0])
    assert env["CHECKPOINT_VENDOR"] == IMAGE_VENDOR_DIR
    assert env["PYTHONPATH"] == IMAGE_VENDOR_DIR
    grace = float(sat_setting("final_checkpoint_grace_seconds"))  # 20 in the test set-up
    assert float(env["CKPT_GRACE_SECONDS"]) == grace  # the engine's final save gets the configured time
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in env  # one node: no launcher
    assert env["HF_DATASETS_OFFLINE"] == "1"
    assert env["SAT_DATA_DIR"] == POD_DATA_DIR
    assert env["SAT_OUTPUT_DIR"] == POD_OUTPUT_DIR
    assert env["SAT_CODE_DIR"] == POD_CODE_DIR
    assert env["SAT_JOB_NAME"] == "spot-b300"
    assert env["SAT_ATTEMPT"] == "1"
    assert env["SAT_RUN_ID"] == RUN_ID
    assert env["SAT_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_checkpoint_mirror_env_points_at_the_runs_results_prefix(monkeypatch):
    from sat_tasks.io.run_layout import JobRun

    monkeypatch.setenv("AIRFLOW__SAT__SCOPED_CREDENTIALS", "off")  # the shared Secret (on: tests/security)

    job = _job("deepspeed-g2-2nodes")
    settings = k8s_settings.KubernetesSettings(object_storage_endpoint="https://storage.example.com",
                                      object_storage_secret="team-a-object-storage")
    for pod in _pods(k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=Plan(attempt=2), settings=settings)):
        env = _env(pod)
        assert env["CKPT_MIRROR_URL"] == JobRun(job, RUN_ID).results_uri + "checkpoints/"
        assert env["CKPT_MIRROR_URL"].startswith("s3://sat-demo/results/llama.70b-pretrain/")
        assert env["CKPT_S3_ENDPOINT_URL"] == "https://storage.example.com"
        assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "team-a-object-storage", "key": "access_key_id"}}
        assert env["AWS_SECRET_ACCESS_KEY"] == {
            "secretKeyRef": {"name": "team-a-object-storage", "key": "secret_access_key"}}


def test_default_endpoint_is_aws_and_default_secret_is_sat_object_storage(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__SCOPED_CREDENTIALS", "off")  # the shared Secret (on: tests/security)
    env = _env(_pods(_render(_job("spot-g3")))[0])
    assert "CKPT_S3_ENDPOINT_URL" not in env  # boto3's own AWS endpoints
    assert env["AWS_ACCESS_KEY_ID"]["secretKeyRef"]["name"] == "sat-object-storage"


def test_object_storage_settings_from_config(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__K8S_OBJECT_STORAGE_ENDPOINT", "http://minio.storage:9000")
    monkeypatch.setenv("AIRFLOW__SAT__K8S_OBJECT_STORAGE_SECRET", "minio-keys")
    settings = k8s_settings.KubernetesSettings.from_sat_config()
    assert (settings.object_storage_endpoint, settings.object_storage_secret) == (
        "http://minio.storage:9000", "minio-keys")


def test_no_object_storage_key_is_ever_rendered(monkeypatch, extra_spec_files, capsys):
    """Keys live in the connection (and the cluster's Secret), never in a manifest."""
    marker_id, marker_secret = "AKIAMARKER7f3e9b", "s3cr3t-MARKER-5d1c"
    monkeypatch.setenv("AIRFLOW_CONN_SAT_OBJECT_STORAGE",
                       f'{{"conn_type": "aws", "login": "{marker_id}", "password": "{marker_secret}"}}')
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", marker_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", marker_secret)
    for key, path in extra_spec_files.items():
        rendered = yaml.safe_dump_all(_render(_job(key), resume_step=-1))
        assert marker_id not in rendered and marker_secret not in rendered
        assert _run_cli(["render", str(path), "--run-id", RUN_ID, "--namespace", "team-a"]) == 0
        out = capsys.readouterr().out
        assert marker_id not in out and marker_secret not in out
        assert "secretKeyRef" in out


def test_user_env_is_passed_and_contract_wins():
    job = parse_spec(_base_spec(env={"WANDB_MODE": "offline", "PYTHONPATH": "/elsewhere"}))
    env = _env(_pods(_render(job))[0])
    assert env["WANDB_MODE"] == "offline"
    assert env["PYTHONPATH"] == IMAGE_VENDOR_DIR


@pytest.mark.parametrize(
    ("resume_step", "expected"),
    [pytest.param(None, None, id="fresh-start"), pytest.param(-1, "-1", id="newest"),
     pytest.param(140, "140", id="step-140")],
)
def test_ckpt_last_step_only_on_resume(resume_step, expected):
    for pod in _pods(_render(_job("deepspeed-g2-2nodes"), attempt=2, resume_step=resume_step)):
        assert _env(pod).get("CKPT_LAST_STEP") == expected


def test_shm_is_memory_backed_empty_dir_of_spec_size():
    job = _job("deepspeed-g2-2nodes")
    for pod in _pods(_render(job)):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mount = next(m for m in _container(pod)["volumeMounts"] if m["mountPath"] == "/dev/shm")
        assert volumes[mount["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}


@pytest.mark.parametrize(
    ("key", "gpus", "product"),
    [pytest.param("deepspeed-g2-2nodes", "8", SERVER_TYPES["g2"]["gpu_model"], id="g2-8xH100"),
     pytest.param("spot-g3", "8", SERVER_TYPES["g3"]["gpu_model"], id="g3-8xB300"),
     pytest.param("on-demand-pytorch-3nodes", "4", SERVER_TYPES["g2"]["gpu_model"], id="g2-4gpus")],
)
def test_gpu_resources_and_model_by_server_type(key, gpus, product):
    for pod in _pods(_render(_job(key))):
        resources = _container(pod)["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == gpus
        assert resources["requests"] == resources["limits"]  # Guaranteed QoS
        assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == product
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_cpu_server_type_asks_for_no_gpu():
    pod = _pods(_render(parse_spec(_base_spec())))[0]
    resources = _container(pod)["resources"]
    assert "nvidia.com/gpu" not in resources["limits"]
    assert resources["limits"]["cpu"] == "2"
    assert "nodeSelector" not in pod["spec"] and "tolerations" not in pod["spec"]


@pytest.mark.parametrize(
    ("memory", "shm", "expected"),
    [pytest.param("8Gi", "1Gi", "9Gi", id="gi"), pytest.param("1500Gi", "64Gi", "1564Gi", id="large"),
     pytest.param("512Mi", "64Mi", "576Mi", id="mi"), pytest.param("1G", "1Gi", "2073741824", id="mixed-units")],
)
def test_memory_limit_covers_shm(memory, shm, expected):
    job = parse_spec(_base_spec(resources={"memory": memory, "shared_memory": shm}))
    assert k8s_pods.pod_memory(job) == expected
    assert _container(_pods(_render(job))[0])["resources"]["limits"]["memory"] == expected


def _node_expressions(pod: dict) -> list[dict]:
    affinity = pod["spec"].get("affinity")
    if not affinity:
        return []
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 1  # terms are ORed: every rule must sit in the one term
    return terms[0]["matchExpressions"]


def test_anti_affinity_excludes_nodes_of_failed_attempts():
    job = _job("on-demand-pytorch-3nodes")
    for pod in _pods(_render(job, attempt=3, exclude_nodes=["gpu-b", "gpu-a", "gpu-b"], resume_step=-1)):
        expressions = _node_expressions(pod)
        assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-a", "gpu-b"]} in expressions
        assert {"key": "sat.ai/capacity", "operator": "NotIn", "values": ["spot"]} in expressions


def test_first_attempt_excludes_no_node():
    expressions = _node_expressions(_pods(_render(_job("on-demand-pytorch-3nodes")))[0])
    assert all(e["key"] != "kubernetes.io/hostname" for e in expressions)


def test_spot_pods_select_and_tolerate_spot_capacity():
    pod = _pods(_render(_job("spot-g3"), attempt=2, exclude_nodes=["spot-1"], resume_step=-1))[0]
    assert pod["spec"]["nodeSelector"]["sat.ai/capacity"] == "spot"
    assert {"key": "sat.ai/capacity", "operator": "Equal", "value": "spot", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    assert _node_expressions(pod) == [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["spot-1"]}]
    assert "affinity" not in _pods(_render(_job("spot-g3")))[0]["spec"]  # nothing to exclude yet


def test_on_demand_pods_never_land_on_spot_capacity():
    pod = _pods(_render(parse_spec(_base_spec())))[0]
    assert "sat.ai/capacity" not in pod["spec"].get("nodeSelector", {})
    assert _node_expressions(pod) == [{"key": "sat.ai/capacity", "operator": "NotIn", "values": ["spot"]}]


def test_grace_period_restart_policy_and_termination_message():
    for pod in _pods(_render(_job("deepspeed-g2-2nodes"))):
        assert pod["spec"]["enableServiceLinks"] is False
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["spec"]["terminationGracePeriodSeconds"] == 120
        assert pod["spec"]["restartPolicy"] == "Never"
        assert _container(pod)["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_settings_from_config_cover_the_final_checkpoint(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__FINAL_CHECKPOINT_GRACE_SECONDS", "300")
    monkeypatch.setenv("AIRFLOW__SAT__K8S_MASTER_PORT", "23456")
    monkeypatch.setenv("AIRFLOW__SAT__K8S_CAPACITY_LABEL", "cloud.example.com/capacity")
    settings = k8s_settings.KubernetesSettings.from_sat_config()
    assert settings.termination_grace_seconds == 360
    assert settings.master_port == 23456
    pod = _pods(k8s_pods.render_attempt_manifests(_job("spot-g3"), run_id=RUN_ID, plan=Plan(attempt=1)))[0]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 360
    assert pod["spec"]["nodeSelector"]["cloud.example.com/capacity"] == "spot"
    assert _env(pod)["CKPT_GRACE_SECONDS"] == "300"  # the engine's final checkpoint gets the configured time
    for pod in _pods(k8s_pods.render_attempt_manifests(_job("on-demand-pytorch-3nodes"), run_id=RUN_ID, plan=Plan(attempt=1))):
        # torchrun would SIGKILL the workers 30 s after SIGTERM; it waits out the final checkpoint instead
        assert int(_env(pod)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) == 315 < pod["spec"]["terminationGracePeriodSeconds"]


def test_a_jobs_own_grace_period_sizes_its_pods_and_launcher():
    """`env.CKPT_GRACE_SECONDS` longer than the configured one: the kubelet and torchrun wait it out."""
    spec = {**EXTRA_SPECS["on-demand-pytorch-3nodes"], "env": {"CKPT_GRACE_SECONDS": "600"}}
    job = parse_spec(spec, source="long-grace")
    assert SETTINGS.termination_grace_seconds == 120  # the default pod grace period would SIGKILL at 120 s
    for pod in _pods(_render(job)):
        assert pod["spec"]["terminationGracePeriodSeconds"] == 660
        assert _env(pod)["CKPT_GRACE_SECONDS"] == "600"
        assert int(_env(pod)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) == 615
    kwargs = k8s_operator.build_pod_operator_kwargs(job, run_id=RUN_ID, plan=Plan(attempt=1), node_rank=2, settings=SETTINGS)
    assert kwargs["termination_grace_period"] == 660  # the operator's delete on kill waits as long
    # A shorter one keeps the configured period (the pod's grace is never cut below it).
    short = parse_spec({**spec, "env": {"CKPT_GRACE_SECONDS": "5"}}, source="short-grace")
    for pod in _pods(_render(short)):
        assert pod["spec"]["terminationGracePeriodSeconds"] == 120
        assert int(_env(pod)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) == 20


def test_image_and_the_runs_pull_secret_when_the_job_has_a_registry_login():
    job = _job("deepspeed-g2-2nodes")
    for pod in _pods(_render(job)):
        assert _container(pod)["image"] == "registry.example.com/team/train:1.0"
        # the run's own pull Secret (ADR 0032): made from the login before the pods, deleted with the run
        assert pod["spec"]["imagePullSecrets"] == [{"name": k8s_names.registry_secret_name(job, RUN_ID)}]
    assert "imagePullSecrets" not in _pods(_render(_job("spot-g3")))[0]["spec"]


def test_volumes_mount_the_run_claim_and_file_storage():
    job = _job("deepspeed-g2-2nodes")
    subpaths = k8s_names.run_volume_subpaths(job, RUN_ID)
    for pod in _pods(_render(job)):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["mountPath"]: m for m in _container(pod)["volumeMounts"]}
        assert volumes["run"]["persistentVolumeClaim"] == {"claimName": k8s_names.run_volume_claim_name(job, RUN_ID)}
        for path, key in ((POD_DATA_DIR, "data"), (POD_OUTPUT_DIR, "output"), (POD_CODE_DIR, "code")):
            assert mounts[path] == {"name": "run", "mountPath": path, "subPath": subpaths[key]}
        # the operator's volume (conftest): its claim, read-only by default; never a hostPath (ADR 0040)
        assert volumes["file-storage"] == {"name": "file-storage",
                                           "persistentVolumeClaim": {"claimName": "fs-filestore", "readOnly": True}}
        assert mounts["/mnt/filestore"] == {"name": "file-storage", "mountPath": "/mnt/filestore", "readOnly": True}
        assert not any("hostPath" in v for v in pod["spec"]["volumes"])
    shared = _pods(_render(job, pvc_name="shared-runs"))[0]
    assert shared["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "shared-runs"}


def test_run_subpaths_keep_runs_apart():
    job = _job("spot-g3")
    first = k8s_names.run_volume_subpaths(job, "manual__2026-11-29T18:00:00+00:00")
    second = k8s_names.run_volume_subpaths(job, "manual__2026-11-29T18_00_00_00_00")
    assert first["data"] != second["data"]
    assert all(".." not in p.split("/") and not p.startswith("/") for p in first.values())


def test_run_volume_claim_is_read_write_many():
    claim = k8s_pods.render_run_volume_claim(_job("spot-g3"), run_id=RUN_ID, settings=SETTINGS)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["name"] == k8s_names.run_volume_claim_name(_job("spot-g3"), RUN_ID)


# ---- names, labels, DNS ------------------------------------------------------------------------
def test_labels_identify_job_run_attempt_and_rank():
    manifests = _render(_job("deepspeed-g2-2nodes"), attempt=2)
    for rank, pod in enumerate(_pods(manifests)):
        labels = pod["metadata"]["labels"]
        assert labels["sat.ai/job"] == "llama.70b-pretrain"
        assert labels["sat.ai/attempt"] == "2"
        assert labels["sat.ai/node-rank"] == str(rank)
        assert labels["sat.ai/run-id"] == k8s_names.label_value(RUN_ID)
        assert pod["metadata"]["annotations"]["sat.ai/run-id"] == RUN_ID
        assert all(LABEL_VALUE_RE.match(v) and len(v) <= 63 for v in labels.values())


@pytest.mark.parametrize(
    "run_id",
    [pytest.param(RUN_ID, id="manual"), pytest.param("scheduled__2026-11-29T00:00:00+00:00", id="scheduled"),
     pytest.param("plain_run-1", id="already-valid"), pytest.param("x" * 80, id="too-long"),
     pytest.param("__+__", id="only-symbols")],
)
def test_run_id_label_is_valid_and_matches_the_provider(run_id):
    from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value

    value = k8s_names.label_value(run_id)
    assert LABEL_VALUE_RE.match(value) and len(value) <= 63
    provider = make_safe_label_value(run_id)
    if LABEL_VALUE_RE.match(provider):  # the provider yields `-<hash>` for "__+__"; ours is valid
        assert value == provider


def test_names_are_dns_labels_even_for_long_dotted_names():
    job = parse_spec(_base_spec(name="a" * 30 + "." + "b" * 32, nodes=64,
                                resources={"gpus_per_node": 8, "server_type": "g2", "memory": "1Ti"}))
    manifests = _render(job, attempt=6, run_id="x" * 200)
    service = manifests[0]
    assert DNS_1035_LABEL_RE.match(service["metadata"]["name"]) and len(service["metadata"]["name"]) <= 63
    for pod in _pods(manifests):
        for name in (pod["metadata"]["name"], pod["spec"]["hostname"]):
            assert DNS_1123_LABEL_RE.match(name) and len(name) <= 63, name
    _validate(manifests[0])
    _validate(manifests[-1])
    assert len({p["metadata"]["name"] for p in _pods(manifests)}) == 64


def test_attempts_and_runs_get_distinct_names():
    job = _job("spot-g3")
    names = {k8s_names.attempt_name(job, run, attempt) for run in ("r1", "r2") for attempt in (1, 2, 3)}
    assert len(names) == 6


def test_multi_node_pods_have_stable_dns_and_rendezvous_on_rank_0():
    job = _job("on-demand-pytorch-3nodes")
    manifests = _render(job, namespace="team-a")
    service, pods = manifests[0], _pods(manifests)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == SETTINGS.master_port
    rank0 = f"{pods[0]['spec']['hostname']}.{service['metadata']['name']}.team-a.svc"
    for rank, pod in enumerate(pods):
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert pod["spec"]["subdomain"] == service["metadata"]["name"]
        assert pod["spec"]["hostname"] == pod["metadata"]["name"]
        env = _env(pod)
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == rank0
        assert env["MASTER_PORT"] == str(SETTINGS.master_port)
        assert env["NODE_RANK"] == env["PET_NODE_RANK"] == str(rank)
        assert env["NNODES"] == env["PET_NNODES"] == "3"
        assert env["NPROC_PER_NODE"] == "4"
        assert env["SAT_NODES"] == "3"
        assert _container(pod)["ports"] == [{"name": "rendezvous", "containerPort": SETTINGS.master_port}]


def test_single_node_pod_has_no_rendezvous():
    pod = _pods(_render(_job("spot-g3")))[0]
    assert "subdomain" not in pod["spec"] and "hostname" not in pod["spec"]
    assert "MASTER_ADDR" not in _env(pod)


# ---- the command -------------------------------------------------------------------------------
def test_container_runs_the_command_under_the_supervisor_in_login_bash():
    job = _job("spot-g3")
    command = _container(_pods(_render(job))[0])["command"]
    assert command[:2] == ["bash", "-lc"]
    assert 'cd "${SAT_CODE_DIR}"' in command[2]
    assert command[3:] == ["sat-launch", job.command]


@pytest.mark.parametrize(
    ("key", "command", "expected"),
    [
        pytest.param("on-demand-pytorch-3nodes", "python train.py --lr 1e-4",
                     'torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
                     '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" train.py --lr 1e-4', id="torchrun"),
        pytest.param("on-demand-pytorch-3nodes", "python3 -m pkg.train --x 1",
                     'torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
                     '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" -m pkg.train --x 1', id="torchrun-module"),
        pytest.param("on-demand-pytorch-3nodes", "python3.11 -u -B train.py",
                     'torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
                     '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" train.py', id="interpreter-flags"),
        pytest.param("on-demand-pytorch-3nodes", "python -c 'print(1)'", "python -c 'print(1)'",
                     id="inline-code-untouched"),
        pytest.param("on-demand-pytorch-3nodes", "torchrun --nproc-per-node=4 train.py",
                     "torchrun --nproc-per-node=4 train.py", id="explicit-launcher-untouched"),
        pytest.param("spot-g3", "python train.py", "python train.py", id="single-node-untouched"),
        pytest.param("deepspeed-g2-2nodes", "python -m train.main --deepspeed ds.json",
                     'torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
                     '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" -m ckpt_engine.launch '
                     '-m train.main --deepspeed ds.json', id="deepspeed-module"),
        pytest.param("deepspeed-g2-2nodes", "python3 -u train.py --deepspeed ds.json",
                     'torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
                     '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" -m ckpt_engine.launch '
                     'train.py --deepspeed ds.json', id="deepspeed-script"),
        pytest.param("deepspeed-g2-2nodes", "deepspeed train.py --deepspeed ds.json",
                     "deepspeed train.py --deepspeed ds.json", id="explicit-deepspeed-untouched"),
        # a launcher's `python -m` form is a launcher too: never nested in torchrun
        pytest.param("on-demand-pytorch-3nodes", "python -m torch.distributed.run --nproc-per-node 8 train.py",
                     "python -m torch.distributed.run --nproc-per-node 8 train.py", id="python-m-torchrun-untouched"),
        pytest.param("deepspeed-g2-2nodes", "python3 -m deepspeed.launcher.runner train.py",
                     "python3 -m deepspeed.launcher.runner train.py", id="python-m-deepspeed-untouched"),
        pytest.param("deepspeed-g2-2nodes", "python -m accelerate.commands.launch train.py",
                     "python -m accelerate.commands.launch train.py", id="python-m-accelerate-untouched"),
        pytest.param("on-demand-pytorch-3nodes", "python -m torch_utils.train",
                     'torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
                     '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" -m torch_utils.train',
                     id="module-named-like-torch-is-wrapped"),
    ],
)
def test_launch_command(key, command, expected):
    job = _job(key).model_copy(update={"command": command})
    assert k8s_supervisor.launch_command(job) == expected


# A script as written for the `deepspeed` launcher: `--local_rank` is required. (It joins
# the group with torch.distributed, as deepspeed.init_distributed does from the same env,
# without DeepSpeed's CPU shared-memory op, a JIT build on first use.)
DS_RANK_SCRIPT = """
import argparse
import torch, torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
parser.add_argument("--deepspeed")
args = parser.parse_args()
dist.init_process_group(backend="gloo")
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
print(f"rank={dist.get_rank()} world={dist.get_world_size()} local_rank={args.local_rank} "
      f"sum={int(total.item())} name={__name__} config={args.deepspeed}", flush=True)
"""


def test_rendered_deepspeed_command_runs_two_nodes_as_the_deepspeed_launcher_would(tmp_path):
    """Both pods' commands, run here as two "nodes" of one rank each: torchrun rendezvous, `--local_rank` passed."""
    import socket

    from ckpt_engine.vendor import write_vendor_dir

    job = _job("deepspeed-g2-2nodes").model_copy(update={"command": "python train.py --deepspeed ds.json"})
    pods = _pods(_render(job))
    launched = [_container(pod)["command"][4] for pod in pods]
    assert launched[0] == launched[1] and launched[0].startswith("torchrun ")  # ranks differ by env only
    (tmp_path / "train.py").write_text(DS_RANK_SCRIPT)
    vendor = write_vendor_dir(tmp_path / "vendor")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    venv_bin = str(Path(sys.executable).parent)
    procs = []
    for rank, pod in enumerate(pods):
        env = {**os.environ, **{k: v for k, v in _env(pod).items() if isinstance(v, str) and k.startswith("N")},
               "NNODES": "2", "NODE_RANK": str(rank), "NPROC_PER_NODE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PYTHONPATH": str(vendor), "PATH": f"{venv_bin}:{os.environ['PATH']}",
               "OMP_NUM_THREADS": "1"}
        assert _env(pod)["NODE_RANK"] == str(rank) and _env(pod)["NNODES"] == "2"
        procs.append(subprocess.Popen(["bash", "-c", launched[rank]], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, out[-3000:]
        assert f"rank={rank} world=2 local_rank=0 sum=3 name=__main__ config=ds.json" in out


def _supervise(command: str, tmp_path: Path, *, term_after: float | None = None, code_dir: Path | None = None,
               extra_env: dict[str, str] | None = None):
    job = _job("spot-g3")
    script = _container(_pods(_render(job))[0])["command"][2]
    env = {**os.environ, "SAT_CODE_DIR": str(code_dir or tmp_path), "SAT_ATTEMPT": "1",
           "SAT_JOB_NAME": job.name, "SAT_NODE": "node-a", **(extra_env or {})}
    proc = subprocess.Popen(["bash", "-c", script, "sat-launch", command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if term_after is not None:
        time.sleep(term_after)
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


def test_supervisor_passes_the_exit_status_and_logs_the_start_marker(tmp_path):
    rc, out = _supervise("pwd && (exit 7)", tmp_path)
    assert rc == 7
    assert "Starting dataset initialization" in out and str(tmp_path) in out


def test_supervisor_runs_the_nodes_metrics_sidecar_beside_any_command(tmp_path):
    """A command that is not Python at all still gets the node's system and job series, ended after it."""
    from ckpt_engine.vendor import write_vendor_dir

    metrics = tmp_path / "metrics"
    env = {"SAT_METRICS_DIR": str(metrics), "SAT_METRICS_INTERVAL_SECONDS": "300",
           "PYTHONPATH": str(write_vendor_dir(tmp_path / "vendor")),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    rc, out = _supervise('echo "sidecar=${SAT_METRICS_SIDECAR}"; sleep 1', tmp_path, extra_env=env)
    assert rc == 0 and "sidecar=1" in out, out
    job = [json.loads(line) for line in (metrics / "attempt-1" / "node-a" / "job.jsonl").read_text().splitlines()]
    assert job[0]["status"] == "Starting" and job[-1]["status"] == "Ended"
    assert (metrics / "attempt-1" / "node-a" / "system.jsonl").read_text().count("cpu_percent") >= 2


def test_supervisor_forwards_sigterm_to_the_training_process(tmp_path):
    trainer = tmp_path / "train.py"
    trainer.write_text(
        "import signal, sys, time\n"
        "def stop(*_):\n    print('final checkpoint saved', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\nprint('training', flush=True)\ntime.sleep(30)\n"
    )
    started = time.monotonic()
    rc, out = _supervise(f"echo setup && python3 {trainer}", tmp_path, term_after=1.0)
    assert "final checkpoint saved" in out
    assert rc == 143  # stopped early never counts as success
    assert time.monotonic() - started < 25  # not the trainer's 30 s sleep: SIGTERM reached it


def _unshare_available() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# Run a supervisor as PID 1 of its own PID namespace, as in a container (probed once).
needs_pid_namespace = pytest.mark.skipif(not _unshare_available(),
                                         reason="needs unshare --pid --mount-proc (root or user namespaces)")


@needs_pid_namespace
def test_supervisor_as_pid_1_waits_for_ranks_the_deepspeed_launcher_leaves(tmp_path):
    """In a pod the supervisor is PID 1: when it exits, the kernel SIGKILLs every process left.

    The `deepspeed` launcher (a command written as `deepspeed ...`; SAT rendered multi-node
    DeepSpeed jobs so until it switched to torchrun) dies on SIGTERM at once while its
    ranks write their final checkpoint; the supervisor must not exit with it. Run here as
    PID 1 of a new PID namespace, as in a container.
    """
    from tests.support.slow_rank import RANK

    (tmp_path / "rank.py").write_text(RANK)
    script = _container(_pods(_render(_job("spot-g3")))[0])["command"][2]
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "SAT_CODE_DIR": str(tmp_path), "SAT_ATTEMPT": "1", "SAT_JOB_NAME": "ds-job",
           "SAT_NODE": "node-a", "SAT_OUTPUT_DIR": str(tmp_path / "out"), "PATH": f"{venv_bin}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", script, "sat-launch",
                             "deepspeed --no_local_rank --num_gpus 1 rank.py 3"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    progress = tmp_path / "out" / "concurrent_checkpoint" / "progress.json"
    try:
        deadline = time.monotonic() + 60
        while not progress.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert progress.exists(), "the rank never started"
        (pid_1,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        os.kill(int(pid_1), signal.SIGTERM)  # what the kubelet does on a Spot notice
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "out" / "concurrent_checkpoint" / "final").exists(), out
    assert "rank: final checkpoint committed" in out
    assert "[sat] the command exited on SIGTERM; waiting for the processes it started" in out
    assert proc.returncode == 143


@needs_pid_namespace
def test_supervisor_as_pid_1_stops_on_sigterm_while_waiting_for_rank_0(tmp_path):
    """A rank > 0 waits for rank 0's DNS name before it starts; a SIGTERM then must end the pod.

    PID 1 ignores a signal it has no handler for: before, the pod waited out the DNS loop
    and then started training on a node that was being drained.
    """
    job = _job("on-demand-pytorch-3nodes")
    settings = k8s_settings.KubernetesSettings(rendezvous_dns_wait_seconds=20)
    pod = _pods(k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=Plan(attempt=1), settings=settings))[1]
    script = _container(pod)["command"][2]
    started = tmp_path / "started"
    env = {**os.environ, "SAT_CODE_DIR": str(tmp_path), "SAT_ATTEMPT": "1", "SAT_JOB_NAME": job.name,
           "SAT_NODE": "node-b", "NODE_RANK": "1", "MASTER_ADDR": "rank-0.does-not-exist.invalid"}
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", script, "sat-launch",
                             f"touch {started}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        time.sleep(1.5)  # inside the DNS wait
        (pid_1,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        sent = time.monotonic()
        os.kill(int(pid_1), signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out
    assert "[sat] SIGTERM before the command started" in out
    assert not started.exists()
    assert time.monotonic() - sent < 10  # at most one 5 s sleep of the wait loop


def test_supervisor_fails_clearly_without_staged_code(tmp_path):
    rc, out = _supervise("true", tmp_path, code_dir=tmp_path / "missing")
    assert rc == 1 and "was the script staged?" in out


# ---- the operator ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "rank"),
    [pytest.param("spot-g3", 0, id="single-node"), pytest.param("deepspeed-g2-2nodes", 1, id="multi-node-rank-1")],
)
def test_pod_operator_builds_the_rendered_pod(key, rank):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from kubernetes.client import ApiClient

    job = _job(key)
    common = {"run_id": RUN_ID, "plan": Plan(attempt=2, exclude_nodes=["gpu-a"], resume_step=-1), "namespace": "team-a"}
    kwargs = k8s_operator.build_pod_operator_kwargs(job, kubernetes_conn_id="k8s_prod", node_rank=rank, settings=SETTINGS,
                                           **common)
    operator = KubernetesPodOperator(task_id="launch", **kwargs)
    built = ApiClient().sanitize_for_serialization(operator.build_pod_request_obj(dry_run=True))
    rendered = _pods(k8s_pods.render_attempt_manifests(job, settings=SETTINGS, **common))[rank]

    # The operator fills unset fields with API defaults ([], {}, hostNetwork: false); same pod.
    assert _without_defaults(built["spec"]) == rendered["spec"]
    assert built["metadata"]["name"] == rendered["metadata"]["name"]
    assert built["metadata"]["namespace"] == "team-a"
    assert rendered["metadata"]["labels"].items() <= built["metadata"]["labels"].items()
    assert operator.on_finish_action.value == "keep_pod"
    assert operator.get_logs is True
    assert operator.base_container_name == _container(rendered)["name"]
    assert operator.termination_grace_period == rendered["spec"]["terminationGracePeriodSeconds"]
    assert operator.kubernetes_conn_id == "k8s_prod"
    built_env = {e["name"]: e for e in _container(built)["env"]}
    assert built_env["CKPT_MIRROR_URL"]["value"].endswith("/checkpoints/")
    for name, secret_key in (("AWS_ACCESS_KEY_ID", "access_key_id"), ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
                             ("AWS_SESSION_TOKEN", "session_token")):  # the attempt's own Secret (ADR 0020)
        assert built_env[name] == {"name": name, "valueFrom": {"secretKeyRef": {
            "name": k8s_names.attempt_credentials_name(job, RUN_ID, 2), "key": secret_key}}}
    _validate(built)


def _without_defaults(value):
    if isinstance(value, dict):
        return {k: _without_defaults(v) for k, v in value.items()
                if v not in ([], {}, None) and not (k == "hostNetwork" and v is False)}
    if isinstance(value, list):
        return [_without_defaults(v) for v in value]
    return value


class _FakeCoreV1:
    """Records calls of the CoreV1Api methods the backend uses; lists filter by label selector."""

    def __init__(self, pods: list[dict], services: list[dict] = ()):
        from kubernetes.client import ApiClient

        api = ApiClient()
        self.pods = [api._ApiClient__deserialize(p, "V1Pod") for p in pods]
        self.services = [api._ApiClient__deserialize(s, "V1Service") for s in services]
        self.deleted: list[tuple[str, str, int | None]] = []

    @staticmethod
    def _select(items, selector: str):
        from kubernetes.client import V1PodList

        def ok(labels):
            for term in selector.split(","):
                if "!=" in term:
                    key, value = term.split("!=")
                    if labels.get(key) == value:
                        return False
                else:
                    key, value = term.split("=")
                    if labels.get(key) != value:
                        return False
            return True

        return V1PodList(items=[i for i in items if ok(i.metadata.labels or {})])

    def list_namespaced_pod(self, namespace, label_selector):
        return self._select(self.pods, label_selector)

    def list_namespaced_service(self, namespace, label_selector):
        return self._select(self.services, label_selector)

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds=None):
        self.deleted.append(("pod", name, grace_period_seconds))

    def delete_namespaced_service(self, name, namespace):
        self.deleted.append(("service", name, None))

    def delete_collection_namespaced_secret(self, namespace, label_selector, **kwargs):
        return SimpleNamespace(data=b'{"items": []}')  # the attempt's credentials Secret: tests/security


def _with_phase(pod: dict, phase: str) -> dict:
    return {**pod, "status": {"phase": phase}}


def test_a_failed_rank_tears_down_the_running_ranks():
    from kubernetes.client import ApiClient

    job = parse_spec({**EXTRA_SPECS["on-demand-pytorch-3nodes"], "nodes": 4})
    pods = _pods(_render(job))
    other_attempt = _pods(_render(job, attempt=2))[0]
    client = _FakeCoreV1([_with_phase(pods[0], "Running"), _with_phase(pods[1], "Failed"),
                          _with_phase(pods[2], "Succeeded"), _with_phase(pods[3], "Pending"),
                          _with_phase(other_attempt, "Running")])
    failed = ApiClient()._ApiClient__deserialize(_with_phase(pods[1], "Failed"), "V1Pod")
    deleted = k8s_cleanup.teardown_peers(failed, client)
    assert deleted == [pods[0]["metadata"]["name"], pods[3]["metadata"]["name"]]
    assert {grace for _, _, grace in client.deleted} == {SETTINGS.termination_grace_seconds}

    succeeded = ApiClient()._ApiClient__deserialize(_with_phase(pods[2], "Succeeded"), "V1Pod")
    assert k8s_cleanup.teardown_peers(succeeded, _FakeCoreV1([_with_phase(pods[0], "Running")])) == []


def test_multi_node_operators_carry_the_gang_teardown_callback():
    from airflow.providers.cncf.kubernetes.callbacks import (
        KubernetesPodOperatorCallback,
    )

    multi = k8s_operator.build_pod_operator_kwargs(_job("deepspeed-g2-2nodes"), run_id=RUN_ID, plan=Plan(attempt=1), settings=SETTINGS)
    (callback,) = multi["callbacks"]
    assert issubclass(callback, KubernetesPodOperatorCallback)
    single = k8s_operator.build_pod_operator_kwargs(_job("spot-g3"), run_id=RUN_ID, plan=Plan(attempt=1), settings=SETTINGS)
    assert single["callbacks"] == []


def test_cleanup_deletes_only_the_attempts_pods_and_service():
    job = _job("deepspeed-g2-2nodes")
    attempt_1, attempt_2 = _render(job, attempt=1), _render(job, attempt=2)
    client = _FakeCoreV1(_pods(attempt_1) + _pods(attempt_2), [attempt_1[0], attempt_2[0]])
    deleted = k8s_cleanup.cleanup_attempt(client, job, run_id=RUN_ID, attempt=1, namespace=k8s_settings.DEFAULT_NAMESPACE)
    assert deleted == [f"pod/{p['metadata']['name']}" for p in _pods(attempt_1)] + [
        f"service/{attempt_1[0]['metadata']['name']}"]


def test_operator_kwargs_reject_a_rank_outside_the_job():
    with pytest.raises(ValueError, match="node_rank"):
        k8s_operator.build_pod_operator_kwargs(_job("spot-g3"), run_id=RUN_ID, plan=Plan(attempt=1), node_rank=1,
                                               settings=SETTINGS)


def test_rendering_modules_import_no_kubernetes_or_airflow():
    code = ("import sys, sat_tasks.backends.kubernetes.pods, sat_tasks.backends.kubernetes.names; "
            "print(sorted(m for m in ('kubernetes', 'airflow') if m in sys.modules))")
    out = subprocess.run([os.sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- sat render --------------------------------------------------------------------------------
def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sat")
    register_render(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_render_cli_prints_a_yaml_stream_of_valid_manifests(extra_spec_files, capsys):
    path = extra_spec_files["deepspeed-g2-2nodes"]
    rc = _run_cli(["render", str(path), "--attempt", "2", "--exclude-node", "gpu-a", "--exclude-node", "gpu-b",
                   "--resume-step", "-1", "--run-id", RUN_ID, "--namespace", "team-a"])
    out = capsys.readouterr().out
    assert rc == 0
    documents = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in documents] == ["PersistentVolumeClaim", "Service", "NetworkPolicy", "Pod", "Pod"]
    for document in documents:
        _validate(document)
    job = load_spec(path)
    job = scoped(job, job.name)  # the run's prefix with its DAG (the spec file's), as validate_spec scopes it
    expected = k8s_pods.render_attempt_manifests(
        job, run_id=RUN_ID, plan=Plan(attempt=2, exclude_nodes=["gpu-a", "gpu-b"], resume_step=-1), namespace="team-a")
    assert documents[1:] == expected
    assert _env(documents[3])["CKPT_LAST_STEP"] == "-1"
    assert "- |\n" in out  # the supervisor script reads as a block


@pytest.mark.parametrize("spec_path", [pytest.param(p, id=p.stem) for p in EXAMPLE_SPECS])
def test_render_cli_with_an_existing_claim(spec_path, capsys):
    assert _run_cli(["render", str(spec_path), "--pvc", "shared-runs"]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in documents] == ["Pod"]
    assert documents[0]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "shared-runs"


def test_render_cli_reports_every_spec_problem(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_base_spec(name="Bad_Name", nodes=0, learning_type="spot", job_failover=True)))
    assert _run_cli(["render", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"{bad}: name: must be 3-63 chars" in err[0]
    assert any(line.startswith(f"{bad}: nodes: ") for line in err)
    assert all(re.match(rf"^{re.escape(str(bad))}: [\w.<>]+: .+", line) for line in err)


def test_render_cli_missing_file(tmp_path, capsys):
    assert _run_cli(["render", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err.startswith(f"{tmp_path / 'nope.yaml'}: <file>: cannot be read")


# ---- a live cluster ----------------------------------------------------------------------------
@pytest.mark.k8s
@pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a live cluster: set KUBECONFIG (kind, k3s)")
def test_rendered_pod_runs_in_a_live_cluster(tmp_path):
    """Create the rendered claim and pod in a real cluster, wait for it, read its log and status.

    Env: SAT_K8S_TEST_NAMESPACE (default `default`), SAT_K8S_TEST_IMAGE (needs bash and python;
    default python:3.11-slim), SAT_K8S_TEST_ACCESS_MODE (default ReadWriteOnce: kind and k3s
    provision no ReadWriteMany volumes).
    """
    from kubernetes import client, config

    config.load_kube_config()
    core = client.CoreV1Api()
    namespace = os.environ.get("SAT_K8S_TEST_NAMESPACE", "default")
    job = parse_spec(_base_spec(
        name="sat-live-test",
        resources={"memory": "256Mi", "shared_memory": "64Mi", "cpu": "0.2"},
        image={"url": os.environ.get("SAT_K8S_TEST_IMAGE", "python:3.11-slim")},
        command='python -c "import os; print(\'vendor\', os.environ[\'CHECKPOINT_VENDOR\'])" && df -h /dev/shm',
    ))
    run_id = f"k8s_test__{uuid.uuid4().hex[:8]}"
    secret = f"sat-live-test-{uuid.uuid4().hex[:8]}"  # the pod's Object Storage keys come from a Secret
    settings = k8s_settings.KubernetesSettings(run_volume_size="1Gi", termination_grace_seconds=30,
                                      object_storage_secret=secret)
    claim = k8s_pods.render_run_volume_claim(job, run_id=run_id, namespace=namespace, settings=settings)
    claim["spec"]["accessModes"] = [os.environ.get("SAT_K8S_TEST_ACCESS_MODE", "ReadWriteOnce")]
    (pod,) = k8s_pods.render_attempt_manifests(job, run_id=run_id, plan=Plan(attempt=1), namespace=namespace,
                                               settings=settings)
    name = pod["metadata"]["name"]
    core.create_namespaced_secret(namespace, {"metadata": {"name": secret}, "stringData": {
        "access_key_id": "test-id", "secret_access_key": "test-secret"}})
    core.create_namespaced_persistent_volume_claim(namespace, claim)
    try:
        core.create_namespaced_pod(namespace, pod)
        deadline = time.monotonic() + 600
        phase = "Pending"
        while time.monotonic() < deadline:
            phase = core.read_namespaced_pod(name, namespace).status.phase
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(3)
        log = core.read_namespaced_pod_log(name, namespace, container=_container(pod)["name"])
        assert phase == "Succeeded", log
        assert "Starting dataset initialization" in log
        assert f"vendor {IMAGE_VENDOR_DIR}" in log
        status = core.read_namespaced_pod(name, namespace).status.container_statuses[0]
        assert status.state.terminated.exit_code == 0
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        core.delete_namespaced_persistent_volume_claim(claim["metadata"]["name"], namespace)
        core.delete_namespaced_secret(secret, namespace)


# ---- probes: start-up, then liveness (ADR 0010) ------------------------------------------------------
def _probe(command: list[str], progress: Path, attempt: int) -> int:
    script = command[-1].replace(k8s_supervisor.PROGRESS_FILE, str(progress))
    return subprocess.run(["bash", "-c", script], env={"SAT_ATTEMPT": str(attempt), "PATH": os.environ["PATH"]},
                          check=False).returncode


def _progress_file(tmp_path: Path, **fields) -> Path:
    """progress.json exactly as the engine writes it (its own record and json.dumps)."""
    import dataclasses
    import json

    from ckpt_engine.engine import ProgressRecord

    path = tmp_path / "progress.json"
    path.write_text(json.dumps(dataclasses.asdict(ProgressRecord(**fields)), indent=1))
    return path


def test_the_startup_probe_passes_at_this_attempts_first_step(tmp_path):
    startup, liveness = k8s_supervisor.training_probes(_job("spot-g3"))
    command = startup["exec"]["command"]
    assert _probe(command, tmp_path / "missing.json", 2) != 0  # nothing written yet
    assert _probe(command, _progress_file(tmp_path, step=None, attempt=2), 2) != 0  # the engine is up, no step yet
    assert _probe(command, _progress_file(tmp_path, step=700, attempt=1), 2) != 0  # attempt 1's step, on the volume
    assert _probe(command, _progress_file(tmp_path, step=12, attempt=2), 2) == 0
    assert _probe(command, _progress_file(tmp_path, step=12, attempt=12), 2) != 0  # 12 is not 2
    # Kubernetes gives it period x failureThreshold seconds: the job's start-up deadline.
    job = _job("spot-g3")
    assert startup["periodSeconds"] * startup["failureThreshold"] >= job.startup_timeout_seconds
    assert liveness["failureThreshold"] == 1


def test_the_liveness_probe_fails_when_progress_stops(tmp_path):
    job = TrainingJob.model_validate({**_job("spot-g3").to_dict(), "heartbeat_timeout_seconds": 60})
    _, liveness = k8s_supervisor.training_probes(job)
    path = _progress_file(tmp_path, step=12, attempt=1)
    assert _probe(liveness["exec"]["command"], path, 1) == 0
    os.utime(path, (path.stat().st_atime - 120, path.stat().st_mtime - 120))  # no step for 2 minutes
    assert _probe(liveness["exec"]["command"], path, 1) != 0


def test_a_job_without_a_start_up_deadline_gets_no_probes():
    job = TrainingJob.model_validate({**_job("spot-g3").to_dict(), "startup_timeout_seconds": 0})
    assert k8s_supervisor.training_probes(job) == (None, None)
    (pod,) = [m for m in k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=Plan(attempt=1), settings=SETTINGS)
              if m["kind"] == "Pod"]
    assert "startupProbe" not in pod["spec"]["containers"][0] and "livenessProbe" not in pod["spec"]["containers"][0]
