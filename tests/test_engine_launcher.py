"""The launcher: reading vLLM arguments, resolving models, refusing a pair, building the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specdeploy.api import contract
from specdeploy.engine import launcher
from specdeploy.engine.__main__ import main

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def model_dir(root: Path, name: str, config: str | dict[str, Any], vocab: int = 8) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    data = (
        json.loads((CONFIGS / f"{config}.json").read_text()) if isinstance(config, str) else config
    )
    (folder / "config.json").write_text(json.dumps(data))
    tokens = {f"t{i}": i for i in range(vocab)}
    (folder / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "BPE", "vocab": tokens}, "added_tokens": []})
    )
    return folder


def spec(method: str, model: str | None = None, **extra: Any) -> str:
    body: dict[str, Any] = {"method": method, "num_speculative_tokens": 3, **extra}
    if model is not None:
        body["model"] = model
    return json.dumps(body)


def no_hub(repo: str, revision: str | None) -> Path:
    raise AssertionError(f"tests never download ({repo}@{revision})")


# --- arguments ----------------------------------------------------------------------------


def test_parse_positional_model_and_options() -> None:
    args = launcher.parse_serve_args(
        [
            "meta-llama/Llama-3.1-8B-Instruct",
            "--revision",
            "0e9e39f",
            "--served-model-name",
            "chat",
            "chat-v2",
            "--host",
            "0.0.0.0",
            f"--speculative-config={spec('eagle3', 'head')}",
        ]
    )
    assert args.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert args.model_positional
    assert args.revision == "0e9e39f"
    assert args.served_model_names == ["chat", "chat-v2"]
    assert args.speculative_config == {
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "model": "head",
    }


def test_parse_model_option() -> None:
    args = launcher.parse_serve_args(["--model", "/models/t", "--speculative_config", "{}"])
    assert (args.model, args.model_positional, args.speculative_config) == ("/models/t", False, {})


def test_parse_rejects_broken_speculative_json() -> None:
    with pytest.raises(launcher.LaunchError) as err:
        launcher.parse_serve_args(["m", "--speculative-config", "{method: eagle3"])
    assert err.value.code == contract.EXIT_USAGE


# --- the command ----------------------------------------------------------------------------


def test_cli_entry_passes_the_arguments_unchanged() -> None:
    argv = ["/models/t", "--port", "8000", "--speculative-config", spec("ngram")]
    command = launcher.vllm_command(launcher.parse_serve_args(argv), "cli")
    assert command == ["vllm", "serve", *argv]


def test_module_entry_passes_the_model_as_an_option() -> None:
    argv = ["/models/t", "--port", "8000"]
    command = launcher.vllm_command(launcher.parse_serve_args(argv), "module", "/venv/bin/python")
    assert command == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/t",
        "--port",
        "8000",
    ]


def test_entry_is_chosen_by_env() -> None:
    assert launcher.vllm_entry({launcher.VLLM_ENTRY_ENV: "cli"}) == "cli"
    assert launcher.vllm_entry({launcher.VLLM_ENTRY_ENV: "module"}) == "module"


def test_entry_without_vllm_installed_is_the_module() -> None:
    # The project virtualenv has no vllm distribution.
    assert launcher.vllm_entry({}) == "module"


# --- the CPU build's worker process -----------------------------------------------------------


def test_the_cpu_build_runs_one_worker_in_the_engine_core_process() -> None:
    for argv in (["/m"], ["/m", "--tensor-parallel-size", "1"], ["/m", "-pp=1", "-dp", "1"]):
        args = launcher.parse_serve_args(argv)
        env = launcher.single_worker_env(args, {"A": "b"}, cpu_build=True)
        assert env == {"A": "b", launcher.MULTIPROCESSING_ENV: "0"}, argv


def test_several_workers_a_gpu_build_or_the_pods_own_setting_keep_vllms_default() -> None:
    for argv in (
        ["/m", "--tensor-parallel-size", "2"],
        ["/m", "--pipeline_parallel_size=2"],
        ["/m", "-dp", "2"],
        ["/m", "-tp", "two"],  # not a number: vLLM says why, the launcher changes nothing
    ):
        args = launcher.parse_serve_args(argv)
        assert launcher.single_worker_env(args, {}, cpu_build=True) == {}, argv
    one = launcher.parse_serve_args(["/m"])
    assert launcher.single_worker_env(one, {}, cpu_build=False) == {}
    mine = {launcher.MULTIPROCESSING_ENV: "1"}
    assert launcher.single_worker_env(one, mine, cpu_build=True) == mine


def test_serve_execs_vllm_with_the_worker_in_process_on_the_cpu_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class ExecError(Exception):
        """Raised where the launcher would exec vLLM."""

    seen: dict[str, str] = {}

    def execvpe(file: str, args: list[str], env: dict[str, str]) -> None:
        seen.update(env)
        raise ExecError

    monkeypatch.setattr(os, "execvpe", execvpe)
    monkeypatch.setattr(launcher, "is_cpu_build", lambda: True)
    target = model_dir(tmp_path, "t", "llama-3.1-8b-instruct")
    argv = [str(target), "--speculative-config", spec("ngram", prompt_lookup_max=4)]
    with pytest.raises(ExecError):
        launcher.serve(argv, {launcher.OFFLINE_ENV: "1"})
    assert seen[launcher.MULTIPROCESSING_ENV] == "0"
    seen.clear()
    with pytest.raises(ExecError):
        launcher.serve([*argv, "-tp", "2"], {launcher.OFFLINE_ENV: "1"})
    assert launcher.MULTIPROCESSING_ENV not in seen


def test_a_parallel_size_without_its_value_is_refused_as_unusable_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "is_cpu_build", lambda: True)
    target = model_dir(tmp_path, "t", "llama-3.1-8b-instruct")
    term = tmp_path / "termination-log"
    env = {launcher.TERMINATION_LOG_ENV: str(term), launcher.OFFLINE_ENV: "1"}
    with pytest.raises(SystemExit) as exited:
        launcher.serve([str(target), "-tp"], env)
    assert exited.value.code == contract.EXIT_USAGE
    assert term.read_text() == "vLLM option -tp has no value\n"


def test_the_project_virtualenv_is_no_cpu_build() -> None:
    assert not launcher.is_cpu_build()


# --- the checks through the arguments ------------------------------------------------------


def test_matching_local_pair_passes(tmp_path: Path) -> None:
    target = model_dir(tmp_path, "Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct")
    head = model_dir(tmp_path, "head", "llama-3.1-8b-instruct-speculator.eagle3")
    argv = [str(target), "--speculative-config", spec("eagle3", str(head))]
    results = launcher.check_serve_args(argv, {}, no_hub)
    assert results
    assert not [r for r in results if r.failed]


def test_pair_env_names_a_volume_target(tmp_path: Path) -> None:
    target = model_dir(tmp_path, "t", "llama-3.1-8b-instruct")
    head = model_dir(tmp_path, "head", "llama-3.1-8b-instruct-speculator.eagle3")
    argv = [str(target), "--speculative-config", spec("eagle3", str(head))]
    refused = launcher.check_serve_args(argv, {}, no_hub)
    assert [r.check for r in refused if r.failed] == ["verifier"]
    pair = {"target": {"model": "meta-llama/Llama-3.1-8B-Instruct"}}
    accepted = launcher.check_serve_args(argv, {"SPECDEPLOY_PAIR": json.dumps(pair)}, no_hub)
    assert not [r for r in accepted if r.failed]


def test_draft_lm_with_another_tokenizer_is_refused(tmp_path: Path) -> None:
    target = model_dir(tmp_path, "t", "llama-3.1-8b-instruct", vocab=8)
    draft = model_dir(tmp_path, "d", "llama-3.2-1b-instruct", vocab=9)
    argv = [str(target), "--speculative-config", spec("draft_model", str(draft))]
    results = launcher.check_serve_args(argv, {}, no_hub)
    assert [r.check for r in results if r.failed] == ["tokenizer"]


def test_hub_ids_are_resolved_through_the_resolver(tmp_path: Path) -> None:
    target = model_dir(tmp_path, "t", "llama-3.1-8b-instruct")
    head = model_dir(tmp_path, "h", "llama-3.1-8b-instruct-speculator.eagle3")
    asked: list[tuple[str, str | None]] = []

    def hub(repo: str, revision: str | None) -> Path:
        asked.append((repo, revision))
        return target if repo.startswith("meta-llama/") else head

    argv = [
        "meta-llama/Llama-3.1-8B-Instruct",
        "--revision",
        "abc",
        "--speculative-config",
        spec("eagle3", "org/head", revision="def"),
    ]
    results = launcher.check_serve_args(argv, {}, hub)
    assert asked == [("meta-llama/Llama-3.1-8B-Instruct", "abc"), ("org/head", "def")]
    assert not [r for r in results if r.failed]


def test_missing_local_model_is_exit_4(tmp_path: Path) -> None:
    with pytest.raises(launcher.LaunchError) as err:
        launcher.check_serve_args([str(tmp_path / "nope")], {}, no_hub)
    assert err.value.code == contract.EXIT_MODEL_UNAVAILABLE


def test_unreadable_config_is_exit_4(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text("{not json")
    with pytest.raises(launcher.LaunchError) as err:
        launcher.check_serve_args([str(tmp_path / "t")], {}, no_hub)
    assert err.value.code == contract.EXIT_MODEL_UNAVAILABLE


def test_offline_hub_id_is_exit_4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(launcher.OFFLINE_ENV, "1")
    with pytest.raises(launcher.LaunchError) as err:
        launcher.resolve_model_dir("org/model", None, launcher.download_config_files)
    assert err.value.code == contract.EXIT_MODEL_UNAVAILABLE


# --- serve: the refusal as the kubelet sees it ---------------------------------------------


def test_serve_refuses_with_exit_3_and_one_line(tmp_path: Path) -> None:
    target = model_dir(tmp_path, "Llama-3.3-70B-Instruct", "llama-3.3-70b-instruct")
    head = model_dir(tmp_path, "head", "llama-3.1-8b-instruct-speculator.eagle3")
    term = tmp_path / "termination-log"
    env = {launcher.TERMINATION_LOG_ENV: str(term), launcher.OFFLINE_ENV: "1"}
    with pytest.raises(SystemExit) as exited:
        launcher.serve([str(target), "--speculative-config", spec("eagle3", str(head))], env)
    assert exited.value.code == contract.EXIT_PAIR_INCOMPATIBLE
    lines = term.read_text().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("draft was trained for verifier meta-llama/Llama-3.1-8B-Instruct")
    assert "target hidden size 4096, target has 8192" in lines[0]


def test_serve_refuses_a_missing_draft_with_exit_4(tmp_path: Path) -> None:
    target = model_dir(tmp_path, "t", "llama-3.1-8b-instruct")
    term = tmp_path / "termination-log"
    env = {launcher.TERMINATION_LOG_ENV: str(term)}
    with pytest.raises(SystemExit) as exited:
        launcher.serve(
            [str(target), "--speculative-config", spec("eagle3", str(tmp_path / "gone"))], env
        )
    assert exited.value.code == contract.EXIT_MODEL_UNAVAILABLE
    assert term.read_text() == f"model directory {tmp_path / 'gone'} does not exist\n"


def test_check_command_prints_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = model_dir(tmp_path, "t", "llama-3.1-8b-instruct")
    code = main(["check", "--", str(target), "--speculative-config", spec("ngram", str(target))])
    out = json.loads(capsys.readouterr().out)
    assert code == contract.EXIT_PAIR_INCOMPATIBLE
    assert out["message"] == "method ngram takes no draft model, but one is given"


# --- tokenizer fingerprints ----------------------------------------------------------------


def test_fingerprint_ignores_formatting(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    body = {"model": {"vocab": {"x": 0, "y": 1}}, "added_tokens": [{"id": 2, "content": "<s>"}]}
    (a / "tokenizer.json").write_text(json.dumps(body))
    (b / "tokenizer.json").write_text(json.dumps(body, indent=4, sort_keys=True))
    assert launcher.tokenizer_fingerprint(a) == launcher.tokenizer_fingerprint(b)
    body["model"] = {"vocab": {"x": 0, "z": 1}}
    (b / "tokenizer.json").write_text(json.dumps(body))
    assert launcher.tokenizer_fingerprint(a) != launcher.tokenizer_fingerprint(b)
    assert launcher.tokenizer_fingerprint(tmp_path) is None


def test_the_engine_package_imports_no_heavy_library() -> None:
    # The launcher runs before vLLM and the operator image has no torch: import stays light.
    code = (
        "import sys, specdeploy.engine.__main__, specdeploy.engine.tiny_models;"
        "heavy = {'torch', 'vllm', 'transformers', 'huggingface_hub', 'speculators', 'kopf'};"
        "print(sorted(heavy & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
