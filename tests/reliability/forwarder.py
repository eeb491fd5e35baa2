"""A TCP forwarder that can cut every connection through it and refuse new ones for a
while: the KV-event stream between an engine and the gateway, cut and resumed."""

from __future__ import annotations

import contextlib
import socket
import threading


class Forwarder:
    """Listens on ``port`` (a free one) and forwards each connection to ``target``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.cut_now = False
        self.accepted = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_now:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self.accepted += 1
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Close every forwarded connection; refuse new ones until :meth:`resume`."""
        self.cut_now = True
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()

    def resume(self) -> None:
        self.cut_now = False

    def close(self) -> None:
        self._stop = True
        self.cut()
        self.listener.close()
