"""The BYOC example (include/examples/byoc) runs from its pushed image, pulled with the job's own login (ADR 0035).

What a team does, end to end: build the example's Containerfile (SAT's training image plus the
team's `userlib`, installed without any network) with buildah into the project's image store,
push it to a registry that wants a login over TLS (Debian's docker-registry, htpasswd, a
certificate of a CA the test makes), and drop the local tag, so that only the registry has it.
Then the example's job spec, pointed at that image, runs through `sat run`'s `run_job` in
container mode, host mode forbidden: the registry login is the job's own Airflow connection
(`AIRFLOW_CONN_SAT_REGISTRY_BYOC`, as an environment connection), the CA is
`[sat] registry_ca_file`, the data and the script come from the session's embedded Object
Storage (the script uploaded where the spec's `storage.script_url` says).

It Completes; every attempt ran in the pushed image (the digest the push reported); the launch
task's log shows the pull with the job's login, the job's log the image and `userlib`'s own lines
from the image's venv; and the registry password is in no log of the run.

Marked `slow` (`make test-slow`, not `make test`): it builds an image, pushes and pulls about
1.8 GB through a registry and trains in a container: 3 minutes measured on a shared 2-core
machine at load 7-10 (build and push 57 s, the run 117 s), 10 minutes at load 15-20. Needs `make image` (SAT's training image, the Containerfile's FROM), podman,
buildah and docker-registry (`make system-deps`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sat_tasks.backends.local.container_run import local_image_digest
from sat_tasks.backends.local.containers import podman, podman_env, podman_installed
from sat_tasks.backends.local.image_build import TRAINING_IMAGE
from sat_tasks.service.tls import ensure_ca, server_certificate
from tests.support.paths import REPO
from tests.support.registry_server import start_registry

BYOC = REPO / "include" / "examples" / "byoc"
SPEC = BYOC / "byoc-job.yaml"
USER = "team-robot"
PASSWORD = "byoc-s3cr3t-" + os.urandom(6).hex()
MARKER = "userlib-marker"  # include/examples/byoc/userlib/userlib/callbacks.py
STEPS = 20  # the spec's --max_steps

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not podman_installed() or shutil.which("buildah") is None,
                       reason="podman, runc or buildah not installed: `make system-deps`"),
]


def _buildah(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", *args], cwd=cwd, env={**os.environ, **podman_env()}, text=True,
                          capture_output=True, timeout=900, check=False)


@pytest.fixture
def registry(tmp_path):
    ca = ensure_ca(tmp_path / "ca")
    pair = server_certificate(tmp_path / "server", ca, ["127.0.0.1", "localhost"])
    server = start_registry(tmp_path / "registry", {USER: PASSWORD}, tls=(pair.certificate, pair.key))
    yield server, ca
    server.stop()


@pytest.fixture
def pushed_image(tmp_path, registry):
    """The example's image, built here, pushed with a login, its local tag removed: (reference, pushed digest)."""
    server, ca = registry
    if local_image_digest(TRAINING_IMAGE) is None:
        pytest.fail(f"{TRAINING_IMAGE} (the Containerfile's FROM) is not in the project's image store: `make image`")
    image = f"{server.host}/team/byoc:1"
    built = _buildah(["bud", "--pull=never", "-f", "Containerfile", "-t", image, "."], cwd=BYOC)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "userlib 0.1.0 in /opt/sat/venv/" in built.stdout, built.stdout[-3000:]  # the Containerfile's own check
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copyfile(ca.certificate, trust / "ca.crt")
    auth = tmp_path / "push-auth.json"
    auth.write_text(json.dumps({"auths": {server.host: {"auth": base64.b64encode(
        f"{USER}:{PASSWORD}".encode()).decode()}}}))
    auth.chmod(0o600)
    digest_file = tmp_path / "pushed.digest"
    try:
        pushed = podman(["push", "--authfile", str(auth), "--cert-dir", str(trust), "--digestfile", str(digest_file),
                         image], check=False, timeout=900)
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        refused = podman(["pull", "--cert-dir", str(trust), image], check=False, timeout=300)
        assert refused.returncode != 0 and "unauthorized" in refused.stderr.lower(), refused.stderr  # login needed
        podman(["rmi", image])  # only the registry has it now: the job must pull it
        assert local_image_digest(image) is None
        yield image, digest_file.read_text().strip()
    finally:
        auth.unlink(missing_ok=True)
        podman(["rmi", "--ignore", image], check=False)


def test_the_byoc_example_runs_from_its_pushed_image_with_the_jobs_login(
        tmp_path, registry, pushed_image, s3_hook, demo_bucket, airflow_db, monkeypatch, capfd):
    from sat_tasks.cli.run import run_job
    from sat_tasks.config import work_dir
    from sat_tasks.spec import load_spec, split_s3_uri

    server, ca = registry
    image, digest = pushed_image
    assert digest.startswith("sha256:"), digest
    spec = yaml.safe_load(SPEC.read_text())
    assert spec["image"]["registry_conn_id"] == "sat_registry_byoc" and spec["name"] == "byoc"
    spec["image"]["url"] = image  # the registry's port is the test's own
    spec_path = tmp_path / "byoc-job.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    job = load_spec(spec_path)
    # the script comes from Object Storage, where the spec says (the data is the demo's corpus, seeded)
    bucket, key = split_s3_uri(job.storage.script_url)
    assert bucket == demo_bucket
    s3_hook.load_file(filename=BYOC / "train_byoc.py", key=key, bucket_name=bucket, replace=True)
    assert s3_hook.list_keys(bucket_name=bucket, prefix=split_s3_uri(job.data.source)[1])

    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_RUNTIME", "container")
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_HOST_MODE", "forbidden")  # no attempt may quietly run on the host
    monkeypatch.setenv("AIRFLOW__SAT__REGISTRY_CA_FILE", str(ca.certificate))
    monkeypatch.setenv("AIRFLOW_CONN_SAT_REGISTRY_BYOC", json.dumps(
        {"conn_type": "generic", "host": server.host, "login": USER, "password": PASSWORD}))
    airflow_log = tmp_path / "airflow.log"
    report = run_job(job, spec_path, quiet=True, airflow_log=airflow_log)
    console = capfd.readouterr()

    assert report is not None, airflow_log.read_text()[-5000:]
    assert report["status"] == "Completed", (report["history"], report["attempts"])
    assert report["global_step"] == STEPS
    assert report["attempts"], report
    for attempt in report["attempts"]:  # each attempt ran in the pushed image, and says which
        assert (attempt["runtime"], attempt["image"], attempt["image_digest"]) == ("container", image, digest), attempt
    assert local_image_digest(image) == digest  # what the job pulled is what was pushed

    results_bucket, prefix = split_s3_uri(report["results"])
    # the pull is the launch task's (Airflow's log of the run); the attempt's section of the job's log names the image
    pulled = f"[sat] pulled {image} ({digest}) with the job's registry login"
    assert pulled in airflow_log.read_text(), airflow_log.read_text()[-5000:]
    log = s3_hook.read_key(prefix + "job.log", bucket_name=results_bucket)
    assert f"[sat] attempt 1 runs in image {image} ({digest})" in log and "runs on this host" not in log, log[-5000:]
    # the team's library ran, from the image's venv (SAT's own image has no userlib)
    assert f"{MARKER}: userlib 0.1.0 from /opt/sat/venv/lib/python3.11/site-packages/userlib at step 0" in log, \
        log[-5000:]
    assert f"{MARKER}: step {STEPS} loss " in log, log[-5000:]
    keys = set(s3_hook.list_keys(bucket_name=results_bucket, prefix=prefix))
    assert prefix + "output/final/model.safetensors" in keys

    # the registry password is in no log of the run: not in Object Storage's results, Airflow's log, the work dir
    # (the run's staged files, records and logs), what was printed, or the registry's own log
    secret = PASSWORD.encode()
    leaks = [f"s3://{results_bucket}/{k}" for k in sorted(keys)
             if secret in s3_hook.get_key(k, bucket_name=results_bucket).get()["Body"].read()]
    files = [airflow_log, server.log_path, *(p for p in work_dir().rglob("*") if p.is_file() and not p.is_symlink())]
    leaks += [str(p) for p in files if secret in p.read_bytes()]
    leaks += [name for name, text in (("stdout", console.out), ("stderr", console.err)) if PASSWORD in text]
    assert not leaks, leaks
    assert airflow_log.stat().st_size > 0 and server.log_path.stat().st_size > 0  # the scanned logs were written
