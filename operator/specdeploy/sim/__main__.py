"""`python -m specdeploy.sim <vllm serve arguments>`: serve a simulated pair as vLLM would.

The arguments are vLLM's (`--model`, `--speculative-config`, `--max-num-seqs`, `--port`, ...);
the target and the draft name profiles of the simulator's catalog (`sim/<profile>`), and
arguments the simulator has no use for (`--dtype`, `--tensor-parallel-size`, ...) are accepted
and ignored, as a GPU's vLLM would accept them. docs/simulator.md has the profiles and knobs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from specdeploy.sim.engine import SimEngine, SpeculationSchedule
from specdeploy.sim.metrics import EngineMetrics
from specdeploy.sim.profiles import CATALOG_ENV, ProfileError, load_catalog
from specdeploy.sim.server import ServedModel, SimApp

EPILOG = f"""\
Profiles: the built-in catalog (specdeploy/sim/catalog.yaml) and, added to it, the YAML file
named by --sim-catalog or ${CATALOG_ENV}. `--list-profiles` prints them.

Every other vLLM argument is accepted and ignored. The server answers /v1/completions,
/v1/chat/completions, /v1/models, /health, /version and /metrics (vLLM 0.32's families).
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specdeploy.sim",
        description="A vLLM-compatible server that serves a target and its draft as a GPU would.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model_tag", nargs="?", help="the target profile (as `vllm serve MODEL`)")
    p.add_argument("--model", help="the target profile, e.g. sim/llama-3.1-70b-h100")
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--speculative-config", "-sc", default=None, help="vLLM's JSON")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--middleware", action="append", default=[], help="an ASGI middleware's import path"
    )
    p.add_argument("--sim-catalog", default=None, help="a YAML file of more profiles")
    p.add_argument("--list-profiles", action="store_true", help="print the profiles and exit")
    return p


def speculation_of(raw: str | None) -> tuple[str | None, SpeculationSchedule]:
    """The draft profile and k of vLLM's --speculative-config; a method without a model (n-gram,
    suffix, MTP) is the profile named after it (`sim/ngram`)."""
    if not raw:
        return None, SpeculationSchedule()
    config: dict[str, Any] = json.loads(raw)
    draft = config.get("model") or (f"sim/{config['method']}" if config.get("method") else None)
    k = int(config.get("num_speculative_tokens") or 0)
    ranges = config.get("num_speculative_tokens_per_batch_size") or ()
    return (str(draft) if draft else None), SpeculationSchedule(k, [list(r) for r in ranges])


def load_middleware(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def main(argv: Sequence[str] | None = None) -> int:
    opts, ignored = parser().parse_known_args(argv)
    try:
        catalog = load_catalog(opts.sim_catalog)
    except ProfileError as err:
        print(f"specdeploy-sim: {err}", file=sys.stderr)
        return 2
    if opts.list_profiles:
        for name in sorted(catalog.targets):
            print(f"target {name}")
        for name, profile in sorted(catalog.drafts.items()):
            print(f"draft  {name} ({profile.method})")
        return 0
    model = opts.model or opts.model_tag
    if not model:
        print("specdeploy-sim: no model (give --model or a positional MODEL)", file=sys.stderr)
        return 2
    try:
        target = catalog.target(model)
        draft_name, schedule = speculation_of(opts.speculative_config)
        draft = catalog.draft(draft_name) if draft_name else None
    except (ProfileError, ValueError) as err:
        print(f"specdeploy-sim: {err}", file=sys.stderr)
        return 2
    if ignored:
        print(f"specdeploy-sim: ignoring {' '.join(ignored)}", file=sys.stderr)
    names = tuple(opts.served_model_name or [model])
    metrics = EngineMetrics(names[0], opts.max_model_len, schedule.largest if draft else 0)
    clock = time.monotonic
    engine = SimEngine(
        target,
        draft,
        schedule,
        metrics,
        max_num_seqs=opts.max_num_seqs,
        max_num_batched_tokens=opts.max_num_batched_tokens,
        max_model_len=opts.max_model_len,
        seed=opts.seed,
        started_at=clock(),
    )
    app: Any = SimApp(engine, ServedModel(names, model, opts.max_model_len), clock)
    for path in reversed(opts.middleware):
        app = load_middleware(path)(app)
    delay = engine.faults.start_delay_s
    if delay > 0:
        print(f"specdeploy-sim: loading for {delay:.1f} s", file=sys.stderr, flush=True)
        time.sleep(delay)
    import uvicorn  # noqa: PLC0415 (only the server needs it)

    print(
        f"specdeploy-sim: serving {model}"
        + (f" with {draft.name} (k={schedule.largest})" if draft else "")
        + f" on {opts.host}:{opts.port}",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        app, host=opts.host, port=opts.port, log_level="warning", lifespan="on", loop="asyncio"
    )
    asyncio.run(uvicorn.Server(config).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
