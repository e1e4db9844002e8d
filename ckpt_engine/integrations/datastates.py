"""The DataStates-compatible surface, re-exported by the vendored ``datastates`` alias package.

``datastates.CheckpointEngine`` is what DeepSpeed's ``datastates_ckpt`` config loads;
``datastates.llm.DecoratedCheckpointing`` is what the service's training scripts use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ckpt_engine.integrations.deepspeed import DataStatesEngine as CheckpointEngine
    from ckpt_engine.integrations.hf import DecoratedCheckpointing

__all__ = ["CheckpointEngine", "DecoratedCheckpointing"]


def __getattr__(name: str) -> Any:
    # Each on first use: DeepSpeed's engine needs no transformers, the Trainer integration does.
    if name == "CheckpointEngine":
        from ckpt_engine.integrations.deepspeed import DataStatesEngine

        return DataStatesEngine
    if name == "DecoratedCheckpointing":
        from ckpt_engine.integrations.hf import DecoratedCheckpointing

        return DecoratedCheckpointing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
