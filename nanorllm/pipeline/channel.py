"""Messages between the learner and one worker over two one-way pipes: no lock, and the learner never blocks.

Why not multiprocessing.Queue: its reader blocks until the rest of a message arrives, so a writer
SIGKILLed halfway through a large result hangs the learner for good, and its locks are named
semaphores a killed process can leave held (and leave in /dev/shm when the learner is killed).

Here each worker has a job pipe and a result pipe of its own. The learner's ends are non-blocking:
`Inbox.read()` takes whatever bytes are there and returns only complete messages (a half-written
one stays in the buffer and is dropped with its worker); `Outbox.put()` keeps what the pipe cannot
take now and writes it on the next `flush()`. The worker's ends stay ordinary blocking
`multiprocessing.connection.Connection`s: the framing here is theirs (a 4-byte big-endian length,
or -1 and an 8-byte length for messages over 2 GiB), so `conn.recv()` / `conn.send()` just work.
"""

import os
import pickle
import struct

_LONG = 0x7FFFFFFF


def frame(payload: bytes) -> bytes:
    """The length header `Connection.send_bytes` would write before `payload`."""
    n = len(payload)
    return struct.pack("!i", n) if n <= _LONG else struct.pack("!i", -1) + struct.pack("!Q", n)


class Inbox:
    """The learner's end of a worker's result pipe."""

    def __init__(self, conn):
        self.conn, self.fd = conn, conn.fileno()
        os.set_blocking(self.fd, False)
        self.buf = bytearray()
        self.eof = False

    def read(self) -> list:
        """Every complete message that has arrived; never waits."""
        while not self.eof:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True  # the worker is gone: what is left in buf is a torn message
            self.buf += chunk
        msgs = []
        while (payload := self._next_frame()) is not None:
            msgs.append(pickle.loads(payload))
        return msgs

    def _next_frame(self) -> bytes | None:
        if len(self.buf) < 4:
            return None
        (n,), head = struct.unpack_from("!i", self.buf), 4
        if n == -1:
            if len(self.buf) < 12:
                return None
            (n,), head = struct.unpack_from("!Q", self.buf, 4), 12
        if len(self.buf) < head + n:
            return None
        payload = bytes(self.buf[head:head + n])
        del self.buf[:head + n]
        return payload

    def close(self) -> None:
        self.conn.close()


class Outbox:
    """The learner's end of a worker's job pipe."""

    def __init__(self, conn):
        self.conn, self.fd = conn, conn.fileno()
        os.set_blocking(self.fd, False)
        self.pending = bytearray()

    def put(self, msg) -> None:
        payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        self.pending += frame(payload) + payload
        self.flush()

    def flush(self) -> None:
        """Write as much of what is pending as the pipe takes now."""
        while self.pending:
            try:
                n = os.write(self.fd, self.pending)
            except BlockingIOError:
                return
            except OSError:  # the worker is gone; its jobs are re-issued elsewhere
                self.pending.clear()
                return
            del self.pending[:n]

    def close(self) -> None:
        self.conn.close()
