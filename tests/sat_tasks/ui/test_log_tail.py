"""The job log's tail and what came after an offset: whole lines, bounded reads (a 50 MB log read only at its end)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sat_tasks.core.live_log import LiveCursor, LiveLog
from sat_tasks.ui.log_tail import (
    MAX_READ_BYTES,
    TAIL_BYTES,
    is_marker,
    read_job_log,
    read_log,
)
from sat_tasks.ui.run_files import CHUNK_BYTES, FileSource


@dataclass
class Bytes:
    """A log in memory that notes every read (start, length)."""

    data: bytes
    reads: list[tuple[int, int]] = field(default_factory=list)
    where: str = "memory"

    def size(self) -> int:
        return len(self.data)

    def read(self, start: int, length: int) -> bytes:
        self.reads.append((start, length))
        return self.data[start:start + length]


LOG = b"".join(f"line {i}\n".encode() for i in range(10))  # 'line 0\n' ... 'line 9\n', 7 bytes each


@pytest.mark.parametrize(("offset", "limit", "text", "start", "skipped"), [
    pytest.param(None, 1000, LOG.decode(), 0, 0, id="tail-of-a-short-log-is-all-of-it"),
    pytest.param(None, 15, "line 8\nline 9\n", 56, 0, id="tail-drops-the-part-line-it-starts-in"),
    pytest.param(21, 1000, LOG[21:].decode(), 21, 0, id="after-an-offset-only-the-new-bytes"),
    pytest.param(70, 1000, "", 70, 0, id="nothing-new"),
    pytest.param(7, 14, "line 8\nline 9\n", 56, 49, id="grew-by-more-than-the-limit-skips-to-its-end"),
    pytest.param(7, 15, "line 8\nline 9\n", 56, 49, id="the-skip-drops-a-part-line-too"),
])
def test_a_piece_is_whole_lines_from_where_the_reader_is(offset, limit, text, start, skipped):
    piece = read_log(Bytes(LOG), offset, limit)
    assert (piece.text, piece.start, piece.skipped, piece.size) == (text, start, skipped, len(LOG))
    assert piece.offset == piece.end == start + len(text.encode())


def test_a_line_still_being_written_waits_until_it_is_whole():
    log = Bytes(LOG + b"line 10 is half")
    piece = read_log(log, 63)
    assert (piece.text, piece.offset) == ("line 9\n", 70)
    assert read_log(log, 70).text == "" and read_log(log, 70).offset == 70
    log.data += b" done\n"
    assert read_log(log, 70).text == "line 10 is half done\n"


def test_once_the_run_has_ended_a_last_line_without_newline_shows():
    assert read_log(Bytes(LOG + b"no newline"), 70, growing=False).text == "no newline"


def test_a_shorter_log_than_the_offset_is_read_again_from_its_tail():
    piece = read_log(Bytes(LOG[:14]), 70)
    assert piece.restarted and (piece.start, piece.text) == (0, "line 0\nline 1\n")


def test_a_cut_never_splits_a_utf8_character():
    log = Bytes("é\n".encode() * 100)  # 3 bytes a line
    piece = read_log(log, None, 10)
    assert piece.text == "é\né\né\n" and "\ufffd" not in piece.text


def test_one_request_reads_at_most_the_cap():
    log = Bytes(b"x" * (3 * MAX_READ_BYTES) + b"\n")
    read_log(log, 0, 10 * MAX_READ_BYTES)
    assert all(length <= MAX_READ_BYTES + 1 for _, length in log.reads)  # +1: the byte before a tail


@pytest.mark.parametrize(("line", "marked"), [
    pytest.param("2026-12-02T07:00:00+00:00 [sat] attempt 2 of job demo on node n1: Starting dataset "
                 "initialization", True, id="header"),
    pytest.param("2026-12-02T07:09:00+00:00 [sat] attempt 2 ended: exit status 0", True, id="footer"),
    pytest.param("Starting dataset initialization", True, id="the-pods-own-start-line"),
    pytest.param("step 10 loss 2.1", False, id="training-line"),
    pytest.param("[sat] attempts are many", False, id="lookalike"),
])
def test_the_attempts_markers(line, marked):
    assert is_marker(line) is marked


def test_a_50_mb_log_is_read_only_at_its_end(tmp_path):
    path = tmp_path / "job.log"
    with open(path, "wb") as handle:  # sparse: 50 MB of holes, then the last lines
        handle.truncate(50 * 2**20)
        handle.seek(0, 2)
        handle.write(b"\n" + b"".join(f"step {i}\n".encode() for i in range(100)))
    reads: list[tuple[int, int]] = []

    class Counted(FileSource):
        def read(self, start: int, length: int) -> bytes:
            reads.append((start, length))
            return super().read(start, length)

    source = Counted(path)
    piece = read_log(source)
    size = path.stat().st_size
    assert piece.text.endswith("step 99\n") and piece.end == size
    assert reads == [(size - TAIL_BYTES - 1, TAIL_BYTES + 1)]  # one read: the tail and the byte before it
    followed = read_log(source, piece.offset - len(b"step 99\n"))
    assert followed.text == "step 99\n" and reads[-1] == (size - 8, 8)


def test_the_download_streams_a_50_mb_log_in_bounded_chunks(tmp_path):
    path = tmp_path / "job.log"
    with open(path, "wb") as handle:
        handle.truncate(50 * 2**20)
    biggest, total = 0, 0
    for chunk in FileSource(path).chunks(path.stat().st_size):
        biggest, total = max(biggest, len(chunk)), total + len(chunk)
    assert total == 50 * 2**20 and biggest <= CHUNK_BYTES


def test_a_bytes_read_never_says_more_it_skips_to_the_end_instead():
    behind = read_log(Bytes(LOG), 0, 14)
    assert behind.skipped == 56 and behind.end == len(LOG) and not behind.more


def test_a_live_section_follows_the_stored_sections_by_its_cursor():
    stored, asked = Bytes(LOG), []  # the stored sections: 70 bytes

    def live(cursor, limit, lines):
        asked.append(cursor)
        if cursor is None:
            return LiveLog(2, "opening\nl1\n", LiveCursor(2, "p", 5, 1))
        return LiveLog(2, "l2\n", LiveCursor(2, "p", 6, 1), more=True)

    tail = read_job_log(stored, {1}, live)
    assert (tail.text, tail.start, tail.end, tail.size, tail.cursor) == (LOG.decode() + "opening\nl1\n", 0, 81, 81,
                                                                        "2:p:5:1")
    after = read_job_log(stored, {1}, live, tail.offset, LiveCursor.parse(tail.cursor))
    assert (after.start, after.text, after.offset, after.cursor, after.more) == (81, "l2\n", 84, "2:p:6:1", True)
    assert asked[-1] == LiveCursor(2, "p", 5, 1)
    # a reader inside the stored bytes reads them first, then the live section from its opening line
    inside = read_job_log(stored, {1}, live, 63)
    assert (inside.text, inside.cursor, inside.more) == ("line 9\n", None, True)
    assert read_job_log(stored, {1}, live, 70).text == "opening\nl1\n"
    # past the stored bytes without a cursor, or following an attempt whose section is now stored: the tail again
    assert read_job_log(stored, {1}, live, 90).restarted
    again = read_job_log(stored, {1, 2}, live, 81, LiveCursor(2, "p", 5, 1))
    assert again.restarted and again.text.endswith("opening\nl1\n")


def test_a_live_section_that_cannot_be_read_keeps_the_reader_where_it_is():
    def gone(cursor, limit, lines):
        return None

    piece = read_job_log(Bytes(LOG), {1}, gone, 81, LiveCursor(2, "p", 5, 1))
    assert (piece.text, piece.offset, piece.cursor) == ("", 81, "2:p:5:1") and "no longer there" in piece.source
