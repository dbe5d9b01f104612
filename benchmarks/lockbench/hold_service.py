"""A stand-in for the work a lock holder does over the network (a database query, a
call to another service), for ``handover.py --hold query``.

Run as ``python hold_service.py MS SECONDS``: it listens on a free port of 127.0.0.1,
prints the port, then answers each byte received on a connection with that byte once
MS milliseconds have passed (a blocking sleep: no other timer in this process to delay
it). One request at a time, which is enough: only the holder of the lock asks. It stops
by itself after SECONDS, or as soon as its standard input is closed (its parent ended).
"""

from __future__ import annotations

import selectors
import socket
import sys
import time


def serve(delay: float, seconds: float) -> None:
    """Listen, print the port, answer until ``seconds`` have passed or stdin closes."""
    deadline = time.monotonic() + seconds
    selector = selectors.DefaultSelector()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    conns: dict[int, socket.socket] = {}
    print(listener.getsockname()[1], flush=True)
    while time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1.0):
            if key.fd == sys.stdin.fileno():
                if not sys.stdin.readline():
                    return  # the parent is gone
            elif key.fileobj is listener:
                conn, _ = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns[conn.fileno()] = conn
                selector.register(conn, selectors.EVENT_READ)
            else:
                conn = conns[key.fd]
                asked = conn.recv(64)
                if not asked:
                    selector.unregister(conn)
                    del conns[key.fd]
                    conn.close()
                    continue
                time.sleep(delay * len(asked))
                conn.sendall(asked)


if __name__ == "__main__":
    serve(float(sys.argv[1]) / 1000, float(sys.argv[2]))
