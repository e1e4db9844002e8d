"""Issue 44.3: a job mounts nothing of the node, and no SAT pod runs as root (ADR 0040).

- `storage.file_storage_mount` names an operator-defined File Storage volume (a claim, read-only by
  default); an absolute path (`/var/lib/kubelet`, `/run/containerd`) is refused, as is an unknown name.
- Every pod SAT renders (training ranks, elastic ranks, staging, upload, warm placeholders, node probes) passes the
  Pod Security Standards' "restricted" profile (tests.support.pod_security, written from the standard),
  which the jobs' namespace enforces; the launch path creates exactly such pods through the real
  client against the in-memory API server, with the attempt's NetworkPolicy.
- The shipped manifests: the namespace's `enforce` label, a default-deny NetworkPolicy allowing DNS
  and HTTPS out only, and RBAC that grants no `list` on Secrets and lists no pod outside `sat-jobs`.
- The launcher deletes Secrets by label selector, never listing them; the capacity check lists the
  jobs' namespace's pods only, never every pod of the cluster with its environment.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import yaml

from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes import probe as k8s_probe
from sat_tasks.backends.kubernetes import staging as k8s_staging
from sat_tasks.backends.kubernetes import warm as k8s_warm
from sat_tasks.backends.kubernetes.settings import KubernetesSettings, SettingError
from sat_tasks.core.handoffs import Plan
from sat_tasks.spec import SpecError, parse_spec
from sat_tasks.spec.file_storage import FileStorageSettingError, parse_volumes
from tests.support.k8s_api import RecordedCluster
from tests.support.paths import REPO
from tests.support.pod_security import violations
from tests.support.task_instance import spec_ti

NAMESPACE = "sat-jobs"
RUN_ID = "manual__2026-12-07T08:00:00+00:00"
BUCKET = "sat-pod-security"
SETTINGS = KubernetesSettings()
VOLUMES = {"datasets": {"claim": "fs-datasets", "mount_path": "/mnt/datasets"},
           "scratch": {"claim": "fs-scratch", "mount_path": "/mnt/scratch", "read_only": False}}
RBAC = [d for d in yaml.safe_load_all((REPO / "docker" / "k8s-rbac.yaml").read_text(encoding="utf-8")) if d]


@pytest.fixture(autouse=True)
def file_storage_volumes(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__FILE_STORAGE_VOLUMES", json.dumps(VOLUMES))
    monkeypatch.setenv("AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS", "sat_registry_main")
    monkeypatch.setenv("AIRFLOW_CONN_SAT_REGISTRY_MAIN", json.dumps(
        {"conn_type": "docker", "host": "registry.example.com", "login": "robot", "password": "pw-of-the-tests"}))


def _spec(nodes: int = 1, **overrides) -> dict:
    spec = {
        "name": f"secure-{nodes}-nodes", "learning_type": "on-demand", "framework": "pytorch", "job_failover": True,
        "nodes": nodes, "command": "python train.py", "backend": "kubernetes",
        "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "480Gi", "shared_memory": "64Gi",
                      "cpu": "500m"},
        "image": {"url": "registry.example.com/ml/llama-train:1.4.2", "registry_conn_id": "sat_registry_main"},
        "data": {"source": f"s3://{BUCKET}/datasets/corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
        "storage": {"file_storage_mount": "datasets"},
    }
    spec.update(overrides)
    return spec


def _problems(spec: dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    return [f"{p.field}: {p.rule}" for p in caught.value.problems]


# ---- the spec field: a volume's name, never a node path ------------------------------------------
@pytest.mark.parametrize("path", ["/var/lib/kubelet", "/run/containerd", "/mnt/filestore", "/"])
def test_an_absolute_path_is_refused_saying_what_to_do_instead(path):
    (problem,) = _problems(_spec(storage={"file_storage_mount": path}))
    assert problem.startswith("storage.file_storage_mount: a path is no longer accepted")
    assert "[sat] file_storage_volumes" in problem


def test_an_unknown_volume_name_is_refused_naming_the_field_and_the_rule():
    (problem,) = _problems(_spec(storage={"file_storage_mount": "kubelet"}))
    assert problem.startswith("storage.file_storage_mount: must name a File Storage volume the operator defined "
                              "in [sat] file_storage_volumes")
    assert "'kubelet' is not one of them (datasets, scratch)" in problem


def test_no_volume_is_known_where_the_operator_defines_none(monkeypatch):
    monkeypatch.delenv("AIRFLOW__SAT__FILE_STORAGE_VOLUMES")
    monkeypatch.setenv("AIRFLOW__SAT__FILE_STORAGE_VOLUMES", "")
    (problem,) = _problems(_spec())
    assert "'datasets' is not one of them (none are defined)" in problem


@pytest.mark.parametrize(("entry", "says"), [
    pytest.param({"host_path": "/var/lib/kubelet", "mount_path": "/mnt/x"}, "host_path is not supported",
                 id="host-path"),
    pytest.param({"claim": "fs", "mount_path": "/opt/sat/data"}, "a path SAT or the system uses", id="sat-path"),
    pytest.param({"claim": "fs", "mount_path": "/opt"}, "a path SAT or the system uses", id="above-sat-path"),
    pytest.param({"claim": "fs", "mount_path": "/etc/kubernetes"}, "a path SAT or the system uses", id="etc"),
    pytest.param({"claim": "fs", "mount_path": "relative"}, "absolute path", id="relative"),
    pytest.param({"claim": "fs", "mount_path": "/mnt/../etc"}, "without '..'", id="dotdot"),
    pytest.param({"claim": "Not A Claim", "mount_path": "/mnt/x"}, "PersistentVolumeClaim name", id="claim"),
    pytest.param({"claim": "fs", "mount_path": "/mnt/x", "read_only": "no"}, "true or false", id="read-only"),
])
def test_the_operators_volumes_are_claims_at_paths_of_their_own(entry, says):
    with pytest.raises(FileStorageSettingError, match=re.escape(says)) as caught:
        parse_volumes(json.dumps({"vol": entry}))
    assert str(caught.value).startswith("[sat] file_storage_volumes: volume 'vol': ")


def test_a_volume_is_its_claim_read_only_unless_the_operator_says_otherwise():
    for name, claim, path, read_only in (("datasets", "fs-datasets", "/mnt/datasets", True),
                                         ("scratch", "fs-scratch", "/mnt/scratch", False)):
        job = parse_spec(_spec(storage={"file_storage_mount": name}))
        (pod,) = k8s_pods.attempt_pod_manifests(job, run_id=RUN_ID, plan=Plan(attempt=1), settings=SETTINGS)
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "file-storage"]
        (mount,) = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "file-storage"]
        assert volume == {"name": "file-storage", "persistentVolumeClaim": {
            "claimName": claim, **({"readOnly": True} if read_only else {})}}
        assert mount == {"name": "file-storage", "mountPath": path, **({"readOnly": True} if read_only else {})}


def test_a_volume_the_operator_removed_since_validation_stops_the_render(monkeypatch):
    job = parse_spec(_spec())
    monkeypatch.setenv("AIRFLOW__SAT__FILE_STORAGE_VOLUMES", json.dumps({"scratch": VOLUMES["scratch"]}))
    with pytest.raises(k8s_pods.FileStorageUnknown, match=r"^storage\.file_storage_mount: .*'datasets'"):
        k8s_pods.attempt_pod_manifests(job, run_id=RUN_ID, plan=Plan(attempt=1), settings=SETTINGS)


# ---- the checker itself: what the old manifests were, it refuses ----------------------------------
def test_the_checker_refuses_a_root_pod_with_a_host_path():
    """The pod SAT rendered before issue 44.3 (no securityContext, File Storage as a hostPath)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "old"}, "spec": {
        "containers": [{"name": "main", "image": "x"}],
        "volumes": [{"name": "file-storage", "hostPath": {"path": "/var/lib/kubelet", "type": "Directory"}}]}}
    assert violations(pod, "baseline") == ["HostPath Volumes: volume file-storage"]
    found = violations(pod, "restricted")
    for control in ("HostPath Volumes", "Volume Types", "Privilege Escalation", "Running as Non-root:", "Seccomp",
                    "Capabilities"):
        assert any(v.startswith(control) for v in found), (control, found)
    assert violations({**pod, "spec": {**pod["spec"], "hostNetwork": True, "containers": [
        {"name": "main", "image": "x", "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
         "ports": [{"containerPort": 1, "hostPort": 80}]}], "volumes": []}}, "baseline") == [
        "Host Namespaces: spec.hostNetwork", "Privileged Containers: containers[main]",
        "Capabilities: containers[main] adds ['SYS_ADMIN']", "Host Ports: containers[main] hostPort 80"]


# ---- every pod SAT renders passes "restricted" ----------------------------------------------------
def _every_sat_pod() -> list[tuple[str, dict]]:
    one = parse_spec(_spec())
    three = parse_spec(_spec(3, storage={"file_storage_mount": "scratch"}))
    four = parse_spec(_spec(4, elastic={"min_nodes": 1}))
    pods = [("training 1 node", p) for p in k8s_pods.attempt_pod_manifests(
        one, run_id=RUN_ID, plan=Plan(attempt=1), settings=SETTINGS)]
    pods += [("training 3 nodes", p) for p in k8s_pods.render_attempt_manifests(
        three, run_id=RUN_ID, plan=Plan(attempt=2, exclude_nodes=["n1"]), settings=SETTINGS) if p["kind"] == "Pod"]
    pods += [("elastic on 2 of 4", p) for p in k8s_pods.attempt_pod_manifests(
        four, run_id=RUN_ID, plan=Plan(attempt=2), settings=SETTINGS, ranks=2)]
    warm = k8s_staging.WarmSource(run_id="manual__earlier", claim="sat-warm-claim", objects={"a": "etag"})
    pods.append(("staging", k8s_staging.build_staging_pod(one, RUN_ID, namespace=NAMESPACE, settings=SETTINGS,
                                                          warm=warm)))
    pods.append(("upload", k8s_staging.build_upload_pod(one, RUN_ID, namespace=NAMESPACE, settings=SETTINGS)))
    pods += [("warm placeholder", p) for p in k8s_warm.render_placeholder_pods(
        one, run_id=RUN_ID, nodes=["gpu-1", "gpu-2"], namespace=NAMESPACE, settings=SETTINGS)]
    pods.append(("node probe", k8s_probe.build_probe_pod(one, RUN_ID, "gpu-1", namespace=NAMESPACE,
                                                         settings=SETTINGS)))
    return pods


def test_every_pod_sat_renders_passes_the_restricted_profile():
    pods = _every_sat_pod()
    assert {what for what, _ in pods} == {"training 1 node", "training 3 nodes", "elastic on 2 of 4", "staging",
                                          "upload", "warm placeholder", "node probe"}
    assert any(v.get("downwardAPI") for _, p in pods for v in p["spec"]["volumes"] if "volumes" in p["spec"])
    for what, pod in pods:
        assert violations(pod, "restricted") == [], what
        assert not any("hostPath" in v for v in pod["spec"].get("volumes") or []), what
        context = pod["spec"]["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] > 0, what
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, what
        for container in pod["spec"]["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, what
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}, what


def test_the_pods_uids_are_settings_that_may_not_be_root(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__K8S_RUN_AS_USER", "2000")
    assert KubernetesSettings.from_sat_config().run_as_user == 2000
    monkeypatch.setenv("AIRFLOW__SAT__K8S_RUN_AS_USER", "0")
    with pytest.raises(SettingError, match=r"k8s_run_as_user = 0: must be greater than 0"):
        KubernetesSettings.from_sat_config()


def test_the_training_image_runs_as_a_non_root_user():
    lines = (REPO / "docker" / "training.Dockerfile").read_text(encoding="utf-8").splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users, "the training image has no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users[-1]  # numeric: the kubelet can check runAsNonRoot
    assert int(uid) == SETTINGS.run_as_user


# ---- the launch path, through the real client, against the API server in memory -------------------
def _kubelet(pod: dict) -> tuple[int, str]:
    from sat_tasks.io.staging import REPORT_PREFIX

    component = pod["metadata"]["labels"].get("app.kubernetes.io/component")
    if component == "staging":
        staged = {"data": {"files": 1, "transferred": 1}, "validation": {"success": True, "summary_lines": []}}
        return 0, f"{REPORT_PREFIX}{json.dumps(staged)}\n"
    if component == "upload":
        return 0, f"{REPORT_PREFIX}{json.dumps({'files': 1, 'transferred': 1})}\n"
    return 0, "trained\n"


@pytest.fixture
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET)
    return BUCKET


def test_the_launch_creates_restricted_pods_and_the_ranks_policy_and_cleanup_never_lists_secrets(
        monkeypatch, bucket):
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    from sat_tasks.backends.kubernetes import KubernetesBackend
    from sat_tasks.backends.kubernetes.operator import make_launch_operators
    from sat_tasks.io.run_layout import JobRun

    job = parse_spec(_spec(2))
    cluster = RecordedCluster(kubelet=_kubelet)
    monkeypatch.setattr(KubernetesHook, "get_conn", lambda self: cluster.api_client())
    monkeypatch.setattr(k8s_staging.time, "sleep", lambda _s: None)
    monkeypatch.setattr(KubernetesSettings, "from_sat_config", classmethod(lambda cls: KubernetesSettings()))
    backend = KubernetesBackend(client=cluster.client(), namespace=NAMESPACE)
    run = JobRun(job, RUN_ID)
    said: list[str] = []
    backend.stage(run, said.append)
    for operator in make_launch_operators(attempt=1, previous_decide_task_id=None, job=job, namespace=NAMESPACE):
        ti = spec_ti(operator.task_id, job.to_dict(), dag_id="secure-job")
        operator.execute({"ti": ti, "run_id": RUN_ID, "dag": SimpleNamespace(), "task_instance": ti})

    created_pods = [body for kind, body in cluster.created if kind == "Pod"]
    assert {p["metadata"]["labels"].get(k8s_names.LABEL_COMPONENT) for p in created_pods} >= {"staging", "training"}
    for pod in created_pods:  # as the API server received them from the real client and the provider's operator
        assert violations(pod, "restricted") == [], pod["metadata"]["name"]
        assert not any("hostPath" in v for v in pod["spec"].get("volumes") or [])
    training = [p for p in created_pods if p["metadata"]["labels"].get(k8s_names.LABEL_COMPONENT) == "training"]
    (claim,) = [v["persistentVolumeClaim"] for v in training[0]["spec"]["volumes"] if v["name"] == "file-storage"]
    assert claim == {"claimName": "fs-datasets", "readOnly": True}

    # the ranks' own NetworkPolicy: this attempt's pods, to and from each other only
    (policy,) = [body for kind, body in cluster.created if kind == "NetworkPolicy"]
    attempt_id = k8s_names.attempt_name(job, RUN_ID, 1)
    same = {"podSelector": {"matchLabels": {k8s_names.LABEL_ATTEMPT_ID: attempt_id}}}
    assert policy["spec"] == {**same, "policyTypes": ["Ingress", "Egress"], "ingress": [{"from": [same]}],
                              "egress": [{"to": [same]}]}
    assert all(p["metadata"]["labels"][k8s_names.LABEL_ATTEMPT_ID] == attempt_id for p in training)

    deleted = backend.cleanup_attempt(run, 1, said.append)
    assert f"networkpolicy/{attempt_id}" in deleted
    assert any(d.startswith("secret/") for d in deleted)
    backend.cleanup_run(run, said.append)
    assert cluster.secrets == [] and cluster.network_policies == []
    secret_calls = [(method, path) for method, path, _, _ in cluster.requests if "/secrets" in path]
    assert ("DELETE", f"/api/v1/namespaces/{NAMESPACE}/secrets") in secret_calls  # by label selector
    assert not [call for call in secret_calls if call[0] == "GET"], secret_calls  # never listed, never read


def test_the_capacity_check_lists_the_jobs_pods_only():
    """Never every pod of the cluster (their specs carry other tenants' environments); the jobs' namespace's."""
    from sat_tasks.backends.kubernetes.capacity import cluster_capacity

    def node(name):
        return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "status": {"allocatable": {"cpu": "4", "memory": "64Gi", "pods": "110"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}

    def pod(name, namespace, on, env=()):
        return {"metadata": {"name": name, "namespace": namespace}, "spec": {"nodeName": on, "containers": [
            {"name": "c", "image": "x", "env": list(env), "resources": {"requests": {"cpu": "3"}}}]},
            "status": {"phase": "Running"}}

    cluster = RecordedCluster(nodes=[node("node-a"), node("node-b")], pods=[
        pod("sat-busy", NAMESPACE, "node-a"),
        pod("other-team", "team-b", "node-b", env=[{"name": "HF_TOKEN", "value": "hf_secret_of_team_b"}])])
    job = parse_spec(_spec(resources={"server_type": "cpu", "gpus_per_node": 0, "cpu": "2", "memory": "8Gi"},
                           storage={}))
    found = cluster_capacity(job, RUN_ID, Plan(attempt=1), client=cluster.client(), log=lambda _m: None)
    assert found is not None and found.fitting == ("node-b",)  # node-a holds a SAT pod's 3 of 4 CPUs
    paths = [path for method, path, _, _ in cluster.requests if method == "GET"]
    assert f"/api/v1/namespaces/{NAMESPACE}/pods" in paths and "/api/v1/pods" not in paths


# ---- the shipped manifests ------------------------------------------------------------------------
def test_the_jobs_namespace_enforces_the_restricted_profile():
    (namespace,) = [d for d in RBAC if d["kind"] == "Namespace" and d["metadata"]["name"] == NAMESPACE]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"  # the profile checked above


def _policies() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in RBAC if d["kind"] == "NetworkPolicy"}


def test_the_jobs_network_denies_by_default_and_allows_dns_and_https_out_only():
    policies = _policies()
    assert all(p["metadata"]["namespace"] == NAMESPACE for p in policies.values())
    deny = policies["sat-default-deny"]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}  # every pod, no rule: nothing passes
    # no shipped policy lets anything in; out: DNS to kube-dns, HTTPS to non-private addresses
    assert not any(p["spec"].get("ingress") for p in policies.values())
    ports = sorted((port["protocol"], port["port"]) for p in policies.values() for rule in p["spec"].get("egress", [])
                   for port in rule.get("ports", []))
    assert ports == [("TCP", 53), ("TCP", 443), ("UDP", 53)]
    for policy in policies.values():
        for rule in policy["spec"].get("egress", []):
            assert rule.get("ports"), policy["metadata"]["name"]  # no rule opens every port
            for peer in rule["to"]:
                if "ipBlock" in peer:  # the cluster's and the cloud's private ranges stay closed
                    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(
                        peer["ipBlock"]["except"])


def _rules_granted(kind: str | None = None) -> list[tuple[str, dict]]:
    return [(d["metadata"]["name"], rule) for d in RBAC if d["kind"] in ("Role", "ClusterRole")
            and (kind is None or d["kind"] == kind) for rule in d["rules"]]


def test_no_role_may_list_or_read_secrets():
    for name, rule in _rules_granted():
        if "" in rule["apiGroups"] and ({"secrets", "*"} & set(rule["resources"])):
            assert not {"list", "get", "watch", "*"} & set(rule["verbs"]), (name, rule)


def test_no_cluster_role_lists_the_clusters_pods():
    for name, rule in _rules_granted("ClusterRole"):
        if "" in rule["apiGroups"] and ({"pods", "*"} & set(rule["resources"])):
            assert not {"list", "watch", "get", "*"} & set(rule["verbs"]), (name, rule)
