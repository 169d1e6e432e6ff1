"""``python -m testbed up|down|status|env``: the local cluster from the command line."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

import yaml

from testbed import processes
from testbed.cluster import ClusterEnv, down, health, kwok_stages, run_dir, seed, tools_dir, up
from testbed.kubectl import Kubectl


def _exports(env: ClusterEnv) -> str:
    lines = {
        "KUBECONFIG": env.kubeconfig,
        "SPECDEPLOY_PROMETHEUS_URL": env.prometheus_url,
        "PATH": f"{env.bin_dir}:$PATH",
    }
    return "\n".join(
        f"export {k}={v}" if k == "PATH" else f"export {k}={shlex.quote(v)}"
        for k, v in lines.items()
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    parser.add_argument(
        "command",
        choices=["up", "down", "status", "env", "seed", "kwok-stages"],
        help="seed / kwok-stages: for another cluster named by KUBECONFIG (docs/testbed.md)",
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="default: .run/cluster")
    args = parser.parse_args(argv)
    folder: Path = args.run_dir.resolve() if args.run_dir else run_dir()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.command == "up":
        try:
            env, _ = up(log=log, folder=folder)
        except (processes.ComponentError, RuntimeError) as err:
            log(f"ERROR: {err}")
            return 1
        log(f"Prometheus: {env.prometheus_url}   environment: {folder / 'env.json'}")
        print(f"export KUBECONFIG={shlex.quote(env.kubeconfig)}")
        return 0
    if args.command == "down":
        down(log=log, folder=folder)
        return 0
    if args.command == "kwok-stages":
        stages = kwok_stages(tools_dir(build=True) / "manifests" / "kwok" / "stage")
        print(yaml.safe_dump_all(stages, sort_keys=False), end="")
        return 0
    if args.command == "seed":
        kubectl_bin = shutil.which("kubectl")
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubectl_bin or not kubeconfig:
            log("seed needs kubectl on PATH and KUBECONFIG naming the cluster")
            return 1
        manifests = tools_dir(build=True) / "manifests"
        seed(Kubectl(Path(kubectl_bin), Path(kubeconfig)), manifests, log=log)
        return 0
    recorded = ClusterEnv.read(folder)
    if recorded is None:
        log(f"no cluster recorded in {folder}")
        return 1
    env = recorded
    if args.command == "env":
        print(_exports(env))
        return 0
    problems = health(env)
    for name, info in env.components.items():
        state = "running" if processes.is_alive(int(info["pid"]), str(info["exe"])) else "DEAD"
        port = f":{info['port']}" if info.get("port") else ""
        print(f"{name:<24} pid {info['pid']:<8} {state:<8} {port:<7} {info['log']}")
    print(
        f"kubeconfig  {env.kubeconfig}\nprometheus  {env.prometheus_url}\nbin         {env.bin_dir}"
    )
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
