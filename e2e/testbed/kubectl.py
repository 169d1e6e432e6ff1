"""A small runner for the pinned kubectl, used by the cluster manager and the e2e fixtures."""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import ApiClient
from kubernetes.config import new_client_from_config

FIELD_MANAGER = "specdeploy-testbed"


@functools.cache
def api_client(kubeconfig: Path) -> ApiClient:
    """The Python client for the cluster of `kubeconfig`: one per kubeconfig for the process,
    so its connection pool is shared by every reader of that cluster."""
    api: ApiClient = new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    return api


class KubectlError(RuntimeError):
    """kubectl exited non-zero; carries its output."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.args_ = list(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip() or stdout.strip()}"
        )


@dataclass(frozen=True)
class Kubectl:
    """kubectl bound to one binary and one kubeconfig."""

    binary: Path
    kubeconfig: Path

    def run(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl; raise KubectlError on a non-zero exit when ``check``."""
        argv = [str(self.binary), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise KubectlError(args, proc.returncode, proc.stdout, proc.stderr)
        return proc

    def apply(self, manifests: str | list[dict[str, Any]], *extra: str) -> str:
        """Server-side apply YAML text or a list of objects (conflicts forced: we own them)."""
        text = manifests if isinstance(manifests, str) else yaml.safe_dump_all(manifests)
        return self.run(
            "apply",
            "--server-side",
            "--force-conflicts",
            f"--field-manager={FIELD_MANAGER}",
            "-f",
            "-",
            *extra,
            stdin=text,
        ).stdout

    def get_json(self, *args: str) -> Any:
        """``kubectl get ... -o json``, parsed."""
        return json.loads(self.run("get", *args, "-o", "json").stdout)
