"""The Logs tab while a Kubernetes attempt runs: the ended attempts' sections, then the running one from its pod.

The runs router as in test_runs_files (its `run` and `client` fixtures: the run found without
the metadata DB, its results on the embedded S3 server); the run's backend is the Kubernetes
backend on the in-memory API server (`tests.support.k8s_api`: a real CoreV1Api whose
requests are recorded, pod logs served as the kubelet serves them: tailLines, sinceSeconds,
timestamps, limitBytes).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from sat_tasks.backends.base import LiveLogSource
from sat_tasks.backends.kubernetes import names, pod_log
from sat_tasks.core.joblog import job_log_footer
from sat_tasks.core.live_log import BadCursor, LiveCursor, split_stamp
from sat_tasks.ui.log_tail import is_marker
from sat_tasks.ui.routers import runs
from tests.sat_tasks.ui.test_runs_files import RUN_ID, _api, _ended, _put, client, run  # noqa: F401 - fixtures
from tests.support.k8s_api import RecordedCluster

NS = "sat-jobs"
T0 = time.time() - 100  # the pod's lines are stamped from here on (the kubelet's clock is the real one)
SECTION_1 = (b"2026-12-02T06:00:00+00:00 [sat] attempt 1 of job files-job on node gpu-a: log of pod p (rank 0) follows\n"
             b"step 1 loss 3.0\n"
             b"2026-12-02T06:30:00+00:00 [sat] attempt 1 ended: exit status 137 (rank 0, pod p, OOMKilled)\n")


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _pod(job, attempt: int, state: dict) -> dict:
    name = names.pod_name(job, RUN_ID, attempt, 0)
    return {"metadata": {"name": name, "namespace": NS, "creationTimestamp": "2026-12-02T07:00:00Z",
                         "labels": {**names.labels(job, RUN_ID, attempt), names.LABEL_NODE_RANK: "0"}},
            "spec": {"nodeName": "gpu-b", "containers": [{"name": "base", "image": "x"}]},
            "status": {"phase": "Running", "startTime": "2026-12-02T07:00:00Z",
                       "containerStatuses": [{"name": "base", "ready": True, "restartCount": 0, "image": "x",
                                              "imageID": "", "state": state}]}}


RUNNING = {"running": {"startedAt": "2026-12-02T07:00:00Z"}}


class Kubernetes(LiveLogSource):
    """The run's backend on an in-memory cluster, as `backend_for(job)` gives it to the router: a live-log source,
    as KubernetesBackend is (`capabilities.live_log`)."""

    def __init__(self, monkeypatch) -> None:
        self.cluster = RecordedCluster()
        monkeypatch.setattr(runs, "backend_for", lambda job: self)

    def live_log(self, layout, **kwargs):  # what KubernetesBackend.live_log does, on this cluster
        return pod_log.live_log(self.cluster.client(), NS, layout, **kwargs)

    def start(self, job, attempt: int, lines: list[tuple[float, str]], state: dict = RUNNING) -> str:
        pod = _pod(job, attempt, state)
        self.cluster.pods.append(pod)
        self.write(pod["metadata"]["name"], lines)
        return pod["metadata"]["name"]

    def write(self, name: str, lines: list[tuple[float, str]]) -> None:
        self.cluster.logs.setdefault(name, [])
        self.cluster.logs[name] += [(_stamp(at), text) for at, text in lines]

    def log_reads(self) -> list[dict]:
        return [query for method, path, query, _ in self.cluster.requests if path.endswith("/log")]


@pytest.fixture
def k8s(monkeypatch) -> Kubernetes:
    return Kubernetes(monkeypatch)


def _tail(client, **params) -> dict:  # noqa: F811 - the fixture
    answer = client.get(_api("/log/tail"), params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_running_attempts_lines_follow_the_ended_attempts_sections(client, run, k8s, s3_hook):  # noqa: F811
    job, layout = run["found"].job, run["found"].layout
    _put(s3_hook, layout.attempt_log_uri(1), SECTION_1)
    pod = k8s.start(job, 2, [(1, "Starting dataset initialization"), (2, "step 1 loss 2.9")])
    first = _tail(client)
    stored, live = first["text"][:len(SECTION_1)], first["text"][len(SECTION_1):].splitlines()
    assert stored == SECTION_1.decode()
    assert live[0].endswith(f"[sat] attempt 2 of job {job.name} on node gpu-b: log of pod {pod} (rank 0) follows")
    assert is_marker(live[0]) and live[1:] == ["Starting dataset initialization", "step 1 loss 2.9"]
    assert first["start"] == 0 and first["offset"] == first["size"] == len(first["text"].encode())
    assert first["cursor"].startswith(f"2:{pod}:") and first["more"] is False and first["ended"] is False
    assert f"attempt 2's pod {pod} (rank 0) through the Kubernetes API: running" in first["source"]
    [read] = k8s.log_reads()
    assert (read["container"], read["timestamps"], read["tailLines"], read["limitBytes"]) == (
        "base", "True", str(pod_log.TAIL_LINES + 1), str(pod_log.READ_BYTES))
    # the page opened on it: the stored section and the live one, markers marked
    page = client.get(f"/sat/jobs/files-job/runs/{RUN_ID}").text
    assert (f"<span class='marker'>{live[0]}</span>\n<span class='marker'>Starting dataset initialization</span>\n"
            "step 1 loss 2.9\n</pre>") in page


def test_a_later_poll_returns_only_the_new_lines(client, run, k8s):  # noqa: F811
    job = run["found"].job
    pod = k8s.start(job, 1, [(1, "step 1"), (2, "step 2")])
    first = _tail(client)
    assert _tail(client, offset=first["offset"], cursor=first["cursor"])["text"] == ""
    k8s.write(pod, [(3, "step 3"), (3, "step 3 again, the same instant"), (4, "step 4")])
    after = _tail(client, offset=first["offset"], cursor=first["cursor"])
    assert after["text"] == "step 3\nstep 3 again, the same instant\nstep 4\n"
    assert after["start"] == first["offset"] and after["offset"] == first["offset"] + len(after["text"])
    follow = k8s.log_reads()[-1]
    assert 0 < int(follow["sinceSeconds"]) <= time.time() - (T0 + 2) + pod_log.SKEW_S + 1  # from step 2, the cursor
    assert follow["tailLines"] == str(pod_log.FOLLOW_LINES + 1) and follow["limitBytes"] == str(pod_log.READ_BYTES)
    assert _tail(client, offset=after["offset"], cursor=after["cursor"])["text"] == ""
    k8s.write(pod, [(4, "step 4, a second line of its instant")])
    assert _tail(client, offset=after["offset"], cursor=after["cursor"])["text"] == "step 4, a second line of its instant\n"


def test_a_log_bigger_than_the_bound_is_not_read_whole(client, run, k8s):  # noqa: F811
    job = run["found"].job
    line = "x" * 99  # 100 bytes a line with its newline, 128 with the timestamp
    k8s.start(job, 1, [(i / 1000, f"{i:06d}{line[6:]}") for i in range(50_000)])  # 6.4 MB as the API serves it
    first = _tail(client, limit=16 * 1024)
    read = k8s.log_reads()[-1]
    assert read["tailLines"] == str(pod_log.TAIL_LINES + 1) and read["limitBytes"] == str(pod_log.READ_BYTES)
    assert len(first["text"].encode()) <= 16 * 1024 and first["more"] is True
    lines = first["text"].splitlines()
    assert "earlier lines are not shown here" in lines[1]
    assert lines[2].startswith(f"{50_000 - pod_log.TAIL_LINES:06d}")  # the last TAIL_LINES lines, from their first
    following = _tail(client, offset=first["offset"], cursor=first["cursor"], limit=16 * 1024)
    assert following["text"].splitlines()[0].startswith(f"{int(lines[-1][:6]) + 1:06d}")  # the rest, in order
    assert "left out" not in following["text"]
    reads = k8s.log_reads()
    assert all(q["limitBytes"] == str(pod_log.READ_BYTES) for q in reads) and len(reads) <= 3
    assert all(int(q["tailLines"]) <= pod_log.FOLLOW_LINES + 1 for q in reads)


def test_lines_older_than_the_cursor_that_fill_a_read_are_not_read_again(client, run, k8s, monkeypatch):  # noqa: F811
    monkeypatch.setattr(pod_log, "READ_BYTES", 1024)  # 8 lines a read, 128 bytes each as served
    pod = k8s.start(run["found"].job, 1, [(i, f"{i:03d}" + "y" * 96) for i in range(30)])  # a line a second
    at, _ = split_stamp(_stamp(20) + " x")
    after = _tail(client, offset=5000, cursor=LiveCursor(1, pod, at, 1).encode(), limit=1024)  # a reader with 020
    assert [line[:3] for line in after["text"].splitlines()][:3] == ["021", "022", "023"]
    assert "left out" not in after["text"] and after["start"] == 5000 and after["more"] is True
    since = [int(q["sinceSeconds"]) for q in k8s.log_reads()]
    assert len(since) == 2 and since[0] - since[1] == pod_log.SKEW_S - 1  # then from the cursor's own second


def test_more_lines_since_the_last_read_than_one_read_takes_says_some_were_left_out(client, run, k8s,  # noqa: F811
                                                                                   monkeypatch):
    monkeypatch.setattr(pod_log, "FOLLOW_LINES", 5)
    pod = k8s.start(run["found"].job, 1, [(1, "step 1")])
    first = _tail(client)
    k8s.write(pod, [(2 + i, f"step {2 + i}") for i in range(10)])
    after = _tail(client, offset=first["offset"], cursor=first["cursor"])["text"].splitlines()
    assert "lines left out here" in after[0] and after[1:] == [f"step {i}" for i in range(6, 12)]


def test_a_pod_not_started_yet_or_gone_says_so_instead_of_failing(client, run, k8s, s3_hook):  # noqa: F811
    job, layout = run["found"].job, run["found"].layout
    _put(s3_hook, layout.attempt_log_uri(1), SECTION_1)
    waiting = {"waiting": {"reason": "ContainerCreating"}}
    k8s.start(job, 2, [], state=waiting)
    pending = _tail(client)
    assert pending["text"] == SECTION_1.decode() and pending["cursor"] is None
    assert "its container has not started yet (ContainerCreating)" in pending["source"]
    assert k8s.log_reads() == []  # its state says it: no log read
    k8s.cluster.pods[0]["status"]["containerStatuses"][0]["state"] = RUNNING
    started = _tail(client, offset=pending["offset"])
    assert started["start"] == len(SECTION_1) and "[sat] attempt 2 of job" in started["text"]
    k8s.cluster.pods.clear()  # gone (deleted by hand, or its node with it) before classify stored its section
    gone = _tail(client, offset=started["offset"], cursor=started["cursor"])
    assert (gone["text"], gone["offset"], gone["cursor"]) == ("", started["offset"], started["cursor"])
    assert "attempt 2's pod is no longer there" in gone["source"]


def test_an_ended_container_closes_the_section_and_classifys_copy_replaces_it(client, run, k8s, s3_hook):  # noqa: F811
    job, layout = run["found"].job, run["found"].layout
    pod = k8s.start(job, 1, [(1, "step 1")])
    first = _tail(client)
    k8s.write(pod, [(2, "CUDA error: an illegal memory access")])
    k8s.cluster.pods[0]["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2026-12-02T07:00:03Z"}}
    last = _tail(client, offset=first["offset"], cursor=first["cursor"])
    footer = job_log_footer(attempt=1, at=datetime(2026, 12, 2, 7, 0, 3, tzinfo=UTC), exit_code=1,
                            note=f"rank 0, pod {pod}; every rank's log comes with the attempt's stored section")
    assert last["text"] == f"CUDA error: an illegal memory access\n{footer}\n" and last["cursor"].endswith(":closed")
    reads = len(k8s.log_reads())
    assert _tail(client, offset=last["offset"], cursor=last["cursor"])["text"] == ""
    assert len(k8s.log_reads()) == reads  # nothing more is read from an ended pod
    _put(s3_hook, layout.attempt_log_uri(1), SECTION_1)  # classify stored the section (every rank)
    replaced = _tail(client, offset=last["offset"], cursor=last["cursor"])
    assert replaced["restarted"] is True and replaced["text"] == SECTION_1.decode() and replaced["cursor"] is None


def test_the_download_covers_the_stored_sections_and_the_running_attempt(client, run, k8s, s3_hook):  # noqa: F811
    job, layout = run["found"].job, run["found"].layout
    _put(s3_hook, layout.attempt_log_uri(1), SECTION_1)
    pod = k8s.start(job, 2, [(1, "step 1"), (2, "step 2")])
    download = client.get(_api("/log"))
    assert download.status_code == 200 and download.text.startswith(SECTION_1.decode())
    assert download.text.endswith(f"log of pod {pod} (rank 0) follows\nstep 1\nstep 2\n")
    assert download.headers["content-length"] == str(len(download.content))
    read = k8s.log_reads()[-1]
    assert read["tailLines"] == str(runs.LIVE_DOWNLOAD_LINES + 1) and read["limitBytes"] == str(
        runs.LIVE_DOWNLOAD_BYTES)


def test_after_the_run_no_pod_is_asked(client, run, k8s, s3_hook):  # noqa: F811
    _ended(run)
    _put(s3_hook, run["found"].layout.attempt_log_uri(1), SECTION_1)
    k8s.start(run["found"].job, 2, [(1, "a kept pod's line")])
    assert _tail(client)["text"] == SECTION_1.decode() and k8s.cluster.requests == []


def test_an_unreachable_cluster_leaves_the_stored_sections_showing(client, run, k8s, s3_hook):  # noqa: F811
    _put(s3_hook, run["found"].layout.attempt_log_uri(1), SECTION_1)
    k8s.cluster.forbidden_namespaces.add(NS)
    answer = _tail(client)
    assert answer["text"] == SECTION_1.decode() and "could not be listed (403 Forbidden" in answer["source"]


@pytest.mark.parametrize("cursor", ["x", "1:pod:1", "1:Pod:1:1", "1:pod:1:1:1", "1:pod:-1:1"])
def test_a_bad_cursor_is_refused_naming_it(client, run, k8s, cursor):  # noqa: F811
    answer = client.get(_api("/log/tail"), params={"offset": 0, "cursor": cursor})
    assert answer.status_code == 422 and answer.json()["detail"].startswith("cursor: ")
    with pytest.raises(BadCursor):
        LiveCursor.parse(cursor)


def test_a_cursor_and_a_stamped_line_read_back_as_written():
    seven = int(datetime(2026, 12, 2, 7, tzinfo=UTC).timestamp()) * 10**9
    cursor = LiveCursor(3, "sat-job-1a2b3c4d-a3-r0", seven + 123_456_789, 2)
    assert LiveCursor.parse(cursor.encode()) == cursor
    closed = LiveCursor(3, "p", 5, 0, closed=True)
    assert LiveCursor.parse(closed.encode()) == closed
    assert split_stamp("2026-12-02T07:00:00.123456789Z step 1") == (seven + 123_456_789, "step 1")
    assert split_stamp("2026-12-02T07:00:00Z step 1") == (seven, "step 1")
    assert split_stamp("2026-12-02T08:00:00.5+01:00 x") == (seven + 500_000_000, "x")
    assert split_stamp("no stamp") == (None, "no stamp")
