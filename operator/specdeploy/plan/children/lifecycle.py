"""How an engine pod starts and stops: the time its startup probe allows, its grace period, the
pause before it is signalled and how long vLLM drains its requests.

Starting: vLLM's port refuses connections until the weights are loaded, and a download from
the hub or a load of hundreds of GiB takes many minutes, so the startup probe allows a budget
that grows with the weights (or `spec.engine.startupTimeoutSeconds`). Stopping (a rollout,
a rollback, a scale-down): the pod first keeps serving for `PRE_STOP_SECONDS` (a preStop
`sleep`) while the endpoints controller and every proxy take it out of the Service; then
SIGTERM, on which vLLM, started with `--shutdown-timeout`, stops taking requests and drains the
ones it runs (streamed completions included) for up to that many seconds; Kubernetes kills it
when the grace period ends, `EXIT_MARGIN_SECONDS` after the drain's end at the latest.
"""

from __future__ import annotations

import math

from specdeploy.api.models import SizingDecision
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.placement.sizing import downloads_weights

#: The grace period of engine pods without spec.engine.terminationGracePeriodSeconds.
DEFAULT_GRACE_SECONDS = 120
#: The preStop pause: how long a stopping pod keeps serving while it leaves the Service.
PRE_STOP_SECONDS = 5
#: Time left after vLLM's drain for it to exit before Kubernetes kills it.
EXIT_MARGIN_SECONDS = 5

#: Engine start without the weights: CUDA context, torch.compile, CUDA graphs, KV allocation.
STARTUP_BASE_SECONDS = 600
#: Reading weights from a volume or a local disk (about 500 MiB/s).
LOAD_SECONDS_PER_GIB = 2
#: Downloading them from the hub on a first start (about 100 MiB/s), on top of the load.
DOWNLOAD_SECONDS_PER_GIB = 10
#: The startup probe's period; its failureThreshold is the budget over it.
STARTUP_PROBE_PERIOD_SECONDS = 10


def grace_period_seconds(spec: Spec) -> int:
    """The pod's terminationGracePeriodSeconds."""
    return spec.engine.termination_grace_period_seconds or DEFAULT_GRACE_SECONDS


def drain_seconds(spec: Spec) -> int:
    """vLLM's --shutdown-timeout: what the grace period leaves after the preStop pause and the
    margin for the engine to exit (the CRD's minimum grace, 20 s, leaves 10)."""
    return grace_period_seconds(spec) - PRE_STOP_SECONDS - EXIT_MARGIN_SECONDS


def startup_budget_seconds(spec: Spec, sizing: SizingDecision | None) -> int:
    """How long the engine may take to answer its health check after the container starts:
    spec.engine.startupTimeoutSeconds, else the base plus the weights' load (and download, for
    hub models) time; the base alone when the weights are not known."""
    if spec.engine.startup_timeout_seconds is not None:
        return spec.engine.startup_timeout_seconds
    memory = sizing.memory if sizing is not None else None
    if memory is None:
        return STARTUP_BASE_SECONDS
    weights = memory.target_weights_gib + memory.draft_weights_gib
    per_gib = LOAD_SECONDS_PER_GIB + (DOWNLOAD_SECONDS_PER_GIB if downloads_weights(spec) else 0)
    return STARTUP_BASE_SECONDS + math.ceil(weights * per_gib)


def startup_failure_threshold(spec: Spec, sizing: SizingDecision | None) -> int:
    """The startup probe's failureThreshold: the budget in probe periods, rounded up."""
    return math.ceil(startup_budget_seconds(spec, sizing) / STARTUP_PROBE_PERIOD_SECONDS)
