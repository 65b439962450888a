"""A 3-node NATS cluster whose nodes are cut off from each other by a real network
partition: each `nats-server`, and each client process the tests start, runs in a network
namespace of its own, joined to a router namespace by a veth pair (node k: 10.77.k.2,
its router side 10.77.k.1). A partition is a `blackhole` rule of the router's (packets
from one address to another are dropped silently, as a cut link drops them; the
processes keep running and their TCP connections stay open). Needs root and `ip`
(iproute2); `missing()` says what is missing, for a skip. Nothing is changed outside the
namespaces this module creates, and `close()` deletes them (their veths go with them).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from _nats import MAX_PAYLOAD, server_binary

__all__ = ["NetnsCluster", "missing"]

NODES = {"n1": 1, "n2": 2, "n3": 3, "c1": 100, "c2": 101}
SERVERS = ("n1", "n2", "n3")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def missing() -> str | None:
    """Why network namespaces cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "needs ip (iproute2)"
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    probe = f"jp{os.getpid() % 100000}probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def address(node: str) -> str:
    return f"10.77.{NODES[node]}.2"


class NetnsCluster:
    """Three JetStream nodes (n1..n3) and two client namespaces (c1, c2) behind a router."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.prefix = f"jp{os.getpid() % 100000}"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._made: list[str] = []

    def ns(self, node: str) -> str:
        return f"{self.prefix}{node}"

    @property
    def router(self) -> str:
        return f"{self.prefix}r"

    @property
    def url(self) -> str:
        return self.url_of(*SERVERS)

    @staticmethod
    def url_of(*nodes: str) -> str:
        return "nats://" + ",".join(f"{address(n)}:4222" for n in nodes)

    def start(self) -> None:
        self._add_ns(self.router)
        _ip("netns", "exec", self.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for node, k in NODES.items():
            ns, outside, inside = self.ns(node), f"{self.prefix}x{k}", f"{self.prefix}y{k}"
            self._add_ns(ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "netns", self.router)
            _ip("link", "set", inside, "netns", ns)
            _ip("-n", self.router, "addr", "add", f"10.77.{k}.1/24", "dev", outside)
            _ip("-n", self.router, "link", "set", outside, "up")
            _ip("-n", ns, "addr", "add", f"{address(node)}/24", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "default", "via", f"10.77.{k}.1")
        for node in SERVERS:
            self._start_server(node)

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)

    def _start_server(self, node: str) -> None:
        routes = ", ".join(f"nats-route://{address(s)}:6222" for s in SERVERS)
        config = self.root / f"{node}.conf"
        config.write_text(
            f"listen: {address(node)}:4222\nserver_name: {node}\nmax_payload: {MAX_PAYLOAD}\n"
            f"jetstream {{\n  store_dir: {self.root / 'data' / node}\n  sync_interval: always\n"
            "  max_file_store: 1G\n  max_memory_store: 64M\n}\n"
            f"cluster {{\n  name: jsp\n  listen: {address(node)}:6222\n  routes: [{routes}]\n}}\n"
        )
        with open(self.root / f"{node}.log", "ab") as log:
            self.processes[node] = subprocess.Popen(
                ["ip", "netns", "exec", self.ns(node), server_binary(), "-c", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def run(self, node: str, code: str, *args: str) -> subprocess.Popen[str]:
        """A Python process in `node`'s namespace (c1, c2) running `code` with `args`,
        the project on its path; its stdin and stdout are pipes."""
        project = str(Path(__file__).resolve().parent.parent)
        return subprocess.Popen(
            ["ip", "netns", "exec", self.ns(node), sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": project},
        )

    def cut(self, group: list[str], others: list[str]) -> None:
        """Drop every packet between a node of `group` and a node of `others`."""
        for a in group:
            for b in others:
                for x, y in ((a, b), (b, a)):
                    _ip(
                        "-n",
                        self.router,
                        "rule",
                        "add",
                        "from",
                        address(x),
                        "to",
                        address(y),
                        "blackhole",
                        "priority",
                        "100",
                    )

    def reset(self, node: str, others: list[str]) -> None:
        """Close `node`'s TCP connections to `others` at once (as a reset does), so that
        its clients reconnect now rather than when their pings go unanswered."""
        for other in others:
            subprocess.run(
                ["ip", "netns", "exec", self.ns(node), "ss", "-K", "dst", address(other)],
                check=True,
                capture_output=True,
            )

    def heal(self) -> None:
        while _ip("-n", self.router, "rule", "del", "priority", "100", check=False).returncode == 0:
            pass

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)
        self.processes.clear()
        for name in reversed(self._made):
            _ip("netns", "del", name, check=False)
        self._made.clear()
