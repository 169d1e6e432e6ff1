"""Operator kills at random moments, and a sampler proving some revision serves throughout.

`OperatorKiller` SIGKILLs the operator process at seeded random moments of a rollout and starts
a new one at once, as a node failure or an OOM kill followed by a restart would; it records
where each kill landed (the SD's phase and analysis interval). `ServingSampler` lists the SD's
pods in a background thread: every sample must find a Ready pod of some revision.

The seed comes from `SPECDEPLOY_FAULT_SEED` (else it is drawn and printed, so a failing run can
be replayed); the number of kills per rollout from `SPECDEPLOY_FAULT_KILLS` (1 in CI, more in
`make soak`), at most `SPECDEPLOY_FAULT_SPREAD` seconds apart. With `SPECDEPLOY_FAULT_RESULTS`
set, each run appends one JSON line there.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

from background import Background
from engine_cluster import REVISION_LABEL, OperatorProcess, revision_pods
from specdeploy.api.times import parse_time
from testbed import Kubectl, eventually
from testbed.conditions import is_serving

#: The test each seed was drawn for (fault_seed), to name a run's kills in the results.
NAMES: dict[int, str] = {}


def fault_seed(name: str) -> int:
    """The seed of this test's random kill points, printed so the run can be replayed.

    Drawn afresh unless `SPECDEPLOY_FAULT_SEED` is set; each test mixes its name in, so one
    base seed gives every test its own kill points.
    """
    given = os.environ.get("SPECDEPLOY_FAULT_SEED")
    base = int(given) if given else random.SystemRandom().randrange(1 << 32)
    seed = (base + zlib.crc32(name.encode())) % (1 << 32)
    NAMES[seed] = name
    print(f"\n{name}: fault seed {seed} (replay with SPECDEPLOY_FAULT_SEED={base})")
    return seed


def kills_per_rollout() -> int:
    return max(1, int(os.environ.get("SPECDEPLOY_FAULT_KILLS", "1")))


def kill_spread() -> float:
    """The most seconds between a restart and the next kill (SPECDEPLOY_FAULT_SPREAD)."""
    return max(2.0, float(os.environ.get("SPECDEPLOY_FAULT_SPREAD", "15")))


#: A sample taken while the API server did not answer: which revisions served is unknown.
UNKNOWN = None


@dataclass
class ServingSampler(Background):
    """Polls one SD's pods in a background thread: the revisions with a Ready pod, per sample.

    A sample the API server did not answer (restarting, etcd paused) is kept as unknown
    (`UNKNOWN` in place of the revisions), counted and reported; it is neither a gap nor a
    serving sample.
    """

    kubectl: Kubectl
    namespace: str
    name: str
    period: float = 1.0
    samples: list[tuple[float, tuple[str, ...] | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    thread_name = "serving sampler"

    #: Samples (known ones) taken before the sampler stops: a rollout can end within a few
    #: samples, and the moments after it count too (the new revision must go on serving).
    min_samples: int = 5

    def __enter__(self) -> Self:
        self._began = time.monotonic()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        deadline = time.monotonic() + 60
        while len(self.known()) < self.min_samples and time.monotonic() < deadline:
            time.sleep(self.period)
        super().__exit__(*exc)

    def run_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            at = round(time.monotonic() - self._began, 1)
            try:
                pods = revision_pods(self.kubectl, self.namespace, self.name)
            except Exception as error:  # the API server itself down: which revisions served
                self.errors.append(f"{at}s: {error}")  # is unknown at this moment
                self.samples.append((at, UNKNOWN))
            else:
                serving = sorted(
                    {p["metadata"]["labels"][REVISION_LABEL] for p in pods if is_serving(p)}
                )
                self.samples.append((at, tuple(serving)))
            stop.wait(self.period)

    def known(self) -> list[tuple[float, tuple[str, ...]]]:
        """The samples the API server answered."""
        return [(at, serving) for at, serving in self.samples if serving is not UNKNOWN]

    def unknown(self) -> list[float]:
        """The moments (seconds since the start) at which the API server did not answer."""
        return [at for at, serving in self.samples if serving is UNKNOWN]

    def gaps(self) -> list[float]:
        """The moments (seconds since the start) at which no revision had a Ready pod."""
        return [at for at, serving in self.known() if not serving]

    def report(self) -> str:
        unknown = self.unknown()
        span = f", from {unknown[0]}s to {unknown[-1]}s" if unknown else ""
        return (
            f"{len(self.samples)} samples: {len(self.known())} answered, {len(self.gaps())} "
            f"with no revision serving, {len(unknown)} unknown (API server not answering{span})"
        )

    def check(self) -> None:
        """Asserts that enough samples were answered and that every one found a revision
        serving; prints how many were unknown."""
        print(f"serving sampler: {self.report()}")
        assert len(self.known()) >= self.min_samples, ("too few samples", self.samples, self.errors)
        assert not self.gaps(), ("no revision served at", self.gaps(), self.samples)


#: Where a kill landed, from the SD's status just before it.
BEFORE, DURING, AFTER = "before the analysis", "during the analysis", "after the outcome"


def where_it_landed(status: Mapping[str, Any], judged: str = "analysis") -> str:
    """Whether the SD was still being judged, already decided, or not yet judged, by what is
    `judged`: a canary's `analysis` (under way, then Promote or Rollback) or the `collapse`
    guard (counting below its floor, then fired)."""
    if judged == "collapse":
        collapse = status.get("collapse") or {}
        if collapse.get("triggered"):
            return AFTER
        return DURING if collapse.get("belowSince") else BEFORE
    analysis = status.get("analysis") or {}
    if analysis.get("outcome") in ("Promote", "Rollback"):
        return AFTER
    return DURING if analysis.get("startedAt") and status.get("canaryRevision") else BEFORE


#: Seconds after a decision's status write within which a SIGKILL can still take its Event with
#: it: the operator posts Events from a thread of its own once the reconcile that decided has
#: ended, and what is still waiting dies with the process (handlers.run.EventPoster: Events are
#: best effort, the status and its conditions are the record that survives).
EVENT_AFTER_STATUS_S = 3.0


@dataclass
class KillPoint:
    """One SIGKILL: seconds after the killer started, where it landed (from the SD just before
    the kill), and the SD as the new process found it; `wall` is the kill's wall-clock time."""

    at: float
    wall: float
    landed: str
    interval_before: int | None
    phase: str | None
    analysis_interval: int | None
    analysis_outcome: str | None
    down_for: float


@dataclass
class OperatorKiller(Background):
    """SIGKILLs the operator `count` times at seeded random moments and restarts it each time.

    With `window` (seconds: how long the analysis is expected to take from the moment the
    killer starts) the kill moments are drawn uniformly inside it, so they land while the
    rollout is being judged; a kill never comes before the previous new process reconciled, so
    on a slow machine the later ones can land after the outcome, and `landed()` says how many
    landed where. Without it each kill comes a random 1 to `spread` seconds after the previous
    process started. The new process starts at once.

    `finish` waits for the planned kills and then proves the last process alive: it makes a
    harmless change of spec (the revision history limit, one up) and waits for the status to
    observe that generation, a write only a live, reconciling operator makes.
    """

    operator: OperatorProcess
    kubectl: Kubectl
    namespace: str
    name: str
    seed: int
    count: int
    window: float | None = None
    #: What the kills are meant to land in: a canary's "analysis" or the "collapse" guard.
    judged: str = "analysis"
    spread: float = field(default_factory=kill_spread)
    kills: list[KillPoint] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    thread_name = "operator killer"
    join_seconds = 120.0

    def __enter__(self) -> Self:
        self._rng = random.Random(self.seed)
        self._began = time.monotonic()
        self._plan = (
            sorted(self._rng.uniform(1.0, max(1.0, self.window)) for _ in range(self.count))
            if self.window is not None
            else []
        )
        return super().__enter__()

    def __exit__(self, *_: object) -> None:
        super().__exit__()
        if self.operator.process is None:  # stopped between a kill and its restart
            self.operator.start()
        # The kills are written whatever the test's end, so a failed run shows them too.
        _append({"test": NAMES.get(self.seed, ""), "seed": self.seed, "kills": self.points()})

    def points(self) -> list[dict[str, Any]]:
        return [asdict(k) for k in self.kills]

    def landed(self) -> dict[str, int]:
        """How many kills landed before the analysis, during it and after its outcome."""
        return {
            where: sum(k.landed == where for k in self.kills) for where in (BEFORE, DURING, AFTER)
        }

    def finish(self, timeout: float = 600) -> None:
        """Waits until every planned kill happened, each followed by a reconcile of the new
        process, then proves the last process alive (a generation it alone can observe)."""
        self.thread.join(timeout=timeout)
        assert not self.thread.is_alive(), ("the killer did not finish", self.kills)
        assert len(self.kills) == self.count, (self.kills, self.errors)
        assert not self.errors, self.errors
        print(f"operator kills: {self.landed()}")
        self.prove_alive()

    def prove_alive(self, timeout: float = 120) -> None:
        """A spec change that starts no pods; the status observing its generation is written by
        the running operator (a dead one, or one that never reconciles, leaves it behind)."""
        sd = self.kubectl.get_json("sd", self.name, "-n", self.namespace)
        limit = int(sd["spec"].get("revisionHistoryLimit", 5))
        patch = {"spec": {"revisionHistoryLimit": limit + 1 if limit < 50 else limit - 1}}
        self.kubectl.run(
            "patch", "sd", self.name, "-n", self.namespace, "--type=merge", "-p", json.dumps(patch)
        )
        generation = self.kubectl.get_json("sd", self.name, "-n", self.namespace)["metadata"][
            "generation"
        ]
        eventually(
            lambda: self._status().get("observedGeneration", 0) >= generation,
            timeout,
            f"the operator's last process to observe generation {generation}",
        )

    def _next_kill_at(self, index: int) -> float:
        """Seconds to wait before kill `index`."""
        if self._plan:
            return max(0.0, self._began + self._plan[index] - time.monotonic())
        return self._rng.uniform(1.0, self.spread)

    def run_loop(self, stop: threading.Event) -> None:
        for index in range(self.count):
            if stop.wait(self._next_kill_at(index)):
                return
            try:
                before = self._status()
            except Exception as error:  # where it landed is then unknown
                self.errors.append(f"reading the SD before kill {index + 1}: {error}")
                before = {}
            at = round(time.monotonic() - self._began, 1)
            offset = len(self.operator.log_text())
            wall = time.time()
            self.operator.kill()
            self.operator.start()
            began = time.monotonic()
            try:
                # The new process is alive and has looked at the SD before the next kill.
                self.operator.wait_for_reconciles(offset, self.namespace, self.name)
                status = self._status()
            except Exception as error:
                self.errors.append(f"after the kill at {at}s: {error}")
                status = {}
            analysis = status.get("analysis") or {}
            self.kills.append(
                KillPoint(
                    at=at,
                    wall=round(wall, 3),
                    landed=where_it_landed(before, self.judged) if before else "unknown",
                    interval_before=(before.get("analysis") or {}).get("lastInterval"),
                    phase=status.get("phase"),
                    analysis_interval=analysis.get("lastInterval"),
                    analysis_outcome=analysis.get("outcome"),
                    down_for=round(time.monotonic() - began, 1),
                )
            )
            print(f"operator SIGKILLed at {at}s: {self.kills[-1]}")

    def _status(self) -> dict[str, Any]:
        sd = self.kubectl.get_json("sd", self.name, "-n", self.namespace)
        found: dict[str, Any] = sd.get("status") or {}
        return found

    def may_have_taken_the_event(self, decided: str) -> KillPoint | None:
        """The kill that may have taken with it the Event of a decision whose status stamp
        (a condition's `lastTransitionTime`, whole seconds) is `decided`: one that landed from
        that second to EVENT_AFTER_STATUS_S after it. None: no kill could have, so the Event
        must be there."""
        stamp = parse_time(decided).timestamp()
        for kill in self.kills:
            if stamp <= kill.wall <= stamp + 1 + EVENT_AFTER_STATUS_S:
                return kill
        return None

    def downtime(self) -> float:
        """Seconds from each kill until the new process had reconciled, summed."""
        return sum(k.down_for for k in self.kills)


def _append(line: Mapping[str, Any]) -> None:
    path = os.environ.get("SPECDEPLOY_FAULT_RESULTS")
    if path:
        with Path(path).open("a") as out:
            out.write(json.dumps(line) + "\n")


def record_run(test: str, seed: int, outcome: str, **facts: Any) -> None:
    """Appends one finished run (its outcome and checks) to SPECDEPLOY_FAULT_RESULTS, if set."""
    kills = facts.pop("killer", None)
    sampler = facts.pop("sampler", None)
    line: dict[str, Any] = {"test": test, "seed": seed, "outcome": outcome, **facts}
    if isinstance(kills, OperatorKiller):
        line["kills"] = kills.points()
        line["kills_landed"] = kills.landed()
    if isinstance(sampler, ServingSampler):
        line["samples"] = len(sampler.samples)
        line["samples_without_a_serving_revision"] = len(sampler.gaps())
        line["samples_unknown"] = len(sampler.unknown())
    _append(line)
