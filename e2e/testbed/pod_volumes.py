"""The process kubelet's volumes: what each volume of a pod holds, written into the pod's folder.

kubelet fills a pod's volumes before its containers start, and the container runtime mounts
them at each container's `volumeMounts`. Here each volume becomes a folder
`<pod folder>/volumes/<name>/`, and `container_init.py` bind-mounts it at the mount path in the
container process's own mount namespace. Supported, as kubelet fills them:

- `configMap`, `secret` (every key, or `items` with their paths; `optional`; `defaultMode`/`mode`);
- `downwardAPI` (`fieldRef`, `resourceFieldRef`);
- `projected`, of those and of `serviceAccountToken`: a token the API server issues for the
  pod's ServiceAccount through the TokenRequest API, bound to the pod (so it dies with it),
  with the source's audience and expiry, refreshed once 80 % of its life has passed. The
  ServiceAccount admission plugin gives every pod that automounts a token such a volume
  (`kube-api-access-*`: token, the `kube-root-ca.crt` ConfigMap's `ca.crt`, the namespace) at
  /var/run/secrets/kubernetes.io/serviceaccount, which is how in-cluster clients find it;
- `emptyDir` (a folder; with `medium: Memory` a folder on the host's tmpfs, /dev/shm, as
  kubelet mounts a tmpfs for it: what a program maps there is memory, not a disk file).

Other kinds (persistentVolumeClaim, ephemeral, hostPath, ...) are not mounted: the container
sees the host's file system at their paths, as before volumes were supported.

The decisions (`volume_files`) are pure, given lookups for objects and tokens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.process_plan import (
    Container,
    ContainerConfigError,
    ObjectDataLookup,
    Pod,
    field_ref_value,
    resource_field_value,
)

DEFAULT_MODE = 0o644
#: kubelet asks for at least 10 minutes; the admission plugin's default is 3607 s.
DEFAULT_TOKEN_SECONDS = 3600
#: kubelet refreshes a token once 80 % of its life has passed.
TOKEN_REFRESH_SHARE = 0.8
SUPPORTED_KINDS = ("configMap", "secret", "downwardAPI", "projected", "emptyDir")
#: The host's tmpfs, where the folders of `emptyDir` volumes of `medium: Memory` are made.
MEMORY_ROOT = Path("/dev/shm")


@dataclass(frozen=True)
class IssuedToken:
    token: str
    #: Seconds it is valid for, from when it was issued.
    lifetime_seconds: float


TokenLookup = Callable[[Pod, str | None, int], IssuedToken]
"""`(pod, audience or None for the API server's own, expirationSeconds)` → a bound token."""


@dataclass(frozen=True)
class VolumeFile:
    content: bytes
    mode: int


@dataclass(frozen=True)
class VolumeContents:
    """What one volume holds: its files by relative path; `refresh_after` (seconds from now)
    when a token in it must be renewed."""

    files: Mapping[str, VolumeFile]
    refresh_after: float | None = None


def volume_kind(volume: Mapping[str, Any]) -> str:
    """The kind of a volume source (`configMap`, `projected`, ...)."""
    kinds = [key for key in volume if key != "name"]
    return kinds[0] if kinds else "emptyDir"


def _object_files(
    kind: str,
    namespace: str,
    ref: Mapping[str, Any],
    mode: int,
    lookup: ObjectDataLookup,
) -> dict[str, VolumeFile]:
    name = ref.get("name") or ref.get("secretName") or ""
    items: list[Mapping[str, Any]] | None = ref.get("items")
    optional = bool(ref.get("optional"))
    data = lookup(kind, namespace, name)
    if data is None:
        if optional:
            return {}
        raise ContainerConfigError(f'{kind.lower()} "{name}" not found')
    if not items:
        return {key: VolumeFile(value.encode(), mode) for key, value in data.items()}
    files: dict[str, VolumeFile] = {}
    for item in items:
        key = item["key"]
        if key not in data:
            if optional:
                continue
            raise ContainerConfigError(f"couldn't find key {key} in {kind} {namespace}/{name}")
        files[item["path"]] = VolumeFile(data[key].encode(), int(item.get("mode") or mode))
    return files


def _downward_files(
    pod: Pod, container: Container, items: list[Mapping[str, Any]], mode: int
) -> dict[str, VolumeFile]:
    files: dict[str, VolumeFile] = {}
    for item in items:
        if "fieldRef" in item:
            value = field_ref_value(pod, item["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in item:
            value = resource_field_value(container, item["resourceFieldRef"])
        else:
            raise ContainerConfigError(f"unsupported downwardAPI item {item.get('path')!r}")
        files[item["path"]] = VolumeFile(value.encode(), int(item.get("mode") or mode))
    return files


def volume_files(
    pod: Pod,
    container: Container,
    volume: Mapping[str, Any],
    lookup: ObjectDataLookup,
    request_token: TokenLookup,
) -> VolumeContents:
    """The files of a supported volume, as kubelet would write them for this container.

    Raises ContainerConfigError for a missing (non-optional) ConfigMap, Secret or key.
    """
    namespace = pod["metadata"]["namespace"]
    kind = volume_kind(volume)
    source: Mapping[str, Any] = volume.get(kind) or {}
    mode = int(source.get("defaultMode") or DEFAULT_MODE)
    if kind == "configMap":
        files = _object_files("ConfigMap", namespace, source, mode, lookup)
        return VolumeContents(files)
    if kind == "secret":
        files = _object_files("Secret", namespace, source, mode, lookup)
        return VolumeContents(files)
    if kind == "downwardAPI":
        return VolumeContents(_downward_files(pod, container, source.get("items") or [], mode))
    if kind == "emptyDir":
        return VolumeContents({})
    if kind != "projected":
        raise ContainerConfigError(f"volume kind {kind} is not supported")
    files = {}
    refresh_after: float | None = None
    for projection in source.get("sources") or []:
        if "serviceAccountToken" in projection:
            wanted = projection["serviceAccountToken"]
            seconds = int(wanted.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS)
            issued = request_token(pod, wanted.get("audience") or None, seconds)
            files[wanted["path"]] = VolumeFile(issued.token.encode(), mode)
            refresh = issued.lifetime_seconds * TOKEN_REFRESH_SHARE
            refresh_after = refresh if refresh_after is None else min(refresh_after, refresh)
        elif "configMap" in projection:
            ref = projection["configMap"]
            files.update(_object_files("ConfigMap", namespace, ref, mode, lookup))
        elif "secret" in projection:
            ref = projection["secret"]
            files.update(_object_files("Secret", namespace, ref, mode, lookup))
        elif "downwardAPI" in projection:
            files.update(
                _downward_files(pod, container, projection["downwardAPI"].get("items") or [], mode)
            )
        else:
            raise ContainerConfigError(f"unsupported projection in volume {volume.get('name')!r}")
    return VolumeContents(files, refresh_after)


@dataclass(frozen=True)
class PlannedMount:
    """One volumeMount of a container, on the volume folder that backs it."""

    volume: str
    target: str
    read_only: bool


def container_mounts(pod: Pod, container: Container) -> list[PlannedMount]:
    """The container's volumeMounts whose volumes the process kubelet supports.

    A mount with `subPath` is refused (ContainerConfigError), as is one naming no volume.
    """
    volumes = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or []}
    planned: list[PlannedMount] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise ContainerConfigError(f"volume {mount['name']!r} of a volumeMount is not defined")
        if volume_kind(volume) not in SUPPORTED_KINDS:
            continue
        if mount.get("subPath") or mount.get("subPathExpr"):
            raise ContainerConfigError(f"volumeMount {mount['name']!r}: subPath is not supported")
        planned.append(PlannedMount(mount["name"], mount["mountPath"], bool(mount.get("readOnly"))))
    return planned


# --- Writing them -------------------------------------------------------------------------------


class PodVolumes:
    """The volume folders of one pod, filled before its containers start and kept current
    (tokens refreshed) while it runs."""

    def __init__(self, folder: Path, memory_root: Path = MEMORY_ROOT) -> None:
        self.folder = folder / "volumes"
        # The pod folder's name (<namespace>_<pod>_<uid>) is unique across test beds.
        self.memory_folder = memory_root / f"specdeploy-pod-volumes.{folder.name}"
        self._in_memory: set[str] = set()
        self._refresh_at: dict[str, float] = {}

    def path(self, name: str) -> Path:
        return (self.memory_folder if name in self._in_memory else self.folder) / name

    def fill(
        self,
        pod: Pod,
        container: Container,
        mounts: list[PlannedMount],
        lookup: ObjectDataLookup,
        request_token: TokenLookup,
    ) -> None:
        """Write every volume the mounts need (an emptyDir only once: its data outlives a
        container restart). Raises ContainerConfigError as volume_files does."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        for mount in mounts:
            volume = volumes[mount.volume]
            if volume_kind(volume) == "emptyDir":
                if (volume.get("emptyDir") or {}).get("medium") == "Memory":
                    self._in_memory.add(mount.volume)
                target = self.path(mount.volume)
                target.mkdir(parents=True, exist_ok=True)
                target.chmod(0o777)
                continue
            contents = volume_files(pod, container, volume, lookup, request_token)
            write_volume(self.path(mount.volume), contents.files)
            if contents.refresh_after is not None:
                self._refresh_at[mount.volume] = time.monotonic() + contents.refresh_after

    def refresh_due(self) -> list[str]:
        """Volumes holding a token that must be renewed now."""
        now = time.monotonic()
        return [name for name, at in self._refresh_at.items() if now >= at]

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        shutil.rmtree(self.memory_folder, ignore_errors=True)


def write_volume(folder: Path, files: Mapping[str, VolumeFile]) -> None:
    """Replace the files of a volume folder; each file appears whole (written aside, then
    renamed), so a reader never sees half a token."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for relative, entry in files.items():
        path = folder / relative
        wanted.add(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(entry.content)
        os.chmod(tmp, entry.mode)
        tmp.replace(path)
    for existing in folder.rglob("*"):
        if existing.is_file() and existing not in wanted and not existing.name.startswith("."):
            with contextlib.suppress(OSError):
                existing.unlink()
