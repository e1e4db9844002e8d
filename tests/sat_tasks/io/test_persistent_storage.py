"""The embedded Object Storage of `make up` keeps its objects across a stop and a start."""

from __future__ import annotations

import pytest

from sat_tasks.io.local_s3 import PersistentS3Server


@pytest.mark.timeout(180)
def test_objects_survive_stop_and_start(tmp_path):
    state = tmp_path / "state"
    server = PersistentS3Server(state_dir=state, sync_seconds=3600).start()  # only the final copy counts here
    try:
        client = server.client()
        client.create_bucket(Bucket="results")
        client.put_object(Bucket="results", Key="job/run 1/report.json", Body=b'{"ok": true}')
        client.put_object(Bucket="results", Key="job/run 1/gone.txt", Body=b"x")
        client.put_object(Bucket="results", Key="a/../odd?key%.bin", Body=b"\x00\x01")
        assert server.sync() == 3
        client.delete_object(Bucket="results", Key="job/run 1/gone.txt")
        client.put_object(Bucket="results", Key="job/run 1/report.json", Body=b'{"ok": false}')
    finally:
        server.stop()
    assert not list(state.rglob("*.part"))
    assert len(list((state / "results").iterdir())) == 2  # the deleted object's file went too

    again = PersistentS3Server(state_dir=state, sync_seconds=3600).start()
    try:
        client = again.client()
        keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="results")["Contents"])
        assert keys == ["a/../odd?key%.bin", "job/run 1/report.json"]
        body = client.get_object(Bucket="results", Key="job/run 1/report.json")["Body"].read()
        assert body == b'{"ok": false}'  # the change made after the last periodic copy was kept by the stop
        assert again.sync() == 0  # restored objects are known: nothing is copied again
    finally:
        again.stop()


@pytest.mark.timeout(180)
def test_periodic_copy_runs_without_a_stop(tmp_path):
    import time

    state = tmp_path / "state"
    server = PersistentS3Server(state_dir=state, sync_seconds=0.2).start()
    try:
        server.client().create_bucket(Bucket="bkt")
        server.client().put_object(Bucket="bkt", Key="k", Body=b"v")
        deadline = time.monotonic() + 60
        while not (state / "bkt" / "k").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (state / "bkt" / "k").read_bytes() == b"v"  # a crash now would not lose it
    finally:
        server.stop()
