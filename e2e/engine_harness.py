"""The real CPU engine for end-to-end tests: its virtualenv, the tiny models, engine processes.

Reusable by any e2e module: the session fixtures `engine_python`, `tiny_models` and
`engine_pool` (e2e/conftest.py: ask for them by name, do not import them), or the plain
functions. The pool is shared by the whole session, keyed by pair (`EnginePool`). Engines
listen on 127.0.0.1 on free ports and are stopped by PID (and their own process group, which
only they are in) when the pool closes.
Each engine is pinned to a CPU of its own while there are CPUs to go round: vLLM's CPU worker
busy-polls for a second after every step, so two engines sharing every core starve each other
(docs/testbed.md has the figures).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from testbed.ports import free_port
from testbed.process_children import CpuAllocator

REPO = Path(__file__).resolve().parent.parent
OPERATOR_SRC = REPO / "operator"
FACTORY = OPERATOR_SRC / "specdeploy" / "engine" / "tiny_models.py"
CACHE = Path(os.environ.get("SPECDEPLOY_CACHE", Path.home() / ".cache" / "specdeploy"))

#: vLLM settings that keep a tiny engine's start-up short and its memory small on a CPU.
FAST_ENGINE_ARGS = ["--enforce-eager", "--max-model-len", "512", "--dtype", "float32"]
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "SPECDEPLOY_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
START_TIMEOUT_S = float(os.environ.get("SPECDEPLOY_ENGINE_START_TIMEOUT", "420"))
#: The CPUs engines started here are pinned to, one each, the least taken first.
ENGINE_CPUS = CpuAllocator()


def engine_python_path() -> Path:
    """The engine virtualenv's python, installing it first when the cache is cold."""
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "install-vllm-cpu.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"hack/install-vllm-cpu.sh failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def factory_version() -> str:
    """Changes whenever the tiny-model factory's code does, so a stale cache is never reused."""
    return hashlib.sha256(FACTORY.read_bytes()).hexdigest()[:12]


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **ENGINE_ENV, "PYTHONPATH": str(OPERATOR_SRC)}
    return {**env, **(extra or {})}


def build_tiny_models(python: Path, cache: Path = CACHE) -> dict[str, str]:
    """The tiny models (name → folder), generated once per factory version into the cache."""
    out = cache / "tiny-models" / factory_version()
    index = out / "models.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not index.is_file():
            staging = out.with_name(out.name + ".tmp")
            shutil.rmtree(staging, ignore_errors=True)
            done = subprocess.run(
                [str(python), "-m", "specdeploy.engine", "tiny-models", "--out", str(staging)],
                capture_output=True,
                text=True,
                env=engine_env(),
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"tiny-models failed:\n{done.stderr[-4000:]}")
            # The factory writes absolute paths: rewrite them for the final folder.
            shutil.rmtree(out, ignore_errors=True)
            staging.rename(out)
            names = json.loads((out / "models.json").read_text())
            index.write_text(json.dumps({n: str(out / n) for n in names}, indent=2) + "\n")
    models: dict[str, str] = json.loads(index.read_text())
    return models


def vllm_args(
    model: str,
    port: int,
    served_name: str = "tiny",
    speculative: dict[str, Any] | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """`vllm serve` arguments as plan/ would build them, for a tiny model on the CPU."""
    args = [model, "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port)]
    if speculative is not None:
        args += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
    return args + FAST_ENGINE_ARGS + list(extra)


# --- HTTP -----------------------------------------------------------------------------------


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def http_text(url: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text: str = response.read().decode()
        return text


def parse_counters(metrics: str) -> dict[str, float]:
    """Sum every sample of each metric family in Prometheus text (labels dropped)."""
    totals: dict[str, float] = {}
    for line in metrics.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        with contextlib.suppress(ValueError):
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals


DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
GENERATED_TOKENS = "vllm:generation_tokens_total"


# --- engine processes -------------------------------------------------------------------------


@dataclass
class EngineServer:
    """One engine started through the launcher (`python -m specdeploy.engine serve -- ...`)."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    started_at: float
    ready_after_s: float | None = None
    served_name: str = "tiny"
    #: The CPU the engine is pinned to (None: not pinned); given back when it stops.
    cpu: int | None = None
    #: Its temporary folder (TMPDIR, where vLLM makes its IPC sockets), removed when it stops.
    tmp: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> float:
        """Seconds from start to the first healthy answer; fails if the process exits first."""
        deadline = self.started_at + timeout
        # At least one look, however late: an engine started in the background long before
        # it is asked for (the pool's prestart) may have been serving for minutes.
        while True:
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(
                    f"engine {self.name} exited with {code} before serving:\n{self.tail()}"
                )
            with contextlib.suppress(OSError, urllib.error.URLError):
                urllib.request.urlopen(self.url + "/health", timeout=2).close()
                self.ready_after_s = time.monotonic() - self.started_at
                return self.ready_after_s
            if time.monotonic() >= deadline:
                break
            time.sleep(1)
        raise TimeoutError(f"engine {self.name} not ready after {timeout:.0f}s:\n{self.tail()}")

    def complete(self, prompt: str, max_tokens: int = 48) -> dict[str, Any]:
        body = {
            "model": self.served_name,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        answer: dict[str, Any] = http_json(self.url + "/v1/completions", body)
        return answer

    def counters(self) -> dict[str, float]:
        return parse_counters(http_text(self.url + "/metrics"))

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM to the engine's PID, then SIGKILL to its own process group if it lingers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        # vLLM's engine-core child shares the group; make sure none outlives the test.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        ENGINE_CPUS.give_back(self.cpu)
        self.cpu = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def start_engine(
    python: Path,
    name: str,
    args: Sequence[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    port: int | None = None,
    served_name: str = "tiny",
) -> EngineServer:
    """Start the launcher with these vLLM arguments (not waiting for readiness), pinned to a
    CPU of its own while there are CPUs to go round (`ENGINE_CPUS`)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    term = log_dir / f"{name}.termination-log"
    tmp = Path(tempfile.mkdtemp(prefix="engine-"))
    full_env = engine_env(
        {"SPECDEPLOY_TERMINATION_LOG": str(term), "TMPDIR": str(tmp), **(env or {})}
    )
    cpu = ENGINE_CPUS.take()
    try:
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [str(python), "-m", "specdeploy.engine", "serve", "--", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                # Before exec, so vLLM's processes and threads all inherit it.
                preexec_fn=None if cpu is None else partial(os.sched_setaffinity, 0, {cpu}),  # noqa: PLW1509
            )
    except BaseException:
        ENGINE_CPUS.give_back(cpu)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return EngineServer(
        name, port or 0, process, log, time.monotonic(), served_name=served_name, cpu=cpu, tmp=tmp
    )


@dataclass
class Refusal:
    code: int
    termination_message: str
    output: str
    seconds: float


def run_launcher_until_exit(
    python: Path, args: Sequence[str], work_dir: Path, timeout: float = 120
) -> Refusal:
    """Run the launcher expecting it to exit (a refused pair); returns code and message."""
    work_dir.mkdir(parents=True, exist_ok=True)
    term = work_dir / "termination-log"
    term.unlink(missing_ok=True)
    started = time.monotonic()
    done = subprocess.run(
        [str(python), "-m", "specdeploy.engine", "serve", "--", *args],
        capture_output=True,
        text=True,
        env=engine_env({"SPECDEPLOY_TERMINATION_LOG": str(term)}),
        timeout=timeout,
        check=False,
    )
    message = term.read_text() if term.is_file() else ""
    return Refusal(done.returncode, message, done.stdout + done.stderr, time.monotonic() - started)


#: The `vllm serve` arguments of an engine given its port.
ArgsForPort = Callable[[int], list[str]]
#: What makes two engines the same: their vLLM arguments with the port left out, and the
#: served model name.
PairKey = tuple[tuple[str, ...], str]

#: A stand-in port: arguments built for it, with it then taken out, are an engine's key.
_KEY_PORT = 1


@dataclass
class EnginePool:
    """Real CPU engines on the tiny models, keyed by pair and shared by every test that asks.

    A test asks by name: `plain`, `draft-good`, `draft-small`, `draft-bad`, `eagle3` (the tiny
    target with that draft, 3 speculative tokens), or a name given to `define` with the
    arguments another part builds (e.g. plan/'s). Engines are keyed by their vLLM arguments
    (less the port) and served name, so two names, tests or modules asking for the same pair
    get the same running engine. At most `max_running` run at once (each takes about 3 GiB and
    a CPU of its own); asking for another stops the least recently used. `prestart` starts
    engines without waiting, so they warm up while other tests run; `get` waits for one.
    A test must not stop an engine, nor assume it is fresh: counters are cumulative (read
    them before and after), and another test may have served completions on it.
    """

    python: Path
    models: dict[str, str]
    log_dir: Path
    max_running: int = 2
    #: Running engines by pair, least recently used first.
    running: dict[PairKey, EngineServer] = field(default_factory=dict)
    #: Seconds from start to ready, by engine name (the name that started it).
    startup_seconds: dict[str, float] = field(default_factory=dict)
    #: Engines defined by their own arguments (see `define`): name → (arguments, served name).
    defined: dict[str, tuple[ArgsForPort, str]] = field(default_factory=dict)
    #: How many times `get` found the engine already running, by name.
    reused: dict[str, int] = field(default_factory=dict)

    def define(self, name: str, args_for_port: ArgsForPort, served_name: str) -> None:
        """Name an engine whose arguments are built elsewhere (e.g. by plan/), for `get`."""
        self.defined[name] = (args_for_port, served_name)

    def speculative(self, name: str) -> dict[str, Any] | None:
        """The speculative config of the named engine: `plain`, `draft-good`, `eagle3`, ..."""
        if name == "plain":
            return None
        method = "eagle3" if name.startswith("eagle3") else "draft_model"
        return {"method": method, "model": self.models[name], "num_speculative_tokens": 3}

    def arguments(self, name: str, port: int) -> tuple[list[str], str]:
        """The named engine's vLLM arguments on `port`, and its served model name."""
        if name in self.defined:
            args_for_port, served_name = self.defined[name]
            return args_for_port(port), served_name
        return vllm_args(self.models["target"], port, speculative=self.speculative(name)), "tiny"

    def key(self, name: str) -> PairKey:
        args, served_name = self.arguments(name, _KEY_PORT)
        return tuple(a for a in args if a != str(_KEY_PORT)), served_name

    def prestart(self, *names: str) -> None:
        """Starts the named engines that are not running, without waiting for them."""
        wanted: dict[PairKey, str] = {}
        for name in names:
            wanted.setdefault(self.key(name), name)
        wanted = {key: name for key, name in wanted.items() if key not in self.running}
        while self.running and len(self.running) + len(wanted) > self.max_running:
            oldest = next(iter(self.running))
            self.running.pop(oldest).stop()
        for key, name in wanted.items():
            port = free_port()
            args, served_name = self.arguments(name, port)
            self.running[key] = start_engine(
                self.python, name, args, self.log_dir, port=port, served_name=served_name
            )

    def start(self, *names: str) -> None:
        """Starts the named engines together (they warm up in parallel), then waits for all."""
        self.prestart(*names)
        for name in names:
            server = self.running[self.key(name)]
            if server.ready_after_s is None:
                self.startup_seconds[name] = server.wait_ready()

    def get(self, name: str) -> EngineServer:
        """The named engine, ready; started (and waited for) when it does not run yet."""
        key = self.key(name)
        if key in self.running and self.running[key].ready_after_s is not None:
            self.reused[name] = self.reused.get(name, 0) + 1
        self.start(name)
        server = self.running.pop(key)
        self.running[key] = server  # most recently used last
        return server

    def close(self) -> None:
        for server in self.running.values():
            server.stop()
        self.running.clear()


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The CPU engine virtualenv's python (`make engine-venv`); a cold cache installs it."""
    try:
        return engine_python_path()
    except RuntimeError as err:
        pytest.fail(str(err))


@pytest.fixture(scope="session")
def tiny_models(engine_python: Path) -> dict[str, str]:
    """Tiny models by name (target, draft-good, draft-bad, eagle3, mismatched drafts, ...)."""
    try:
        return build_tiny_models(engine_python)
    except RuntimeError as err:
        pytest.fail(str(err))


def pool_summary(pool: EnginePool) -> str:
    """Start-up seconds and reuses of a pool's engines, for the session's end."""
    return f"engine start-up seconds: {json.dumps(pool.startup_seconds)}; reused: {pool.reused}"
