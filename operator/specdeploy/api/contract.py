"""The strings and numbers the operator, the engine launcher and the test bed agree on, once.

docs/contracts.md describes them; every part imports them from here (labels and annotations
are in `specdeploy.api.labels`). This module imports nothing, so the engine image, which ships
the launcher without the operator's runtime, can import it too.
"""

from __future__ import annotations

from typing import Final

# --- the engine container's environment --------------------------------------------------------
#: The pair the launcher must verify (compact sorted JSON: version, target, draft, revision).
PAIR_ENV: Final = "SPECDEPLOY_PAIR"
HOST_ENV: Final = "SPECDEPLOY_HOST"
PORT_ENV: Final = "SPECDEPLOY_PORT"

# --- the probe (spec.rollout.analysis.probe; docs/operator.md, "The probe") -------------------
#: The probe's settings (compact JSON: maxTokens, temperature, timeoutSeconds).
PROBE_ENV: Final = "SPECDEPLOY_PROBE"
#: The probe's prompts, from the ConfigMap key the spec names (valueFrom.configMapKeyRef).
PROBE_PROMPTS_ENV: Final = "SPECDEPLOY_PROBE_PROMPTS"
#: Set by the launcher before it execs vLLM: names this run's probe results file.
PROBE_RUN_ENV: Final = "SPECDEPLOY_PROBE_RUN"
#: The ASGI middleware vLLM loads (`--middleware`) to run the probe and gate readiness on it.
PROBE_MIDDLEWARE: Final = "specdeploy.engine.probe.ProbeGate"
#: The readiness path of a pod with a probe: 200 once its probe finished and vLLM is healthy.
PROBE_READY_PATH: Final = "/specdeploy/ready"
#: The prefix of the probe's figures, appended to vLLM's /metrics.
PROBE_METRIC_PREFIX: Final = "specdeploy_probe_"
#: The probe's gauges (after the prefix), each labelled `prompt_set`: deltas of vLLM's own
#: counters over the probe, and what the probe itself counted (prompts, requests, errors,
#: complete = 1 when every prompt was sent before the timeout).
PROBE_GAUGES: Final = (
    "prompts",
    "complete",
    "requests",
    "errors",
    "output_tokens",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "decode_seconds",
    "decode_steps",
    "first_token_seconds",
    "first_tokens",
)
#: Accepted tokens by draft position (label `position`), the probe's share of vLLM's counter.
PROBE_PER_POSITION_GAUGE: Final = "accepted_tokens_per_position"

# --- the launcher's exit codes -----------------------------------------------------------------
EXIT_OK: Final = 0
#: Unusable arguments (no model, --speculative-config not JSON or without a method).
EXIT_USAGE: Final = 2
#: The pair is refused: the draft does not belong to the target (one line in the termination log).
EXIT_PAIR_INCOMPATIBLE: Final = 3
#: A model could not be found or read.
EXIT_MODEL_UNAVAILABLE: Final = 4

# --- speculative methods -----------------------------------------------------------------------
#: Methods that take no draft checkpoint of their own.
MODEL_FREE_METHODS: Final = frozenset({"ngram", "suffix", "ngram_gpu"})
#: Methods whose draft is a small EAGLE-style head reading the target's hidden states.
EAGLE_METHODS: Final = frozenset({"eagle", "eagle3"})

# --- vLLM flags the operator sets itself -------------------------------------------------------
#: A second copy in spec.engine.extraArgs would silently win or clash, so the CRD refuses them.
OPERATOR_OWNED_FLAGS: Final = (
    "--revision",
    "--served-model-name",
    "--host",
    "--port",
    "--tensor-parallel-size",
    "--max-model-len",
    "--max-num-seqs",
    "--gpu-memory-utilization",
    "--speculative-config",
    "--shutdown-timeout",
)
#: What the operator also sets for a replica across nodes (plan.children.vllm_args
#: multi_node_args); refused in extraArgs of such an SD only (a CEL rule of their own: one rule
#: over all of them would exceed the API server's cost budget).
MULTI_NODE_FLAGS: Final = (
    "--pipeline-parallel-size",
    "--distributed-executor-backend",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
)
