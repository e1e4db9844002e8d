"""Bounded reads of files a job's training writes: a document whole within the bound, a log from its end."""

from __future__ import annotations

import pytest

from sat_tasks.core import bounded
from sat_tasks.core.bounded import (
    ObjectTooLargeError,
    json_objects,
    read_file,
    tail_file,
    tail_lines,
)


def test_a_document_is_read_whole_up_to_the_bound_and_refused_past_it_by_name(tmp_path):
    path = tmp_path / "progress.json"
    path.write_bytes(b"x" * 4000)
    assert read_file(path, max_bytes=4000) == b"x" * 4000  # at the bound
    with pytest.raises(ObjectTooLargeError, match=r"progress\.json holds 3\.9 KiB, more than the 1\.0 KiB a document"):
        read_file(path, max_bytes=1024)
    assert isinstance(ObjectTooLargeError("x"), ValueError)  # callers that skip unreadable JSON skip it too


def test_the_default_bound_is_read_when_called(tmp_path, monkeypatch):
    path = tmp_path / "series.jsonl"
    path.write_bytes(b"y" * 5000)
    assert len(read_file(path)) == 5000
    monkeypatch.setattr(bounded, "MAX_JSON_BYTES", 4096)
    with pytest.raises(ObjectTooLargeError, match="more than the 4.0 KiB"):
        read_file(path)


def test_a_file_growing_past_the_bound_while_read_is_refused_after_one_byte_more(tmp_path, monkeypatch):
    """Its size when opened is within the bound, what it holds by the read is not: at most bound + 1 bytes read."""
    path = tmp_path / "progress.json"
    path.write_bytes(b"z" * 100)
    reads = []
    real_open = open

    class Growing:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def seek(self, *args):
            return self.handle.seek(*args)

        def read(self, n=-1):
            reads.append(n)
            with real_open(path, "ab") as more:  # the training appends between the size check and the read
                more.write(b"z" * 10_000)
            return self.handle.read(n)

    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: Growing(real_open(p, mode, *a, **k)))
    with pytest.raises(ObjectTooLargeError, match="more than the 1.0 KiB"):
        read_file(path, max_bytes=1024)
    assert reads == [1025]


def test_a_log_is_read_from_its_end(tmp_path):
    path = tmp_path / "job.log"
    path.write_bytes(b"0123456789" * 100)
    assert tail_file(path, 15) == (b"56789" + b"0123456789", 1000)
    assert tail_file(path, 5000) == (b"0123456789" * 100, 1000)
    with pytest.raises(OSError):
        tail_file(tmp_path / "missing.log", 10)


def test_the_lines_of_a_logs_end_leave_out_the_one_the_bound_cut(tmp_path):
    path = tmp_path / "job.log"
    path.write_text("first line\nsecond\nthird\n")
    assert tail_lines(path, 13) == (["second", "third"], 24)  # the bound falls where "second" starts: kept
    assert tail_lines(path, 14) == (["second", "third"], 24)  # "\nsecond\nthird\n"
    assert tail_lines(path, 9) == (["third"], 24)  # "nd\nthird\n": "nd" is what was left of "second"
    assert tail_lines(path, 24) == tail_lines(path, 100) == (["first line", "second", "third"], 24)


def test_the_json_objects_of_a_series_leave_out_cut_torn_and_non_object_lines():
    text = ('e": 1}\n'  # the end of a line a tail cut
            '{"step": 1, "loss": 2.5}\n'
            '[1, 2]\n'  # JSON, not an object
            '\n'
            '{"step": 2, "loss": 2.1}\n'
            '{"step": 3, "lo')  # the training is still writing it
    assert json_objects(text) == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.1}]
    assert json_objects("") == []
