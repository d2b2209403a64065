"""An address beyond the host, for tests of what a sandbox's network reaches: a test host in a network namespace of
its own, joined to the host by a veth pair, serving HTTP with the address each request came from.

A sandbox that may use the network should reach it (and, from the local backend, only as the host: slirp4netns
opens the connection as an ordinary socket of the host, so the test host sees the host's end of the veth); one that
may not should not. The test host is the only target: its subnet is a private /30 that no route of the host
overlaps, and everything is removed on exit (the namespace, and with it the veth pair; the server; the one
FORWARD rule that lets docker's bridges reach it through Docker's DROP policy). Needs root, iproute2 and iptables:
`tests.netns_cluster.require_netns` skips or fails the test where they are missing.

`Canary` is the other side: a service of the host itself, on every address, that counts who reached it.
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from tests.netns_cluster import require_netns

SERVER = r"""
import socketserver, sys
class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        body = ("from " + self.client_address[0]).encode()
        self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
# Not http.server: its bind looks the host name up, which hangs where no resolver answers (this namespace).
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer((sys.argv[1], int(sys.argv[2])), Echo).serve_forever()
"""


@dataclass(frozen=True)
class OutsideHost:
    """The test host: its `url`, its address, and the host's own address on the link (`host_side`)."""

    address: str
    host_side: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


def _free_subnet() -> int:
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
    for _ in range(100):
        x = random.randrange(256)
        if f"10.231.{x}." not in routes:
            return x
    raise RuntimeError("no free 10.231.X.0/30 subnet for the outside host")


@contextlib.contextmanager
def outside_host() -> Iterator[OutsideHost]:
    require_netns()
    tag = uuid.uuid4().hex[:6]
    ns, host_if, ns_if = f"rgout{tag}", f"rgoh{tag}", f"rgon{tag}"
    x = _free_subnet()
    here, there, port = f"10.231.{x}.1", f"10.231.{x}.2", 8080
    rule = ["FORWARD", "-o", host_if, "-m", "comment", "--comment", f"rgout-{tag}", "-j", "ACCEPT"]
    server = None
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", ns)
        _run("ip", "addr", "add", f"{here}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{there}/30", "dev", ns_if)
        _run("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _run("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", here)
        _run("iptables", "-w", "-I", *rule)
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVER, there, str(port)],
                                  stderr=open("/tmp/outside_err.txt", "w"))
        outside = OutsideHost(there, here, port)
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(outside.url, timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the outside host's server did not answer") from None
                time.sleep(0.1)
        yield outside
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["iptables", "-w", "-D", *rule], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)


class Canary:
    """A TCP service on every address of the host that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()
