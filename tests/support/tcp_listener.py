"""A TCP server on this host's loopback that answers each connection with a tag: a stand-in for a host service
that a container attempt must (or must not) reach."""

from __future__ import annotations

import socket
import threading


class Listener:
    """Listens on 127.0.0.1 on a free port (`port`) and answers each connection with `tag`, in a daemon thread."""

    def __init__(self, tag: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.tag = tag
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.tag)
