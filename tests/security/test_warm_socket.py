"""Issue 29.9: the warm interpreter's socket is its user's alone (0600 in a 0700 directory, peers checked by uid)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from sat_tasks.backends.local import warm_interpreter

MODULE = warm_interpreter.__name__


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_server_socket_is_0600_whatever_the_umask(tmp_path):
    directory = tmp_path / "wi"
    directory.mkdir(mode=0o700)
    sock = directory / "s.sock"
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "serve", "--socket", str(sock), "--preload", "",
                             "--until", str(time.time() + 120)], umask=0, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _mode(sock) == 0o600 and _mode(directory) == 0o700
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_bind_private_creates_the_directory_0700_and_refuses_one_open_to_others(tmp_path):
    old = os.umask(0)
    try:
        server = warm_interpreter.bind_private(str(tmp_path / "new" / "s.sock"))
    finally:
        os.umask(old)
    server.close()
    assert _mode(tmp_path / "new") == 0o700 and _mode(tmp_path / "new" / "s.sock") == 0o600
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)  # someone else could have put their socket here first
    with pytest.raises(PermissionError, match="not a private directory"):
        warm_interpreter.bind_private(str(tmp_path / "open" / "s.sock"))


def _as_another_user(monkeypatch) -> None:
    """This process's uid seen as one more than the peer's (SO_PEERCRED is real: the peer is this process)."""
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)


def test_the_server_refuses_a_connection_from_another_uid(monkeypatch):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.sendall(json.dumps({"op": "until", "until": 99.0}).encode() + b"\n")
    _as_another_user(monkeypatch)
    assert warm_interpreter._handle(None, ours, {}, [], 5.0) == 5.0  # the deadline it was asked to move stays
    theirs.settimeout(5)
    assert _closed_without_answer(theirs)
    theirs.close()


def _closed_without_answer(conn: socket.socket) -> bool:
    try:
        return conn.recv(100) == b""
    except ConnectionResetError:  # closed with our request unread
        return True


def test_the_client_sends_the_run_environment_to_no_server_of_another_uid(tmp_path, monkeypatch):
    directory = tmp_path / "wi"
    directory.mkdir(mode=0o700)
    path = str(directory / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(30)
    cold: list[list[str]] = []

    def execv(executable, argv):
        cold.append(argv)
        raise SystemExit(0)  # instead of replacing this process with the cold run

    monkeypatch.setattr(os, "execv", execv)
    _as_another_user(monkeypatch)
    client = threading.Thread(target=lambda: _quietly(warm_interpreter.run_client, path, ["train.py"]), daemon=True)
    client.start()
    conn, _ = listener.accept()
    conn.settimeout(10)
    received = conn.recv(1 << 16)
    conn.close()
    client.join(timeout=30)
    listener.close()
    assert received == b"" and cold and cold[0][-1] == "train.py"


def _quietly(function, *args) -> None:
    try:
        function(*args)
    except SystemExit:
        pass
