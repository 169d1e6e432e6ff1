"""Leader election on a Lease (coordination.k8s.io/v1), as client-go's leaderelection does it.

Several operator processes may run (the chart's replicas); only the one holding the Lease runs
kopf and the periodic reconcile, the others wait to take it over. The holder renews the Lease
every `retryPeriodSeconds`; when it cannot for `renewDeadlineSeconds` it stops (and exits, so
its pod restarts as a standby). A standby takes the Lease once the record it observes has not
changed for `leaseDurationSeconds`: timed on its own clock from when it saw the record change,
never by comparing its clock with the holder's time stamps. The deadline is shorter than the
duration, so an old holder has stopped before anyone else may start.

Fencing: the holder may write only while its last renewal is younger than the renew deadline
(`leads`, which the reconcile's API client checks before every write: adapters.kube), whatever
its renewal loop is doing; every Lease request gives up after half the renew deadline, and the
loop declares the Lease lost at the deadline even while a try still hangs. So a holder cut off
from the API server stops writing before a standby may take the Lease.

The Lease's own requests go through their own API client: they are not reconcile writes and
are not counted as such (`specdeploy_api_writes_total`, the `api write:` log lines).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from specdeploy.api.config import LeaderElection

log = logging.getLogger("specdeploy.leader")

MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def default_identity() -> str:
    """A new identity on every call, `<pod>_<uuid>` (the pod's name when the chart sets
    POD_NAME, else the host's), as client-go's `hostname + "_" + uuid`: a process calls it once
    at start. A container that restarts in the same pod is then another candidate, never the
    holder it was before the restart: it waits for its old Lease to expire like a standby."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


def may_take(spec: Mapping[str, Any], identity: str, unchanged_for: float) -> bool:
    """Whether `identity` may write itself into a Lease whose spec is `spec`: it holds it
    already, nobody does, or the holder has not renewed for the Lease's duration (the record
    was seen unchanged that long)."""
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return True
    return unchanged_for >= float(spec.get("leaseDurationSeconds") or 0)


def claimed_spec(
    spec: Mapping[str, Any], identity: str, duration_seconds: float, now: datetime
) -> dict[str, Any]:
    """The Lease spec once `identity` holds (or renews) it at `now`."""
    stamp = now.strftime(MICRO_TIME)
    taken_over = spec.get("holderIdentity") != identity
    transitions = int(spec.get("leaseTransitions") or 0)
    return {
        **spec,
        "holderIdentity": identity,
        "leaseDurationSeconds": max(1, round(duration_seconds)),
        "acquireTime": stamp if taken_over else spec.get("acquireTime", stamp),
        "renewTime": stamp,
        "leaseTransitions": transitions + 1
        if taken_over and spec.get("holderIdentity")
        else transitions,
    }


def released_spec(spec: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The Lease spec its holder leaves on a clean stop: no holder, so a standby takes over
    at once rather than after the Lease's duration."""
    return {
        **spec,
        "holderIdentity": None,
        "leaseDurationSeconds": 1,
        "renewTime": now.strftime(MICRO_TIME),
    }


async def serve_standby_probe(endpoint: str | None) -> Callable[[], Awaitable[None]]:
    """Answers 200 at `endpoint` (the config's livenessEndpoint) while the process waits for the
    Lease, so a standby pod is live and ready (a rolling update waits for the new pod to be
    ready) before kopf serves that endpoint itself; returns what stops it."""
    if not endpoint:
        return _nothing
    parts = urllib.parse.urlsplit(endpoint)

    async def standby(_: web.Request) -> web.Response:
        return web.json_response({"standby": True})

    app = web.Application()
    app.router.add_get(parts.path or "/", standby)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, parts.hostname, parts.port).start()
    return runner.cleanup


async def _nothing() -> None:
    return None


@dataclass
class _Observed:
    spec: dict[str, Any] | None = None
    since: float = 0.0


class LeaseElector:
    """Takes, keeps and releases one Lease for one identity."""

    def __init__(
        self,
        api: client.CoordinationV1Api,
        settings: LeaderElection,
        identity: str,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.settings = settings
        self.identity = identity
        self.monotonic = monotonic
        self.now = now
        self.held = False
        #: When the Lease was last taken or renewed (monotonic), while held.
        self.renewed_at = 0.0
        self._observed = _Observed()
        # Each request of the Lease's own gives up well within the renew deadline.
        self._timeout = max(0.1, settings.renew_deadline_seconds / 2)

    def leads(self) -> bool:
        """Whether this process may write now: it holds the Lease, renewed less than the renew
        deadline ago (by then a standby may not yet take it: the deadline ends before the
        Lease's duration does)."""
        return (
            self.held and self.monotonic() - self.renewed_at < self.settings.renew_deadline_seconds
        )

    @property
    def where(self) -> str:
        return f"Lease {self.settings.namespace}/{self.settings.lease_name}"

    def try_acquire_or_renew(self) -> bool:
        """One try: True when this identity holds the Lease afterwards."""
        namespace, name = self.settings.namespace, self.settings.lease_name
        duration = self.settings.lease_duration_seconds
        try:
            lease = self.api.read_namespaced_lease(name, namespace, _request_timeout=self._timeout)
        except ApiException as error:
            if error.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                spec=claimed_spec({}, self.identity, duration, self.now()),
            )
            try:
                self.api.create_namespaced_lease(namespace, body, _request_timeout=self._timeout)
            except ApiException as conflict:
                if conflict.status == 409:  # another process created it first
                    return False
                raise
            return True
        spec = self.api.api_client.sanitize_for_serialization(lease.spec) or {}
        if spec != self._observed.spec:
            self._observed = _Observed(spec, self.monotonic())
        if not may_take(spec, self.identity, self.monotonic() - self._observed.since):
            return False
        claimed = claimed_spec(spec, self.identity, duration, self.now())
        try:
            # The read's resourceVersion makes this a compare-and-swap: two standbys racing
            # for an expired Lease cannot both win.
            self.api.replace_namespaced_lease(
                name, namespace, self._body(lease, claimed), _request_timeout=self._timeout
            )
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def _body(self, lease: client.V1Lease, spec: dict[str, Any]) -> client.V1Lease:
        """The Lease `lease` as read, with `spec`: a replace of exactly that version (the
        client sends a dict body as it is)."""
        metadata = lease.metadata or client.V1ObjectMeta()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": metadata.name,
                "namespace": metadata.namespace,
                "resourceVersion": metadata.resource_version,
            },
            "spec": spec,
        }
        return cast(client.V1Lease, body)

    def _try(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except (ApiException, OSError) as error:
            log.warning("%s: %s", self.where, error)
            return False

    async def acquire(self) -> None:
        """Returns once this identity holds the Lease, trying every retry period."""
        waiting_logged = False
        while not await asyncio.to_thread(self._try):
            if not waiting_logged:
                holder = (self._observed.spec or {}).get("holderIdentity")
                log.info("standing by: %s is held by %s", self.where, holder)
                waiting_logged = True
            await asyncio.sleep(self.settings.retry_period_seconds)
        self.held = True
        self.renewed_at = self.monotonic()
        log.info("leading: %s is held by %s", self.where, self.identity)

    async def keep(self, lost: asyncio.Event) -> None:
        """Renews the Lease every retry period; sets `lost` and returns when renewing failed
        for the renew deadline (another process may then take the Lease)."""
        deadline = self.settings.renew_deadline_seconds
        while True:
            await asyncio.sleep(self.settings.retry_period_seconds)
            left = deadline - (self.monotonic() - self.renewed_at)
            try:
                # A try that hangs past the deadline counts as failed (its thread ends with
                # its request's timeout).
                renewed = await asyncio.wait_for(
                    asyncio.to_thread(self._try), timeout=max(left, 0.01)
                )
            except TimeoutError:
                renewed = False
            if renewed:
                self.renewed_at = self.monotonic()
            elif self.monotonic() - self.renewed_at >= deadline:
                self.held = False
                log.error(
                    "lost %s: not renewed for %.0fs",
                    self.where,
                    self.monotonic() - self.renewed_at,
                )
                lost.set()
                return

    def release(self) -> None:
        """Leaves the Lease without holder, when this identity still holds it."""
        if not self.held:
            return
        self.held = False
        namespace, name = self.settings.namespace, self.settings.lease_name
        try:
            lease = self.api.read_namespaced_lease(name, namespace, _request_timeout=self._timeout)
            spec = self.api.api_client.sanitize_for_serialization(lease.spec) or {}
            if spec.get("holderIdentity") != self.identity:
                return
            released = released_spec(spec, self.now())
            self.api.replace_namespaced_lease(
                name, namespace, self._body(lease, released), _request_timeout=self._timeout
            )
            log.info("released %s", self.where)
        except (ApiException, OSError) as error:
            log.warning("could not release %s: %s", self.where, error)
