"""The container runtime pulls the job's image with the job's own login from a real registry over TLS (ADR 0035).

Debian's docker-registry serves HTTPS with a certificate of a CA the test makes
(`sat_tasks.service.tls`), behind htpasswd. The Debian base image is pushed to it; then a
pull with the right login runs, and a wrong tag, a wrong password and an unknown CA each end
the attempt before it starts, waiting in ImagePullBackOff with the registry's (podman's) own
words, which the classifier reads as IMAGE_PULL and the policy as `Pending - imagepullbackoff`.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from sat_tasks.backends.local.container_run import (
    ImagePullError,
    PullLogin,
    job_pull_login,
    local_image_digest,
    prepare_image,
)
from sat_tasks.backends.local.containers import podman, podman_installed
from sat_tasks.classify import classify
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import VerdictKind
from sat_tasks.core.policy import decide_next
from sat_tasks.core.status import JobStatus
from sat_tasks.service.tls import ensure_ca, server_certificate
from tests.support.registry_server import start_registry

BASE_IMAGE = "localhost/sat/debian-base:bookworm"
PASSWORD = "pull-s3cr3t-" + os.urandom(4).hex()

pytestmark = pytest.mark.skipif(not podman_installed(), reason="podman/runc not installed: `make system-deps`")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if local_image_digest(BASE_IMAGE) is None:
        pytest.fail(f"{BASE_IMAGE} is not in the project's image store: `make image` builds it (make test runs it)")
    root = tmp_path_factory.mktemp("tls-registry")
    ca = ensure_ca(root / "ca")
    server_pair = server_certificate(root / "server", ca, ["127.0.0.1", "localhost"])
    server = start_registry(root / "registry", {"robot": PASSWORD}, tls=(server_pair.certificate, server_pair.key))
    trust = root / "trust"
    trust.mkdir()
    (trust / "ca.crt").write_bytes(ca.certificate.read_bytes())
    image = f"{server.host}/team/base:1.0"
    auth = root / "auth.json"
    auth.write_text(json.dumps({"auths": {server.host: {"auth": __import__("base64").b64encode(
        f"robot:{PASSWORD}".encode()).decode()}}}))
    podman(["tag", BASE_IMAGE, image])
    pushed = podman(["push", "--authfile", str(auth), "--cert-dir", str(trust), image], check=False, timeout=600)
    assert pushed.returncode == 0, pushed.stderr
    podman(["rmi", image])  # only the registry has it now
    yield SimpleNamespace(server=server, image=image, trust=trust, ca=ca)
    server.stop()
    podman(["rmi", "--ignore", image], check=False)


def login(registry, **changes) -> PullLogin:
    fields = {"registry": registry.server.host, "username": "robot", "password": PASSWORD,
              "tls_verify": True, "cert_dir": registry.trust}
    fields.update(changes)
    return PullLogin(**fields)


def test_the_jobs_login_pulls_its_image_over_tls(registry):
    lines: list[str] = []
    digest = prepare_image(registry.image, lines.append, login(registry))
    assert digest.startswith("sha256:") and digest == local_image_digest(registry.image)
    assert any("pulled" in line and "with the job's registry login" in line for line in lines)
    assert not any(PASSWORD in line for line in lines)


@pytest.mark.parametrize(("case", "changes", "words"), [
    ("wrong tag", {"image": "team/base:no-such-tag"}, "manifest unknown"),
    ("wrong password", {"password": "not-the-password"}, "unauthorized"),
    ("unknown CA", {"cert_dir": None}, "certificate signed by unknown authority"),
])
def test_a_failed_pull_ends_in_imagepullbackoff_with_the_registrys_words(registry, case, changes, words):
    image = registry.image
    if "image" in changes:
        image = f"{registry.server.host}/{changes.pop('image')}"
    lines: list[str] = []
    with pytest.raises(ImagePullError) as failed:
        prepare_image(image, lines.append, login(registry, **changes), tries=2)
    message = str(failed.value)
    assert message.startswith("Back-off pulling image") and words in message.lower(), message
    assert PASSWORD not in message and not any(PASSWORD in line for line in lines)
    assert sum("failed (try" in line for line in lines) == 2
    # the attempt's record, as the launcher stores it, classifies as an image pull failure and stops the job
    record = AttemptRecord(job="j", attempt=1, backend="local", node="n0", exit_code=None,
                           termination_reason="ImagePullBackOff", termination_message=message, container_states=[
                               {"name": "sat-j-a1", "image": image, "imageID": "",
                                "state": {"waiting": {"reason": "ImagePullBackOff", "message": message}}}])
    verdict = classify(record)
    assert verdict.kind is VerdictKind.IMAGE_PULL, (case, verdict)
    assert any(words in line.lower() for line in verdict.evidence), verdict.evidence


def test_the_policy_stops_an_image_pull_failure_as_imagepullbackoff():
    from sat_tasks.core.handoffs import Plan, Verdict

    decision = decide_next(_job("sat_registry_pull-job"), Plan(attempt=1), Verdict(
        kind=VerdictKind.IMAGE_PULL, evidence=["Back-off pulling image: manifest unknown"], reason="pull"), now=0)
    assert decision.status is JobStatus.IMAGE_PULL_BACKOFF and "manifest unknown" in decision.why


def test_a_job_without_a_login_uses_the_store_and_says_how_to_get_an_image():
    with pytest.raises(ImagePullError, match=r"not in this host's image store .*`make image`"):
        prepare_image("localhost/sat/no-such-image:0", lambda _m: None)


def _job(conn_id: str):
    from sat_tasks.spec import parse_spec

    return parse_spec({"name": "pull-job", "framework": "pytorch", "image": {
        "url": "127.0.0.1:5000/team/img:1", "registry_conn_id": conn_id},
        "data": {"source": "s3://bkt/d/"}, "storage": {"script_url": "s3://bkt/s.py"},
        "results": {"destination": "s3://bkt/r/"}, "command": "python s.py"})


def test_the_pull_login_comes_only_from_the_jobs_own_or_a_shared_connection():
    conn = SimpleNamespace(host="127.0.0.1:5000", login="robot", password=PASSWORD, schema="", extra_dejson={})
    got = job_pull_login(_job("sat_registry_pull-job"), get_connection=lambda _c: conn)
    assert (got.registry, got.username, got.password, got.tls_verify) == ("127.0.0.1:5000", "robot", PASSWORD, True)
    assert PASSWORD not in repr(got)
    with pytest.raises(ImagePullError, match="someone_elses"):
        job_pull_login(_job("someone_elses"), get_connection=lambda _c: conn)


def test_the_image_check_trusts_the_deployments_ca_and_refuses_an_unknown_one(registry):
    from sat_tasks.io.registry import ImageCheckOutcome, check_image

    trusted = check_image(registry.image, username="robot", password=PASSWORD, ca_file=str(registry.ca.certificate))
    assert trusted.ok and trusted.digest.startswith("sha256:"), trusted.message
    unknown = check_image(registry.image, username="robot", password=PASSWORD, retries=0)
    assert unknown.outcome is ImageCheckOutcome.UNTRUSTED and unknown.pulls_fail, unknown.message
    assert "certificate signed by unknown authority" in unknown.message and PASSWORD not in unknown.message
