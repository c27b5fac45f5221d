"""A stand-in for a cluster's proxy, for the tests and the fault suite: clients that must not use the proxy
variables for a loopback server (the --agent endpoint, an LLM judge on 127.0.0.1) are run with them set to it,
and the connections it was offered are counted: any at all means a request, and the key it carried, went to the
proxy."""

import socket
import threading


class ProxyTrap:
    """A TCP listener standing in for a cluster's proxy: it counts the connections it is offered."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.url, self.connections, self.stop = f"http://127.0.0.1:{self.sock.getsockname()[1]}", 0, False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def env(self) -> dict[str, str]:
        """The proxy variables, every one pointing here, and no NO_PROXY exceptions."""
        return {k: self.url for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                                      "all_proxy")} | {"NO_PROXY": "", "no_proxy": ""}

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        self.sock.close()
