"""The ``runtime_config`` accepted by DecoratedCheckpointing, validated into a record."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ckpt_engine.errors import ConfigError

DEFAULT_GRACE_SECONDS = 30.0
GRACE_ENV = "CKPT_GRACE_SECONDS"
MIRROR_URL_ENV = "CKPT_MIRROR_URL"


@dataclass(frozen=True)
class RuntimeConfig:
    """Engine settings; the first four keys are the seed scripts' ones, the rest are optional.

    ``host_cache_size`` GB of host staging memory (allocated as needed up to it),
    ``parser_threads`` writer threads, ``pin_host_cache`` (pinned when CUDA is present),
    ``trainer`` the HF Trainer to hook, ``keep_last`` committed checkpoints kept (0 = all),
    ``on_error`` ``"continue"`` (log a failed checkpoint, train on) or ``"raise"`` (stop
    training with PersistError), ``keep_trainer_saves`` also run the Trainer's own
    periodic saves, ``checkpoint_dir`` (default ``<output_dir>/concurrent_checkpoint``),
    ``handle_sigterm`` final checkpoint on SIGTERM, ``grace_seconds`` (default from
    ``CKPT_GRACE_SECONDS``, else 30), ``max_in_flight`` checkpoints persisting at once,
    ``mirror_url`` Object Storage prefix (``s3://bucket/prefix/``) each committed checkpoint
    is copied to and restored from on a fresh node (default from ``CKPT_MIRROR_URL``),
    ``commit_timeout_s`` how long rank 0 waits for the other ranks' parts of a multi-rank
    (DeepSpeed, world size > 1) checkpoint before discarding it (see ckpt_engine.multirank).
    """

    host_cache_size: float = 50.0
    parser_threads: int = 1
    pin_host_cache: bool = True
    trainer: Any = None
    keep_last: int = 3
    on_error: str = "continue"
    keep_trainer_saves: bool = False
    checkpoint_dir: str | None = None
    handle_sigterm: bool = True
    grace_seconds: float | None = None
    max_in_flight: int = 1
    mirror_url: str | None = None
    commit_timeout_s: float = 600.0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> RuntimeConfig:
        """Validate ``raw``; unknown keys and bad values raise ConfigError naming the key."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"runtime_config must be a dict, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown runtime_config key(s) {unknown}; known keys: {sorted(known)}")
        config = cls(**raw)
        config._check()
        return config

    def _check(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"runtime_config[{key!r}]={getattr(self, key)!r}: {why}")

        if isinstance(self.host_cache_size, bool) or not isinstance(self.host_cache_size, (int, float)) \
                or not self.host_cache_size > 0:
            raise bad("host_cache_size", "must be a positive number of GB")
        for key, low in (("parser_threads", 1), ("keep_last", 0), ("max_in_flight", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(key, f"must be an integer >= {low}")
        for key in ("pin_host_cache", "keep_trainer_saves", "handle_sigterm"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key, "must be true or false")
        if self.on_error not in ("continue", "raise"):
            raise bad("on_error", "must be 'continue' or 'raise'")
        if self.grace_seconds is not None and (not isinstance(self.grace_seconds, (int, float))
                                               or self.grace_seconds <= 0):
            raise bad("grace_seconds", "must be a positive number of seconds")
        if isinstance(self.commit_timeout_s, bool) or not isinstance(self.commit_timeout_s, (int, float)) \
                or not self.commit_timeout_s > 0:
            raise bad("commit_timeout_s", "must be a positive number of seconds")
        if self.mirror_url is not None and (not isinstance(self.mirror_url, str) or "://" not in self.mirror_url):
            raise bad("mirror_url", "must be a URL such as s3://bucket/prefix/")

    def effective_grace_seconds(self) -> float:
        """Grace period for a final checkpoint after SIGTERM."""
        if self.grace_seconds is not None:
            return float(self.grace_seconds)
        raw = os.environ.get(GRACE_ENV)
        if raw:
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(f"{GRACE_ENV}={raw!r} is not a number of seconds") from None
            if value > 0:
                return value
        return DEFAULT_GRACE_SECONDS

    def effective_mirror_url(self) -> str | None:
        """Where checkpoints are mirrored: ``mirror_url``, else ``CKPT_MIRROR_URL``, else nowhere."""
        if self.mirror_url:
            return self.mirror_url
        return os.environ.get(MIRROR_URL_ENV, "").strip() or None
