"""The process kubelet's image map: which images it can run, and as what local program.

A container runtime runs an image's ENTRYPOINT and CMD with the image's environment; the process
kubelet has no images, so each image it knows maps to a local stand-in: the entry point and
default arguments the image's Dockerfile declares (its exec-form ENTRYPOINT and CMD), found on
a local PATH (the project's virtualenv stands in for the operator image's), and the image's
environment. The map is a JSON file, `{image reference: entry}`, that the cluster manager
writes at start (`testbed.cluster`); an image it does not list runs only with a `command`.

Kubernetes' rules for combining a container's `command` and `args` with the image's own
(`build_image_command`): no command and no args, the image's ENTRYPOINT + CMD; args only, the
ENTRYPOINT + args; a command, the command + args (the image's CMD is dropped).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ImageEntry:
    """What an image runs here: its entry point, its default arguments, its environment."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    #: The image's environment (Dockerfile ENV), under the container's own `env`.
    env: Mapping[str, str] = field(default_factory=dict)
    #: Where the entry is defined (a Dockerfile), for logs and docs.
    source: str = ""
    #: A network namespace of its own (`pod_network`): its ports are fixed, not
    #: SPECDEPLOY_PORT, so two pods of it on one host would collide in the host's.
    own_network: bool = False
    #: Host folders standing in for the image's own files (the project and its virtualenv):
    #: a volume mounted over a parent of one (an emptyDir at /tmp, with the project under /tmp)
    #: does not hide it, as a volume never hides an image's files (container_init's `keep`).
    files: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "entrypoint": list(self.entrypoint),
            "cmd": list(self.cmd),
            "env": dict(self.env),
            "source": self.source,
            "ownNetwork": self.own_network,
            "files": list(self.files),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageEntry:
        return cls(
            entrypoint=tuple(data.get("entrypoint") or ()),
            cmd=tuple(data.get("cmd") or ()),
            env=dict(data.get("env") or {}),
            source=str(data.get("source") or ""),
            own_network=bool(data.get("ownNetwork")),
            files=tuple(data.get("files") or ()),
        )


ImageMap = Mapping[str, ImageEntry]


def read_image_map(path: Path | None) -> dict[str, ImageEntry]:
    """The map in `path` (none: empty)."""
    if path is None:
        return {}
    raw: dict[str, Any] = json.loads(path.read_text())
    return {image: ImageEntry.from_json(entry) for image, entry in raw.items()}


def write_image_map(path: Path, images: ImageMap) -> None:
    text = json.dumps({k: v.to_json() for k, v in sorted(images.items())}, indent=2)
    path.write_text(text + "\n")


def build_image_command(
    command: Sequence[str], args: Sequence[str], image: ImageEntry | None
) -> list[str]:
    """The argv a runtime would run for a container with this `command` and `args`."""
    if command:
        return [*command, *args]
    if image is None:
        return []
    if args:
        return [*image.entrypoint, *args]
    return [*image.entrypoint, *image.cmd]


_INSTRUCTION = re.compile(r"^\s*(ENTRYPOINT|CMD|ENV)\s+(.*)$", re.IGNORECASE)


def _logical_lines(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in dockerfile.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") and not current:
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def image_entry_from_dockerfile(
    dockerfile: str, find_program: Mapping[str, str], source: str = "", own_network: bool = False
) -> ImageEntry:
    """The entry of an image built from `dockerfile`: its last exec-form ENTRYPOINT and CMD
    (a shell form is refused: it would need the image's shell), its ENV `key=value` pairs
    except PATH, whose directories are the image's; the entry point's program is replaced by
    `find_program[program]` (the local stand-in), and must be there."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    env: dict[str, str] = {}
    for line in _logical_lines(dockerfile):
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        instruction, rest = match.group(1).upper(), match.group(2).strip()
        if instruction == "ENV":
            for pair in rest.split():
                key, sep, value = pair.partition("=")
                if not sep:
                    raise ValueError(f"{source}: only `ENV key=value` forms are read: {line!r}")
                if key != "PATH":
                    env[key] = value
            continue
        if not rest.startswith("["):
            raise ValueError(f"{source}: {instruction} must be in exec form (JSON): {line!r}")
        parsed = json.loads(rest)
        if instruction == "ENTRYPOINT":
            entrypoint = [str(part) for part in parsed]
        else:
            cmd = [str(part) for part in parsed]
    if entrypoint:
        program = entrypoint[0]
        if program not in find_program:
            raise ValueError(f"{source}: no local stand-in for the entry point {program!r}")
        entrypoint[0] = find_program[program]
    return ImageEntry(tuple(entrypoint), tuple(cmd), env, source, own_network)
