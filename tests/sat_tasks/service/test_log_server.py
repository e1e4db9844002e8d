"""Task logs are served on the deployment's host and a port of its own, not on 0.0.0.0:8793/8794 (issue 45.6)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from sat_tasks.service import log_server
from sat_tasks.service.stack import (
    LOG_PORT_KEYS,
    LOG_SERVER,
    SKIP_SERVE_LOGS,
    ServiceStack,
    component_command,
)


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} say them) that listen on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in list(handle)[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    found.add(local.rsplit(":", 1)[0])
    return found


def _serve(host: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(component_command(LOG_SERVER, ["--host", host, "--port", str(port)]),
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while not _listening(port):
        assert proc.poll() is None, "the log server exited"
        assert time.monotonic() < deadline, "the log server did not listen within 90 s"
        time.sleep(0.2)
    return proc


@pytest.mark.timeout(240)
def test_two_deployments_log_servers_listen_on_loopback_on_ports_of_their_own():
    first_port = log_server.free_port("127.0.0.1")
    first = _serve("127.0.0.1", first_port)
    try:
        second_port = log_server.free_port("127.0.0.1")  # chosen while the first one listens: another port
        assert second_port != first_port
        second = _serve("127.0.0.1", second_port)
        try:
            for port in (first_port, second_port):
                assert _listening(port) == {"0100007F"}, _listening(port)  # 127.0.0.1 only, not 0.0.0.0 or ::
                with pytest.raises(urllib.error.HTTPError) as refused:  # Airflow's log-server app: a JWT or nothing
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/log/dag_id=x/run_id=y/task_id=z/attempt=1.log",
                                           timeout=10)
                assert refused.value.code == 403
        finally:
            second.terminate()
            second.wait(timeout=30)
    finally:
        first.terminate()
        first.wait(timeout=30)


def test_the_components_are_told_the_log_servers_port_and_host(tmp_path, monkeypatch):
    monkeypatch.delenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", raising=False)
    env = ServiceStack(home=tmp_path, host="127.0.0.1", log_server_port=41793).environment()
    assert {key: env[key] for key in LOG_PORT_KEYS} == dict.fromkeys(LOG_PORT_KEYS, "41793")
    assert env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] == "sat_tasks.service.log_server.hostname"
    assert env[log_server.HOST_ENV] == "127.0.0.1"
    # Airflow's own log servers (every interface, 8793 and 8794) are not started
    assert SKIP_SERVE_LOGS == {"scheduler": ["--skip-serve-logs"], "triggerer": ["--skip-serve-logs"]}


@pytest.mark.parametrize(("host", "expected"), [
    pytest.param("127.0.0.1", "127.0.0.1", id="loopback"),
    pytest.param("10.1.2.3", "10.1.2.3", id="an-address"),
    pytest.param("0.0.0.0", socket.getfqdn(), id="every-interface-the-hosts-name"),
])
def test_tasks_record_the_host_the_api_server_finds_the_log_server_at(monkeypatch, host, expected):
    monkeypatch.setenv(log_server.HOST_ENV, host)
    assert log_server.hostname() == expected
