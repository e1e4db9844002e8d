"""The GPUs of the node through NVML (``nvidia-ml-py``), for the ``system`` series."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class GpuReader:
    """Per-device readings through NVML (``nvidia-ml-py``); ``devices() == 0`` without a GPU or NVML.

    Anything NVML cannot read is said once in the log (``say``) and left out; a field that
    fails on one device does not stop the others.
    """

    def __init__(self, say: Callable[[str], None], nvml: Any = None) -> None:
        self.say = say
        self._said: set[str] = set()
        self._nvml = nvml
        self._handles: list[Any] = []
        try:
            if self._nvml is None:
                import pynvml as nvml_module

                self._nvml = nvml_module
            self._nvml.nvmlInit()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._nvml.nvmlDeviceGetCount())]
        except Exception as exc:  # noqa: BLE001 - no library, no driver, no device: no GPU series
            self._handles = []
            self._once("init", f"[sat metrics] no GPU series: NVML cannot be read ({type(exc).__name__}: {exc})")

    def _once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.say(message)

    def devices(self) -> int:
        return len(self._handles)

    @staticmethod
    def _reads(nvml: Any, handle: Any) -> list[tuple[str, Callable[[], dict[str, float]]]]:
        def memory() -> dict[str, float]:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return {"memory_used_bytes": float(info.used), "memory_total_bytes": float(info.total)}

        return [
            ("utilization", lambda: {"gpu_utilization_percent": float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)}),
            ("memory", memory),
            ("temperature", lambda: {"temperature_c": float(nvml.nvmlDeviceGetTemperature(handle, 0))}),
            ("power", lambda: {"power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}),
            ("ecc", lambda: {"ecc_corrected": float(nvml.nvmlDeviceGetTotalEccErrors(handle, 0, 1)),
                             "ecc_uncorrected": float(nvml.nvmlDeviceGetTotalEccErrors(handle, 1, 1))}),
        ]

    def read(self) -> list[tuple[str, dict[str, float]]]:
        """``[(device, values)]`` for every GPU; values NVML could not read are absent."""
        out = []
        nvml = self._nvml
        for index, handle in enumerate(self._handles):
            values: dict[str, float] = {}
            for name, read in self._reads(nvml, handle):
                try:
                    values.update(read())
                except Exception as exc:  # noqa: BLE001 - e.g. ECC or power not supported on this board
                    self._once(f"{index}:{name}", f"[sat metrics] gpu{index}: {name} not readable through NVML "
                                                  f"({type(exc).__name__}: {exc}); left out")
            out.append((f"gpu{index}", values))
        return out
