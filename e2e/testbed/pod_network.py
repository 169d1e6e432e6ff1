"""Network namespaces of the pods the process kubelet runs from an image: their ports, and
what they reach.

A pod run from the image map (the chart's operator, `helm test`'s pod) listens on the fixed
ports its image and config say (the operator on 0.0.0.0:8080 and :8081): two replicas on one
host would collide. So such a pod gets a network namespace of its own (`container_init.py`
enters it and brings its loopback up), and this module joins it to the host with user-space
TCP forwarding, nothing else (no interfaces, no addresses outside the loopback range):

- into the pod: each port its containers declare gets a free port on the host's 127.0.0.1 that
  forwards to that port in the pod (probes, Prometheus and tests use it);
- out of the pod: the host ports it must reach (the API server, Prometheus) are listened on at
  the same 127.0.0.1 port inside the pod and forwarded to the host's, so the addresses in its
  config and in KUBERNETES_SERVICE_HOST/PORT work unchanged;
- Services: each Service with a selector has an address in 127.0.0.0/8 (from its ClusterIP:
  10.96.3.7 → 127.96.3.7) inside every such pod, with its name in the pod's /etc/hosts
  (`<svc>.<ns>.svc[.cluster.local]`), listening on the Service's ports and forwarding each
  connection to a ready pod it selects, at the target port. A Service port that the pod itself
  declares is left out in that pod: the pod listens on it on every address, and Linux refuses
  a second listener on the same port (kube-proxy's rules have no such limit).

Sockets inside a pod's namespace are made by a short-lived thread that enters the namespace
(setns) and leaves it: a socket belongs to the namespace it was made in, whatever thread uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import logging
import os
import random
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("process-kubelet.network")

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]

LOOPBACK = "127.0.0.1"
BUFFER = 65536


def service_address(cluster_ip: str) -> str | None:
    """The address standing in for a ClusterIP inside pods: 127 and its last three octets."""
    try:
        address = ipaddress.IPv4Address(cluster_ip)
    except ValueError:
        return None
    _, b, c, d = address.packed
    return f"127.{b}.{c}.{d}"


def hosts_file_text(services: Sequence[Mapping[str, Any]]) -> str:
    """/etc/hosts of pods with a network of their own: localhost, then each Service's names."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for service in services:
        address = service_address(str((service.get("spec") or {}).get("clusterIP") or ""))
        if address is None:
            continue
        name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
        lines.append(
            f"{address}\t{name}.{namespace}.svc.cluster.local {name}.{namespace}.svc "
            f"{name}.{namespace}"
        )
    return "\n".join(lines) + "\n"


def socket_in_namespace(pid: int, make: Callable[[], socket.socket]) -> socket.socket:
    """A socket made inside the network namespace of process `pid`. Raises OSError when that
    process is gone (FileNotFoundError for its namespace) or the namespace cannot be entered."""
    result: list[socket.socket | BaseException] = []

    def enter_and_make() -> None:
        try:
            with contextlib.ExitStack() as files:
                own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
                files.callback(os.close, own)
                # The process may have ended since it was started: the error goes to the caller.
                target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
                files.callback(os.close, target)
                if _libc.setns(target, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into pid {pid}'s network")
                try:
                    result.append(make())
                finally:
                    if _libc.setns(own, CLONE_NEWNET) != 0:
                        # A thread stuck in a pod's namespace must not go on: it ends here anyway.
                        log.error("could not leave pid %d's network namespace", pid)
        except BaseException as error:
            result.append(error)

    thread = threading.Thread(target=enter_and_make, name=f"netns {pid}", daemon=True)
    thread.start()
    thread.join()
    (made,) = result
    if isinstance(made, BaseException):
        raise made
    return made


def _listener(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(64)
    sock.setblocking(False)
    return sock


def _unconnected() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def loopback_up() -> None:
    """Bring `lo` up in the calling thread's network namespace (SIOCSIFFLAGS)."""
    import fcntl  # noqa: PLC0415 - only where a namespace is set up
    import struct  # noqa: PLC0415

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b"\0" * 14))


Connector = Callable[[], "socket.socket | None"]
"""Makes an unconnected socket for a new connection, and says where to: see `Route`."""


@dataclass(frozen=True)
class Route:
    """Where one accepted connection goes: a socket to connect (made where the destination
    is reachable) and the address to connect it to."""

    make: Callable[[], socket.socket]
    address: tuple[str, int]


class Forwarder:
    """One asyncio loop, in its own thread, that runs every forwarding listener."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="forwarder", daemon=True)
        self._thread.start()

    def listen(
        self, sock: socket.socket, route: Callable[[], Route | None], what: str
    ) -> asyncio.AbstractServer:
        """Forward every connection accepted on `sock` to where `route()` says (none: closed);
        returns the server, which `close_all` stops."""

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                chosen = route()
                if chosen is None:
                    return
                outbound = chosen.make()
                await self.loop.sock_connect(outbound, chosen.address)
                out_reader, out_writer = await asyncio.open_connection(sock=outbound)
            except (OSError, RuntimeError) as error:
                log.debug("%s: no connection (%s)", what, error)
                writer.close()
                return
            await asyncio.gather(
                _pipe(reader, out_writer), _pipe(out_reader, writer), return_exceptions=True
            )

        async def start() -> asyncio.AbstractServer:
            return await asyncio.start_server(serve, sock=sock)

        return asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=10)

    def close_all(self, servers: list[asyncio.AbstractServer]) -> None:
        """Stop these servers listening (connections in flight end with their peers). Through
        the server, never the socket alone: the loop's selector still watches its descriptor."""
        for server in servers:
            self.loop.call_soon_threadsafe(server.close)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(BUFFER):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


class PodNetwork:
    """The forwarding of one running container with a network namespace of its own."""

    def __init__(
        self, forwarder: Forwarder, pid: int, what: str, own_ports: frozenset[int] = frozenset()
    ) -> None:
        self.forwarder = forwarder
        self.pid = pid
        self.what = what
        #: The ports the pod's containers declare: the pod binds them on every address, so a
        #: Service on one of them is not listened on in this pod (Linux refuses both).
        self.own_ports = own_ports
        self._servers: list[asyncio.AbstractServer] = []
        self._services: set[tuple[str, int]] = set()

    def expose(self, container_port: int) -> int:
        """A host port on 127.0.0.1 forwarding into the pod's `container_port`."""
        # Listening from the moment of the pick: nothing can take the port in between.
        sock = _listener(LOOPBACK, 0)
        host_port = int(sock.getsockname()[1])
        pid = self.pid

        def route() -> Route:
            return Route(lambda: socket_in_namespace(pid, _unconnected), (LOOPBACK, container_port))

        self._servers.append(self.forwarder.listen(sock, route, f"{self.what}:{container_port}"))
        return host_port

    def reach_host(self, port: int) -> None:
        """The host's 127.0.0.1:`port` at the same address inside the pod."""
        sock = socket_in_namespace(self.pid, lambda: _listener(LOOPBACK, port))
        self._servers.append(
            self.forwarder.listen(
                sock, lambda: Route(_unconnected, (LOOPBACK, port)), f"{self.what}->host:{port}"
            )
        )

    def reach_service(self, address: str, port: int, route: Callable[[], Route | None]) -> None:
        """A Service's address and port inside the pod, routed by `route` per connection."""
        if (address, port) in self._services or port in self.own_ports:
            return
        sock = socket_in_namespace(self.pid, lambda: _listener(address, port))
        self._servers.append(self.forwarder.listen(sock, route, f"{self.what}->{address}:{port}"))
        self._services.add((address, port))

    def close(self) -> None:
        self.forwarder.close_all(self._servers)
        self._servers = []


def unconnected_socket() -> socket.socket:
    """A new TCP socket, not yet connected (for `Route.make`)."""
    return _unconnected()


BackendLookup = Callable[[str, Mapping[str, str], "int | str"], list[Route]]
"""`(namespace, selector, target port)` → the routes to every ready pod behind a Service."""


class Networking:
    """What every pod with a network of its own shares: the forwarder, the host ports it may
    reach, the Services (listed every `refresh_seconds`) and the /etc/hosts naming them."""

    def __init__(self, hosts_file: Path, host_ports: tuple[int, ...]) -> None:
        self.forwarder = Forwarder()
        self.hosts_file = hosts_file
        self.host_ports = host_ports
        self.find_backends: BackendLookup = lambda namespace, selector, port: []
        self._lock = threading.Lock()
        self._services: list[Mapping[str, Any]] = []
        self.write_hosts([])

    def write_hosts(self, services: Sequence[Mapping[str, Any]]) -> None:
        """Rewrite the hosts file in place: containers have it bind-mounted (one inode)."""
        text = hosts_file_text(services)
        with contextlib.suppress(FileNotFoundError):
            if self.hosts_file.read_text() == text:
                return
        with self.hosts_file.open("r+" if self.hosts_file.exists() else "w") as handle:
            handle.seek(0)
            handle.write(text)
            handle.truncate()

    def observe_services(self, services: Sequence[Mapping[str, Any]]) -> None:
        """The Services now (each with a selector and a ClusterIP)."""
        usable = [
            s
            for s in services
            if (s.get("spec") or {}).get("selector")
            and service_address(str((s.get("spec") or {}).get("clusterIP") or ""))
        ]
        with self._lock:
            self._services = usable
        self.write_hosts(usable)

    def reach_services(self, net: PodNetwork) -> None:
        """Every Service's address and ports inside the pod of `net` (new ones only)."""
        with self._lock:
            services = list(self._services)
        for service in services:
            spec = service["spec"]
            address = service_address(str(spec["clusterIP"]))
            assert address is not None
            namespace, selector = service["metadata"]["namespace"], dict(spec["selector"])
            for port in spec.get("ports") or []:
                target = port.get("targetPort") or port["port"]

                def route(
                    namespace: str = namespace,
                    selector: dict[str, str] = selector,
                    target: Any = target,
                ) -> Route | None:
                    routes = self.find_backends(namespace, selector, target)
                    return random.choice(routes) if routes else None

                try:
                    net.reach_service(address, int(port["port"]), route)
                except OSError as error:
                    log.warning("%s: Service %s not reachable: %s", net.what, address, error)
