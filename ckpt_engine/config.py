"""The ``runtime_config`` accepted by DecoratedCheckpointing, validated into a record."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ckpt_engine.contract import GRACE_ENV, MIRROR_URL_ENV
from ckpt_engine.errors import ConfigError

DEFAULT_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class RuntimeConfig:
    """Engine settings; the first four keys are the seed scripts' ones, the rest are optional.

    ``host_cache_size`` GB of host staging memory (allocated as needed up to it),
    ``parser_threads`` writer threads, ``pin_host_cache`` (pinned when CUDA is present),
    ``trainer`` the HF Trainer to hook, ``keep_last`` committed checkpoints kept (0 = all; it
    applies only when the Trainer's ``save_total_limit`` is None; unset and no limit: all are
    kept, as the Trainer keeps them),
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
    keep_last: int | None = None
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
            if key == "keep_last" and value is None:
                continue
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


DATASTATES_SECTION = "datastates_ckpt"
DATASTATES_ENGINE_TYPES = ("state_engine", "simple_engine", "state_aggregated_engine")
DATASTATES_MIN_CACHE_GB = 1 / 16  # host_cache_size 0 (upstream's "no host cache") still needs one 64 MiB slab


@dataclass(frozen=True)
class DataStatesConfig:
    """The DataStates-LLM ``runtime_config`` keys, validated (what the ``datastates`` alias accepts).

    Shapes accepted (as upstream): a flat dict (``{"host_cache_size": 1, ...}``), a DeepSpeed
    config dict (``{"datastates_ckpt": {...}, ...}``: only that section is read), a
    DeepSpeedConfig-like object (``.datastates_config.enabled`` / ``.config``), or None.
    Keys: ``host_cache_size`` GB of host staging memory (0 = the smallest pool),
    ``parser_threads`` writer threads, ``pin_host_cache``, ``engine_type`` (one of
    DATASTATES_ENGINE_TYPES; all run SAT's engine), ``profile_engine`` (log per-file
    timings), ``fast_cache_init`` (accepted, no effect), ``enabled`` (inside a
    ``datastates_ckpt`` section only). An unknown key or a bad value raises ConfigError
    naming it.
    """

    host_cache_size: float = 1.0
    parser_threads: int = 4
    pin_host_cache: bool = True
    engine_type: str = "state_engine"
    profile_engine: bool = False
    fast_cache_init: bool = False
    zero_stage: int | None = None  # from a DeepSpeedConfig object: which ranks write files

    @classmethod
    def from_any(cls, config: Any) -> DataStatesConfig:
        """Validate ``config`` in any shape upstream accepts."""
        if config is None:
            return cls()
        if isinstance(config, Mapping):
            if DATASTATES_SECTION in config:
                section = config[DATASTATES_SECTION]
                if section is False:
                    raise ConfigError(f"{DATASTATES_SECTION} is false: DataStates checkpointing is disabled")
                return cls._from_mapping({} if section is True else section, where=f"{DATASTATES_SECTION}.",
                                         allow_enabled=True)
            return cls._from_mapping(config, where="")
        section = getattr(config, "datastates_config", None)
        if section is None:
            raise ConfigError(f"runtime_config of type {type(config).__name__} is not supported: pass a dict, "
                              f"a DeepSpeed config dict with a {DATASTATES_SECTION!r} section, or a DeepSpeedConfig")
        if not getattr(section, "enabled", False):
            raise ConfigError(f"DeepSpeedConfig.datastates_config.enabled is false: add a {DATASTATES_SECTION!r} "
                              "section to the DeepSpeed config")
        _check_deepspeed_options(config)
        raw = getattr(section, "config", None)
        parsed = cls._from_mapping(raw if isinstance(raw, Mapping) else {}, where=f"{DATASTATES_SECTION}.",
                                   allow_enabled=True)
        stage = getattr(config, "zero_optimization_stage", None)
        return cls(**{**_fields_of(parsed), "zero_stage": stage if isinstance(stage, int) else None})

    @classmethod
    def _from_mapping(cls, raw: Any, *, where: str, allow_enabled: bool = False) -> DataStatesConfig:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where or 'runtime_config'} must be a dict, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)} - {"zero_stage"}
        values = {k: v for k, v in raw.items() if not (allow_enabled and k == "enabled")}
        unknown = sorted(str(k) for k in set(values) - known)
        if unknown:
            raise ConfigError(f"unknown DataStates config key(s) {[where + k for k in unknown]}; "
                              f"known keys: {sorted(known)}")
        if allow_enabled and "enabled" in raw and not isinstance(raw["enabled"], bool):
            raise ConfigError(f"{where}enabled={raw['enabled']!r}: must be true or false")
        config = cls(**values)
        config._check(where)
        return config

    def _check(self, where: str) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"DataStates config {where}{key}={getattr(self, key)!r}: {why}")

        size = self.host_cache_size
        if isinstance(size, bool) or not isinstance(size, (int, float)) or size < 0:
            raise bad("host_cache_size", "must be a number of GB >= 0")
        if isinstance(self.parser_threads, bool) or not isinstance(self.parser_threads, int) \
                or self.parser_threads < 1:
            raise bad("parser_threads", "must be an integer >= 1")
        for key in ("pin_host_cache", "profile_engine", "fast_cache_init"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key, "must be true or false")
        if self.engine_type not in DATASTATES_ENGINE_TYPES:
            raise bad("engine_type", f"must be one of {list(DATASTATES_ENGINE_TYPES)}")

    @property
    def cache_gb(self) -> float:
        """The staging pool size SAT's engine gets (``host_cache_size``, at least one slab)."""
        return max(float(self.host_cache_size), DATASTATES_MIN_CACHE_GB)

    def as_dict(self) -> dict[str, Any]:
        """The upstream keys and their values (what upstream's ``parse_config`` returns)."""
        return {k: v for k, v in _fields_of(self).items() if k != "zero_stage"}


def _fields_of(config: Any) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config)}


def _check_deepspeed_options(config: Any) -> None:
    """What upstream refuses in a DeepSpeedConfig: offloaded parameters, universal checkpoint loading."""
    zero = getattr(config, "zero_config", None)
    offload = getattr(zero, "offload_param", None)
    device = getattr(offload, "device", None)
    if offload is not None and str(getattr(device, "value", device)) not in ("None", "none"):
        raise ConfigError(f"zero_optimization.offload_param.device={device!r}: checkpoints of offloaded parameters "
                          "are not supported with datastates_ckpt (as upstream)")
    if getattr(config, "load_universal_checkpoint", False) is True:
        raise ConfigError("load_universal_checkpoint=true is not supported with datastates_ckpt (as upstream)")
