"""Where an attempt ran: in a container of its image (which digest), or on the host without it (ADR 0035)."""

from __future__ import annotations

from typing import Any

from sat_tasks.core.attempt import AttemptRecord


def runtime_of(record: AttemptRecord) -> dict[str, Any]:
    """`runtime` (`container`, `host`, None: not known), `image` and `image_digest` (`sha256:...`) of an attempt.

    From the record's container status: a pod's `containerStatuses`, the local container
    runtime's entry of the same shape, or the entry a backend writes for an attempt it ran on a
    host without its image (`runtime: host`, `HOST_STATUS`).
    """
    for status in record.container_states:
        if not isinstance(status, dict) or status.get("init"):
            continue
        if status.get("runtime") == "host":
            return {"runtime": "host", "image": record.image, "image_digest": None}
        if status.get("image"):
            digest = str(status.get("imageID") or "")
            return {"runtime": "container", "image": str(status["image"]),
                    "image_digest": digest.rsplit("@", 1)[-1] or None}
    return {"runtime": None, "image": record.image, "image_digest": None}


def host_status(name: str) -> dict[str, Any]:
    """The container status of an attempt that ran on a host, its image not used (no state: nothing to classify)."""
    return {"name": name, "runtime": "host"}
