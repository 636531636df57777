"""The relay behind a test-bed VM's guestfwd: one guest connection <-> 127.0.0.1:PORT on this machine.

QEMU runs it once per connection the guest opens to the forwarded address (`guestfwd=...-cmd:`), with the
connection on stdin/stdout; a `tcp:` chardev there would serve one connection only. It connects to
loopback and nowhere else (the test bed's network rule).

    python3 qemuvm_relay.py PORT
"""

from __future__ import annotations

import os
import selectors
import socket
import sys


def relay(port: int) -> None:
    upstream = socket.create_connection(("127.0.0.1", port), timeout=30)
    upstream.settimeout(None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(upstream, selectors.EVENT_READ)
    open_directions = 2
    while open_directions:
        for key, _ in selector.select():
            if key.fileobj == 0:
                data = os.read(0, 65536)
                if data:
                    upstream.sendall(data)
                else:
                    upstream.shutdown(socket.SHUT_WR)
                    selector.unregister(0)
                    open_directions -= 1
            else:
                data = upstream.recv(65536)
                if data:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(1, view):]
                else:
                    # The server is done: pass its EOF on at once (QEMU closes the guest's connection when
                    # this end of the chardev closes), so a client reading to EOF never waits on us.
                    selector.unregister(upstream)
                    os.close(1)
                    open_directions -= 1


if __name__ == "__main__":
    relay(int(sys.argv[1]))
