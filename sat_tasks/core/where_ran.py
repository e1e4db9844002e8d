"""Where an attempt ran: in a container of its image (which digest), or on the host without it (ADR 0035)."""

from __future__ import annotations

from typing import Any

from sat_tasks.core.attempt import AttemptRecord


def runtime_of(record: AttemptRecord) -> dict[str, Any]:
    """`runtime` (`container`, `host`, None: not known), `image` and `image_digest` (`sha256:...`) of an attempt.

    From the record's container status (a pod's `containerStatuses`, or the local container
    runtime's entry of the same shape); a local attempt without one ran on the host, where its
    image was not used.
    """
    for status in record.container_states:
        if isinstance(status, dict) and not status.get("init") and status.get("image"):
            digest = str(status.get("imageID") or "")
            return {"runtime": "container", "image": str(status["image"]),
                    "image_digest": digest.rsplit("@", 1)[-1] or None}
    return {"runtime": "host" if record.backend == "local" else None, "image": record.image, "image_digest": None}
