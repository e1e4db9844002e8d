"""File Storage volumes: the operator defines them, a job picks one by name (issue 44.3, ADR 0040).

`[sat] file_storage_volumes` is a JSON object, volume name -> definition:

    {"datasets": {"claim": "fs-datasets", "mount_path": "/mnt/datasets"},
     "scratch": {"claim": "fs-scratch", "mount_path": "/mnt/scratch", "read_only": false}}

- `claim`: a PersistentVolumeClaim in the jobs' namespace (required). A host directory is offered
  the same way: the operator binds it to a claim through a PersistentVolume (`hostPath` or `local`),
  so no SAT pod names a node path (Pod Security "restricted" refuses `hostPath` volumes).
- `mount_path`: where the training container sees it (absolute, no `..`, not one of SAT's own paths).
- `read_only`: true unless the operator says false.

A job's `storage.file_storage_mount` names one of them; an absolute path (what it took before)
is refused with a message saying so. Nothing here imports the Kubernetes client.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sat_tasks.config import sat_setting
from sat_tasks.errors import SatError

SETTING = "file_storage_volumes"
VOLUME_NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$"
VOLUME_NAME_RULE = ("must name a File Storage volume the operator defined in [sat] file_storage_volumes "
                    "(1-63 lowercase letters, digits or '-')")
PATH_REFUSED = ("a path is no longer accepted: name a File Storage volume the operator defined in "
                "[sat] file_storage_volumes (ADR 0040)")
# Paths a volume may not be mounted at or under: SAT's own mounts and the system's.
_RESERVED = ("/opt/sat", "/dev", "/proc", "/sys", "/etc", "/bin", "/sbin", "/usr", "/lib", "/lib64", "/var/run",
             "/run", "/tmp/sat-metrics")


class FileStorageSettingError(SatError, ValueError):
    """`[sat] file_storage_volumes` is malformed; the message names the setting and the volume."""


@dataclass(frozen=True)
class FileStorageVolume:
    """One operator-defined File Storage volume."""

    name: str
    claim: str
    mount_path: str
    read_only: bool = True


def _problem(name: str, entry: Any) -> str | None:
    if not re.fullmatch(VOLUME_NAME_PATTERN, name):
        return "the name must be 1-63 lowercase letters, digits or '-'"
    if not isinstance(entry, dict):
        return "must be an object with claim and mount_path"
    unknown = set(entry) - {"claim", "mount_path", "read_only"}
    if "host_path" in unknown:
        return ("host_path is not supported: bind the host directory to a claim through a PersistentVolume "
                "(SAT's pods mount no hostPath; ADR 0040)")
    if unknown:
        return f"unknown keys {sorted(unknown)} (claim, mount_path, read_only)"
    claim, path = entry.get("claim"), entry.get("mount_path")
    if not isinstance(claim, str) or not re.fullmatch(r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?", claim):
        return "claim must be a PersistentVolumeClaim name"
    if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/") or "//" in path:
        return "mount_path must be an absolute path without '..'"
    clean = path.rstrip("/") or "/"
    if clean == "/" or any(clean == r or clean.startswith(r + "/") or r.startswith(clean + "/") for r in _RESERVED):
        return f"mount_path {path!r} is or holds a path SAT or the system uses"
    if not isinstance(entry.get("read_only", True), bool):
        return "read_only must be true or false"
    return None


def parse_volumes(raw: str) -> dict[str, FileStorageVolume]:
    """The volumes of a `[sat] file_storage_volumes` value ("" = none); FileStorageSettingError when malformed."""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise FileStorageSettingError(f"[sat] {SETTING}: must be a JSON object of volume name -> "
                                      "{claim, mount_path, read_only}") from None
    if not isinstance(data, dict):
        raise FileStorageSettingError(f"[sat] {SETTING}: must be a JSON object of volume name -> definition")
    volumes = {}
    for name, entry in data.items():
        problem = _problem(name, entry)
        if problem:
            raise FileStorageSettingError(f"[sat] {SETTING}: volume {name[:63]!r}: {problem}")
        volumes[name] = FileStorageVolume(name, entry["claim"], entry["mount_path"].rstrip("/"),
                                          entry.get("read_only", True))
    return volumes


def file_storage_volumes() -> dict[str, FileStorageVolume]:
    """The deployment's File Storage volumes (`[sat] file_storage_volumes`)."""
    return parse_volumes(sat_setting(SETTING, default=""))


def check_volume_name(name: str) -> str:
    """`name` when it is a volume the operator defined; ValueError (the field's rule) otherwise."""
    if name.startswith("/"):
        raise ValueError(PATH_REFUSED)
    if not re.fullmatch(VOLUME_NAME_PATTERN, name):
        raise ValueError(VOLUME_NAME_RULE)
    try:
        volumes = file_storage_volumes()
    except FileStorageSettingError as exc:
        raise ValueError(f"cannot be checked: {exc}") from None
    if name not in volumes:
        known = ", ".join(sorted(volumes)) or "none are defined"
        raise ValueError(f"{VOLUME_NAME_RULE}; {name!r} is not one of them ({known})")
    return name


def volume_of(name: str) -> FileStorageVolume:
    """The volume a job names (KeyError naming the field when the operator no longer defines it)."""
    volumes = file_storage_volumes()
    if name not in volumes:
        raise KeyError(f"storage.file_storage_mount: {VOLUME_NAME_RULE}; {name!r} is not one of them")
    return volumes[name]
