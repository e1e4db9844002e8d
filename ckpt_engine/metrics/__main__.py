"""``python -m ckpt_engine.metrics``: the node's sidecar sampler (``--check``: only whether it can run here)."""

from __future__ import annotations

from ckpt_engine.metrics.sidecar import main

raise SystemExit(main())
