"""tests/server/tcp_proxy.py - a TCP forwarder in front of a server, for dropped connections with
the server up (test_journal*.py, tools/soak_restart.py --cuts): cut() closes every connection open
through it; new connections still go through."""
import socket
import threading


class Proxy:
    """A TCP forwarder in front of a server: cut() closes every connection open through it (a
    dropped network path, the server up); new connections still go through."""

    def __init__(self, port):
        self.port, self.lock, self.conns = port, threading.Lock(), []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.target = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.sock.accept()
                b = socket.create_connection(("127.0.0.1", self.port))
            except OSError:
                return
            with self.lock:
                self.conns += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(x, y), daemon=True).start()

    @staticmethod
    def _pump(x, y):
        try:
            while data := x.recv(65536):
                y.sendall(data)
        except OSError:
            pass

    def cut(self):
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass

    def close(self):
        self.sock.close()
        self.cut()
