"""What the classifier knows: the NVIDIA Xid catalog, the log-line rules, and the Kubernetes words it reads.

Data only (patterns and tables); `sat_tasks.classify.evidence` applies them to a record.
docs/adr/0004-failure-classification.md says why each entry points where it does.
"""

from __future__ import annotations

import re
import signal as signal_module
from dataclasses import dataclass
from datetime import timedelta

from sat_tasks.classify.catalogues import (
    CATALOGUES,
    CUDA_RUNTIME,
    NVIDIA_XID,
    QUESTION_LINE,
    Catalogue,
    Fault,
)
from sat_tasks.core.handoffs import VerdictKind

HW, INT = VerdictKind.HARDWARE, VerdictKind.INTERNAL

#: The Xid dictionaries, derived from the NVIDIA Xid catalogue (`catalogues.NVIDIA_XID`: every code, once).
#: The node (GPU, NVLink, GSP, memory) is at fault → fail over. Xid 154 is read by its recovery action.
HARDWARE_XIDS: dict[int, str] = {int(c.code): c.reason for c in NVIDIA_XID.codes if c.fault is Fault.NODE
                                 and c.code != 154}
#: Caused by the application (bad kernel, illegal address, ...) → the user's bug.
APPLICATION_XIDS: dict[int, str] = {int(c.code): c.reason for c in NVIDIA_XID.codes if c.fault is Fault.JOB}
#: Logged but not a fault of the node (corrected/contained ECC, unused, engines training does not use).
NOT_A_NODE_FAULT_XIDS: dict[int, str] = {int(c.code): c.reason for c in NVIDIA_XID.codes if c.fault is Fault.NONE}
#: The cause is open (hardware, driver or the application): relocation decides (SUSPECT_NODE, ADR 0004).
AMBIGUOUS_XIDS: dict[int, str] = {int(c.code): c.reason for c in NVIDIA_XID.codes if c.fault is Fault.AMBIGUOUS}
XID_RECOVERY_ACTION = 154  # GPU recovery action changed; a fault unless the action is "None"

#: An Xid as its emitters write it: the driver's `NVRM: Xid (PCI:0000:3b:00): 79, ...` (or `NVRM: Xid 79, ...`), the
#: same line without its `NVRM:` prefix (`Xid (PCI:0000:3b:00): 79`), and the device plugin's `XidCriticalError:
#: Xid=48`. The word "Xid" and a number anywhere else is not one: a comment, a path, a user's log message ("no Xid 79
#: errors", "triggers Xid 13/43"), a database's transaction id ("xid 119").
XID_LINE = re.compile(
    r"(?:\bNVRM:\s*(?=xid\b)|(?=xid\s*\(\s*(?:PCI:)?[0-9a-f]{4,8}:[0-9a-f]{2}:)|\bXidCriticalError:\s*(?=xid\s*=))"
    r"\bxid\b(?:\s+error)?\s*(?:\(([^)]*)\))?\s*[:=]?\s*(\d{1,3})\b", re.IGNORECASE)

# What launchers, log shippers and frameworks put in front of a line, stripped one after
# another until none is left: ANSI colours, `kubectl logs --timestamps` and ISO stamps,
# `[task <stamp>] [train]`, a pid in brackets, torchrun's `[rank0]:` / `[default0]:`, Ray's
# `(RayWorkerWrapper pid=4009)` / `(VllmWorker rank=1 pid=12231)`, vLLM's and glog's
# `ERROR 03-25 21:13:53 file.py:374]` / `E0418 18:12:58.648 217303 nvc.c:376]`, Python
# logging's `2024-01-01 12:00:00,123 - name - ERROR - ` and DeepSpeed's `[2024-..] [INFO] [f.py:1:g] `.
LINE_PREFIXES: tuple[re.Pattern[str], ...] = tuple(re.compile(pattern) for pattern in (
    r"^\x1b\[[0-9;]*m",
    r"^\d{4}-\d\d-\d\d[T ][\d:.,]+(?:Z|[+-]\d\d:?\d\d)?(?:\s+-\s+\S+\s+-\s+[A-Z]+\s+-)?\s+",
    r"^\[(?:task|\d{4}-\d\d-\d\d)[^\]]*\]\s*",
    r"^\[(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\]\s*(?:\[[^\]]*\]\s*)?",
    r"^\[[a-z_]+\]\s+",
    r"^\[\d+\]\s+",
    r"^\[(?:rank|default)\d+\]:\s?",
    r"^\((?:[A-Za-z_][\w.]*\s+)?(?:rank=\d+\s+)?pid=\d+(?:,\s*ip=[\d.]+)?\)\s*",
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+(?:\[[^\]]+\]|[\w.]+:\d+\])\s*",
    r"^[IWEF]\d{4}\s+[\d:.]+\s+\d+\s+[\w.]+:\d+\]\s*",
    r"^\[stderr\]\s*",
))


@dataclass(frozen=True)
class TextRule:
    """A log-line pattern, the verdict kind it points to and why.

    `family`: the rule's name in `sat classify --explain` and ADR 0004 (e.g. `pcie-aer`,
    `cuda:cudaErrorUnknown`). `peer_symptom`: what a healthy rank logs when another rank (or
    the link) failed; any evidence of the job's own error outranks it (a rank's exception, not
    its peers' timeouts). `unless`: a line this matches is not the rule's (a person's question quoting
    the tool); `requires`: the line must also match this (the context that makes the words a tool's).
    Line-level conditions stay out of `pattern`, so every search stays linear in the line's length.
    """

    pattern: re.Pattern[str]
    kind: VerdictKind
    reason: str
    beats_success: bool = True
    peer_symptom: bool = False
    family: str = ""
    unless: re.Pattern[str] | None = None
    requires: re.Pattern[str] | None = None

    def matches(self, line: str) -> bool:
        if self.unless is not None and self.unless.search(line):
            return False
        if self.requires is not None and not self.requires.search(line):
            return False
        return bool(self.pattern.search(line))


def rule(pattern: str, kind: VerdictKind, reason: str, *, beats_success: bool = True,
         peer_symptom: bool = False, family: str = "", unless: re.Pattern[str] | None = None,
         requires: str | None = None) -> TextRule:
    return TextRule(re.compile(pattern, re.IGNORECASE), kind, reason, beats_success, peer_symptom, family, unless,
                    re.compile(requires, re.IGNORECASE) if requires else None)


# The NVIDIA container runtime's hook failing on the node (driver not loaded, NVML, device
# node missing): the container never starts, Kubernetes says StartError/ContainerCannotRun.
NVIDIA_RUNTIME_PATTERN = (
    r"nvidia-container-cli(?:\.real)?: \w+ error|nvidia-container-runtime(?:-hook)?\b.*(?:error|failed)"
    r"|error running (?:prestart )?hook.*nvidia|prestart hook #?\d+.*nvidia"
)
NVIDIA_RUNTIME = re.compile(NVIDIA_RUNTIME_PATTERN, re.IGNORECASE)


# ---- CUDA runtime/driver errors ------------------------------------------------------------

@dataclass(frozen=True)
class CudaError:
    """One NVIDIA CUDA error code, decided once (ADR 0004, "CUDA errors").

    `names`: the runtime and driver enum names (`cudaErrorX`, `CUDA_ERROR_X`); `texts`: what
    `cudaGetErrorString`/`cuGetErrorString` return (and the older wordings frameworks print).
    `kind`: HARDWARE or INTERNAL; `ambiguous`: NVIDIA's own description leaves the cause open,
    so the finding counts only when nothing decisive is left (and errs toward HARDWARE).
    `in_nccl`: the decision also holds when NCCL reports the code from one of its own CUDA
    calls (`Cuda failure 'text'`); otherwise NCCL's "unhandled cuda error" rule decides there.
    """

    names: tuple[str, ...]
    texts: tuple[str, ...]
    kind: VerdictKind
    reason: str
    ambiguous: bool = False
    in_nccl: bool = False


#: Every CUDA error code that says something about the device, the node or the job, decided once.
CUDA_ERRORS: tuple[CudaError, ...] = (
    # -- the device or the node --
    CudaError(("cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE"), ("uncorrectable ECC error encountered",),
              HW, "an uncorrectable ECC error in GPU memory (the device)", in_nccl=True),
    CudaError(("cudaErrorNvlinkUncorrectable", "CUDA_ERROR_NVLINK_UNCORRECTABLE"),
              ("uncorrectable NVLink error detected during the execution",),
              HW, "an uncorrectable NVLink error (the node's GPU interconnect)", in_nccl=True),
    CudaError(("cudaErrorContained", "CUDA_ERROR_CONTAINED"),
              ("Invalid access of peer GPU memory over nvlink or a hardware error",),
              HW, "a device error the GPU contained (NVIDIA: a hardware error or a bad peer access over NVLink; "
                  "the hardware case is the common one on a training node)", in_nccl=True),
    CudaError(("cudaErrorSystemNotReady", "CUDA_ERROR_SYSTEM_NOT_READY"), ("system not yet initialized",),
              HW, "the node's GPU system is not initialized (Fabric Manager not running on an NVSwitch node)",
              in_nccl=True),
    CudaError(("cudaErrorUnknown", "CUDA_ERROR_UNKNOWN",
               "CUDA unknown error - this may be due to an incorrectly set up environment"), ("unknown error",),
              HW, "CUDA's \"unknown error\" (999) outside NCCL: the driver or the GPU is in a bad state"),
    CudaError(("cudaErrorNoDevice", "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected",
               "No CUDA GPUs are available"), ("no CUDA-capable device is detected",),
              HW, "the pod was given GPUs but CUDA sees none (device plugin, runtime or driver on the node)",
              in_nccl=True),
    CudaError(("cudaErrorDevicesUnavailable",), ("CUDA-capable device(s) is/are busy or unavailable",),
              HW, "the pod's GPU is busy or unavailable (held by another process or in a bad state)", in_nccl=True),
    CudaError(("cudaErrorLaunchTimeout", "CUDA_ERROR_LAUNCH_TIMEOUT"), ("the launch timed out and was terminated",),
              HW, "a kernel was stopped by the driver's watchdog: a node setting (display watchdog) or a hung GPU",
              ambiguous=True),
    CudaError(("cudaErrorInitializationError", "CUDA_ERROR_NOT_INITIALIZED"), ("initialization error",),
              HW, "CUDA could not be initialized: the node's driver or GPU as a rule, though using CUDA in a "
                  "forked child gives the same text", ambiguous=True),
    CudaError(("cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED"), ("unspecified launch failure",),
              HW, "an exception on the device while a kernel ran: NVIDIA names bad pointers and system-specific "
                  "(device) causes", ambiguous=True),
    CudaError(("cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR"), ("hardware stack error",),
              HW, "the device's call stack failed: corruption or a stack overflow in a kernel, or the device",
              ambiguous=True),
    CudaError(("cudaErrorPeerAccessUnsupported", "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"),
              ("peer access is not supported between these two devices",),
              HW, "GPU peer access is unavailable on this node (its PCIe/IOMMU/virtualisation setup)", ambiguous=True),
    # -- the job: its code, its configuration or its image --
    CudaError(("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"), ("out of memory",),
              INT, "out of GPU memory"),
    CudaError(("cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS"), ("an illegal memory access was encountered",),
              HW, "an illegal memory access: an out-of-bounds index or a bad pointer in a kernel, or a GPU whose "
                  "memory or MMU failed (with no Xid or ECC line to tell; those outrank this): relocation decides",
              ambiguous=True),
    CudaError(("cudaErrorIllegalInstruction", "CUDA_ERROR_ILLEGAL_INSTRUCTION"), ("an illegal instruction was encountered",),
              HW, "an illegal instruction: code compiled wrongly for the device, or a device that misread good "
                  "code: relocation decides", ambiguous=True),
    CudaError(("cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS"), ("misaligned address",),
              INT, "a misaligned memory access in a kernel (the code)"),
    CudaError(("cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC"), ("invalid program counter",),
              INT, "a kernel jumped to an invalid address (the code)"),
    CudaError(("cudaErrorAssert", "CUDA_ERROR_ASSERT"), ("device-side assert triggered",),
              INT, "a CUDA device-side assertion failed in the script's kernels (e.g. an index out of range)"),
    CudaError(("cudaErrorInvalidValue", "CUDA_ERROR_INVALID_VALUE"), ("invalid argument",),
              INT, "a CUDA call got an invalid argument (the code)"),
    CudaError(("cudaErrorInvalidDevice", "CUDA_ERROR_INVALID_DEVICE"), ("invalid device ordinal",),
              HW, "a GPU index beyond those CUDA sees: the job's configuration, or a GPU the node should have and "
                  "lost (device plugin, driver): relocation decides", ambiguous=True),
    CudaError(("cudaErrorLaunchOutOfResources", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
              ("too many resources requested for launch",), INT, "a kernel launch asked for too many resources (the code)"),
    CudaError(("cudaErrorPeerAccessAlreadyEnabled", "cudaErrorPeerAccessNotEnabled"),
              ("peer access is already enabled", "peer access has not been enabled"),
              INT, "misuse of the CUDA peer-access API (the code)"),
    CudaError(("cudaErrorNoKernelImageForDevice", "CUDA_ERROR_NO_BINARY_FOR_GPU"),
              ("no kernel image is available for execution on the device",),
              INT, "the image was built without kernels for this GPU architecture (the image, on any such node)"),
    CudaError(("cudaErrorUnsupportedPtxVersion", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
              ("the provided PTX was compiled with an unsupported toolchain",),
              INT, "the image's CUDA toolchain is newer than the fleet's driver (the image)"),
    CudaError(("cudaErrorInsufficientDriver", "The NVIDIA driver on your system is too old"),
              ("CUDA driver version is insufficient for CUDA runtime version",),
              INT, "the image needs a newer NVIDIA driver than the node has; the fleet shares its driver, so "
                   "another node fails the same way (the image)"),
    CudaError(("cudaErrorCompatNotSupportedOnDevice", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
              ("forward compatibility was attempted on non supported HW",),
              INT, "the image's CUDA forward-compatibility package does not support this GPU (the image)"),
    CudaError(("cudaErrorSystemDriverMismatch", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
              ("system has unsupported display driver / cuda driver combination",),
              INT, "the image's CUDA compat driver does not match the node's kernel driver (the image)"),
)

# How PyTorch ("CUDA error: ...", "CUDA driver error: ...", torch.AcceleratorError), Triton
# ("Triton Error [CUDA]: ..."), NCCL ("Cuda failure 'text'"), legacy THC ("cuda runtime error
# (30) : ..."), CuPy/JAX (the enum name) and CUDA samples or tools print a CUDA error: the
# code's text counts only after such a prefix on the same line, never as a bare phrase.
CUDA_ERROR_PREFIX = (
    r"(?:\bCUDA (?:driver )?error\b|\bcuda runtime error\b|\bCuda failure\b|\bTriton Error \[CUDA\]"
    r"|\bCUDA_ERROR_\w+|\bcudaError\w*|\bCUDA initialization\b|\bcudaGetDeviceCount\b"
    r"|\b(?:failed to|couldn't|could not) init(?:ialize)? CUDA\b|\bcuInit\b|\bCUDA call failed\b)"
)
NCCL_CUDA_FAILURE = re.compile(r"\bCuda failure\b")
# Where CUDA is being initialised: there an initialization error is the node's, not a fork.
CUDA_ENUMERATION = re.compile(
    r"cudaGetDeviceCount|cuInit|CUDA initialization|device enumeration|cudaSetDevice|(?:failed to|couldn't) init",
    re.IGNORECASE,
)


# Between two words of a code's text, one of these may stand: NVIDIA's documentation and the
# strings the runtime returns differ by such words ("an uncorrectable NVLink error was detected"
# in the enum's doc, "uncorrectable NVLink error detected" from cudaGetErrorString).
_FILLER = r"\s+(?:(?:was|were|is|are|has|have|been|the|a|an)\s+)?"


def _tolerant(text: str) -> str:
    """`text` as a pattern that admits a filler word between its words (see `_FILLER`)."""
    return _FILLER.join(re.escape(word) for word in text.split())


def _cuda_text_pattern(error: CudaError) -> str:
    names = "|".join(re.escape(name) for name in error.names)
    texts = "|".join(_tolerant(text) for text in error.texts)
    return rf"\b(?:{names})\b|{CUDA_ERROR_PREFIX}[^\n]{{0,160}}?(?:{texts})"


def _cuda_family(error: CudaError) -> str:
    return f"cuda:{error.names[0]}"


def cuda_rule(error: CudaError) -> TextRule:
    kind = "ambiguous: " if error.ambiguous else ""
    choice = (". Chose relocation (SUSPECT_NODE): a code bug costs one extra attempt on another node, a bad GPU no "
              "longer costs the job (ADR 0004)") if error.ambiguous else ""
    return rule(_cuda_text_pattern(error), error.kind, f"{kind}{error.names[0]}: {error.reason}{choice}",
                family=_cuda_family(error))


CUDA_RULES: tuple[TextRule, ...] = tuple(cuda_rule(error) for error in CUDA_ERRORS if not error.ambiguous)
CUDA_AMBIGUOUS_RULES: tuple[TextRule, ...] = tuple(cuda_rule(error) for error in CUDA_ERRORS if error.ambiguous)
#: Families whose decision does not hold inside NCCL's own "Cuda failure 'text'" line.
CUDA_OUTSIDE_NCCL_ONLY = frozenset(_cuda_family(error) for error in CUDA_ERRORS if not error.in_nccl)
# An initialization error while CUDA enumerates the devices is the node's (decisive).
CUDA_INIT_AT_ENUMERATION = rule(
    r"(?:cudaGetDeviceCount|cuInit|cuDeviceGet\w*|CUDA initialization|cudaSetDevice|CUDA device count"
    r"|(?:failed to|couldn't) init(?:ialize)? CUDA)"
    r"[^\n]{0,200}?(?:initialization error|CUDA_ERROR_NOT_INITIALIZED|cudaErrorInitializationError)",
    HW, "cudaErrorInitializationError while CUDA enumerated the devices: the node's driver or GPU",
    family="cuda:cudaErrorInitializationError@enumeration",
)

# An allocation that failed on a device with memory free: PyTorch's "CUDA out of memory" names the
# request and what was free (before 2.1: "(GPU 0; 79 GiB total capacity; 1 GiB already allocated;
# 70 GiB free; ...)", since: "GPU 0 has a total capacity of 79 GiB of which 70 GiB is free"). With
# far more free than asked for, memory the device cannot hand out (retired pages, an uncorrectable
# ECC error surfacing only as an allocation failure) is as likely as the job: relocation decides.
OOM_TRIED = re.compile(r"Tried to allocate ([\d.]+) ?([KMGT]i?B)", re.IGNORECASE)
OOM_FREE = re.compile(r"(?:;\s*([\d.]+) ?([KMGT]i?B) free\b|of which ([\d.]+) ?([KMGT]i?B) is free)", re.IGNORECASE)
OOM_FREE_FACTOR = 2.0  # free at least twice the request...
OOM_FREE_MIN_BYTES = 1 << 30  # ...and at least 1 GiB: not fragmentation at the edge of a full device
OOM_WITH_MEMORY_FREE = rule(
    r"CUDA out of memory", HW,
    "ambiguous: a GPU allocation failed with memory free on the device (far more than asked for): retired or "
    "uncorrectable memory the device cannot hand out, or the job's allocator. Chose relocation (SUSPECT_NODE): a "
    "code bug costs one extra attempt on another node, a bad GPU no longer costs the job (ADR 0004)",
    family="cuda-oom-with-memory-free",
)
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_bytes(number: str, unit: str) -> float:
    """`2.00`, `GiB` -> bytes (KiB/KB alike: the text rounds anyway)."""
    try:
        return float(number) * _UNITS.get(unit[:1].lower(), 1)
    except ValueError:
        return 0.0


def oom_with_memory_free(line: str) -> bool:
    """A "CUDA out of memory" line whose device had far more memory free than the failed request."""
    tried, free = OOM_TRIED.search(line), OOM_FREE.search(line)
    if not tried or not free or not OOM_WITH_MEMORY_FREE.pattern.search(line):
        return False
    asked = size_bytes(*tried.groups())
    have = size_bytes(free.group(1) or free.group(3), free.group(2) or free.group(4))
    return have >= max(asked * OOM_FREE_FACTOR, OOM_FREE_MIN_BYTES)


# ---- kernel-log families beyond Xid ---------------------------------------------------------

KERNEL_RULES: tuple[TextRule, ...] = (
    # PCIe Advanced Error Reporting. Corrected errors are retried by the link itself: no rule.
    rule(r"AER: (?:Multiple )?Uncorrect(?:ed|able) \(Fatal\) error|severity=Uncorrect(?:ed|able) \(Fatal\)",
         HW, "a fatal uncorrected PCIe error (AER) on the node", family="pcie-aer"),
    rule(r"AER: (?:Multiple )?Uncorrect(?:ed|able) \(Non-Fatal\) error|severity=Uncorrect(?:ed|able) \(Non-Fatal\)",
         HW, "an uncorrected PCIe error (AER, non-fatal) on the node", beats_success=False, family="pcie-aer"),
    rule(r"AER: (?:device recovery failed|can't recover)|broadcast error_detected message|error_detected\(\) failed",
         HW, "the kernel could not recover a PCIe device after an AER error", family="pcie-aer"),
    rule(r"AER: (?:Root|Downstream) Port link has been reset|\bSurprise Down\b|pcieport .*\bLink Down\b"
         r"|pciehp.*\bLink Down\b|Slot\(\S+\): Link Down",
         HW, "a PCIe link of the node went down or was reset", beats_success=False, family="pcie-link"),
    # Machine checks and memory errors (EDAC, MCE, APEI/GHES). Corrected ones alone are not faults.
    rule(r"\[Hardware Error\].*(?:\buncorrected\b|\bfatal\b|severity: recoverable|Machine Check Exception)"
         r"|EDAC .*\bUE\b|Uncorrected hardware memory error|Fatal [Mm]achine check|mce: .*\bUncorrected\b",
         HW, "uncorrected machine check / memory error", family="edac-mce"),
    rule(r"Memory failure: 0x[0-9a-f]+", HW, "host memory failure (hwpoison)", family="edac-mce"),
    # InfiniBand / RoCE ports (mlx5 and the IB core). A port that comes up is not a fault.
    rule(r"mlx5_core\b.*(?:health compromised|mlx5_fw_fatal|device'?s? health|internal error state|fatal error)"
         r"|NETDEV WATCHDOG: .*transmit queue \d+ timed out",
         HW, "the node's network adapter failed (mlx5 firmware/health, a transmit queue hung)", family="nic"),
    rule(r"\bSXid \([^)]*\): \d+, Fatal\b", HW, "a fatal NVSwitch error (SXid) on the node", family="nvswitch"),
    rule(r"\b(?:IBV_EVENT_PORT_ERR|port state (?:changed to )?(?:DOWN|INIT)\b|Link (?:DOWN|down)\b.*mlx5"
         r"|mlx5_\S+: .*Link DOWN|mlx5_core\b.*\blink down\b|NET/IB : Got async event : port error"
         r"|Port module event(?:\[error\])?: module \d+, Cable (?:unplugged|error)|\blost carrier\b)",
         HW, "InfiniBand/RoCE link down", beats_success=False, family="infiniband-link"),
)

# ---- a GPU lost to the node: the driver's and NVML's own phrasings, not the words in prose ----------------
#: The kernel driver's report, as NVRM prints it (not a quote of it: no quote mark right before `NVRM:`):
#: `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`, `NVRM: GPU at PCI:0000:3b:00: ... fallen off the bus`,
#: the multi-line `NVRM: The NVIDIA GPU 0000:b3:00.0` / `NVRM: (PCI ID: 10de:26b5) installed in this system has` /
#: `NVRM: fallen off the bus and is not responding to commands.`, the Xid 79 line, and the open driver's checks
#: `Assertion failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST]`.
GPU_OFF_THE_BUS = (
    r"(?<!['\"`])\bNVRM:\s*(?:GPU (?:at )?(?:PCI:)?[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.\d)?:\s*)?"
    r"(?:GPU has |The NVIDIA GPU [0-9a-f:.]+ \(PCI ID: [0-9a-f:]+\)[^\n]{0,40}? has |installed in this system has )?"
    r"fallen off the bus"
    r"|(?<!['\"`])\bNVRM: Xid \([^)]*\): 79,[^\n]{0,200}fallen off the bus"
    r"|\bGPU lost from the bus\b[^\n]{0,40}\bNV_ERR_GPU_IS_LOST\b|\bNV_ERR_GPU_IS_LOST\b"
)
#: NVML's: its return code by name (C `NVML_ERROR_GPU_IS_LOST`, pynvml `NVMLError_GpuIsLost`, go-nvml
#: `ERROR_GPU_IS_LOST`), nvidia-smi's `Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost`, and
#: `nvmlErrorString`'s "GPU is lost" as the error value of an NVML, DCGM or device call (`...: GPU is lost`,
#: `err="GPU is lost"`, on a line that names NVML, DCGM, a device or its handle) -- not "GPU is lost: false" from a
#: health check, nor the words in a sentence.
GPU_IS_LOST_NAMED = (
    r"\bNVML_ERROR_GPU_IS_LOST\b|\bNVMLError_GpuIsLost\b|\bERROR_GPU_IS_LOST\b"
    r"|Unable to determine the device handle for (?:GPU|gpu)\s*[\w:.]*: GPU is lost"
)
GPU_IS_LOST_VALUE = r"(?:[:=]\s{0,3}[\"']?|\berr(?:or)?\s)GPU is lost\b(?!\s{0,3}[:=]\s{0,3}(?:false|no|0|none)\b)"
GPU_LOST_CONTEXT = r"nvml|dcgm|device|handle|nvidia-smi"
GPU_LOST_RULES: tuple[TextRule, ...] = (
    rule(GPU_OFF_THE_BUS, HW, "GPU has fallen off the bus (the driver's report)", family="gpu-lost",
         unless=QUESTION_LINE),
    rule(GPU_IS_LOST_NAMED, HW, "GPU is lost (NVML's report)", family="gpu-lost", unless=QUESTION_LINE),
    rule(GPU_IS_LOST_VALUE, HW, "GPU is lost (NVML's report)", family="gpu-lost", unless=QUESTION_LINE,
         requires=GPU_LOST_CONTEXT),
)


# ---- collectives: timeouts are a peer's or the link's symptom, mismatches are the code's --------

# Send/recv count only as "<send|recv> operation": "failed to send request ... timed out" is an HTTP client's.
COLLECTIVE_OP = (r"(?:collective|all_?reduce|all_?gather\w*|reduce_?scatter\w*|broadcast|barrier|all_?to_?all\w*"
                 r"|i?send operation|i?recv operation|WorkNCCL|WorkGloo|WorkHCCL|WorkXCCL|NCCL work|NCCL operations?"
                 r"|ProcessGroup\w*)")
COLLECTIVE_RULES: tuple[TextRule, ...] = (
    # Not NCCL's "NET/IB : collective mismatch error": a transport-level size mismatch that NCCL's
    # maintainers trace to the NIC's relaxed-ordering setting (the node), left to the network rule.
    rule(r"Detected mismatch between collectives on ranks|Rank \d+ is running (?:inconsistent )?collective"
         r"|Mismatched collective detected|Desync (?:debugging )?report",
         INT, "the ranks ran different collectives (a code bug: every rank must call the same collectives in the "
              "same order)", family="collective-mismatch"),
    rule(r"Watchdog caught collective operation timeout|collective operation timeout|ProcessGroup\w*'s watchdog got "
         r"stuck|Timeout at NCCL work", HW, "a collective operation hung (NCCL watchdog timeout)",
         beats_success=False, peer_symptom=True, family="collective-timeout"),
    rule(rf"\b{COLLECTIVE_OP}\b[^\n]{{0,160}}?(?:\btimed out\b|\btimeout (?:after|at|of|exceeded|expired|waiting)\b"
         rf"|before timing out)|\b(?:timed out|timeout)\b(?: waiting)?[^\n]{{0,80}}?\bfor (?:the )?{COLLECTIVE_OP}\b"
         r"|\bwait(?:ing)? timeout after \d+\s*(?:ms|milliseconds|s|seconds)\b",
         HW, "a collective or peer operation timed out (a peer or the network stopped answering)",
         beats_success=False, peer_symptom=True, family="collective-timeout"),
    rule(r"failed to pass monitoredBarrier|monitoredBarrier, but received errors|NCCL communicator was aborted", HW,
         "a rank did not reach the barrier or its communicator was aborted (a peer failed or hung)",
         beats_success=False, peer_symptom=True, family="collective-timeout"),
    rule(r"(?-i:\bSocket Timeout\b)|client socket has timed out after \d+\s*ms while trying to connect"
         r"|Timed out after \d+ seconds waiting for clients|\bRendezvousTimeoutError\b",
         HW, "the rendezvous store timed out waiting for a peer (a peer or the network stopped answering)",
         beats_success=False, peer_symptom=True, family="collective-timeout"),
)

#: Line rules applied to the container log, the node's kernel log and event messages.
TEXT_RULES: tuple[TextRule, ...] = (
    *GPU_LOST_RULES,
    rule(r"uncorrectable ECC error encountered|\buncorrectable\b.*\bECC\b|\bECC\b.*\buncorrectable\b"
         r"|double bit error|\bDBE\b|uncontained ECC", HW, "uncorrectable ECC error", family="ecc"),
    CUDA_INIT_AT_ENUMERATION,
    *CUDA_RULES,
    *KERNEL_RULES,
    rule(r"RmInitAdapter failed", HW, "GPU failed to initialize", family="nvidia-driver"),
    rule(r"Driver/library version mismatch", HW, "NVIDIA driver/library mismatch on the node", family="nvml"),
    rule(r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", HW,
         "nvidia-smi cannot reach the node's NVIDIA driver", family="nvml"),
    rule(r"Unable to determine the device handle for (?:GPU|gpu)\s*[\w:.]*: (?:Unknown Error|GPU is lost)"
         r"|NVMLError_(?:Unknown|DriverNotLoaded|LibRmVersionMismatch)\b",
         HW, "NVML cannot use a GPU of the node (unknown error from its device handle)", family="nvml",
         unless=QUESTION_LINE),
    rule(r"I/O error, dev \w+|Remounting filesystem read-only", HW, "node disk I/O error", beats_success=False,
         family="disk"),
    *COLLECTIVE_RULES,
    rule(r"NCCL WARN NET/(IB|Socket|OFI|Plugin)\b(?!.*(?:No device found|Unable to (?:find|open)|ibv_open_device failed"
         r"|ibv_query_port failed|fi_getinfo failed))", HW, "NCCL network error",
         beats_success=False, family="nccl-network"),
    rule(r"remote process exited or there was a network error|\bncclRemoteError\b", HW,
         "NCCL remote error (a peer or the network failed)", beats_success=False, peer_symptom=True,
         family="nccl-network"),
    rule(r"IBV_WC_RETRY_EXC_ERR|transport retry counter exceeded|ibv_poll_cq error", HW,
         "InfiniBand transport error", beats_success=False, family="infiniband-transport"),
    rule(r"gloo.*(Connection (reset|closed) by peer|Connection refused|Read error|Timed out)"
         r"|Gloo connectFullMesh failed", HW, "gloo network error (a peer or the network failed)",
         beats_success=False, peer_symptom=True, family="gloo-network"),
    rule(r"CUDA out of memory|OutOfMemoryError", INT, "out of GPU memory", family="oom"),
    rule(r"Out of memory: Killed process|Memory cgroup out of memory|oom-kill:", INT,
         "out of host memory (kernel OOM killer)", family="oom"),
    rule(r"insufficient shared memory|Unexpected bus error encountered in worker", INT,
         "shared memory (/dev/shm) too small for the data loader", family="shm"),
    rule(r"error: (unrecognized arguments|the following arguments are required|argument \S+: invalid)", INT,
         "bad command-line arguments", family="arguments"),
    rule(r"can't open file .*No such file or directory|command not found|executable file not found"
         r"|exec format error", INT, "the command cannot be run", family="command"),
    rule(r"\bncclInvalidUsage\b|\bncclInvalidArgument\b", INT, "invalid use of NCCL", family="nccl-usage"),
    # The GPU is on the node and given to the pod, but cannot be used: the node's fault.
    rule(NVIDIA_RUNTIME_PATTERN, HW, "the NVIDIA container runtime failed on the node", family="nvidia-runtime"),
    rule(r"CUDA-capable devices?(?:\(s\))? (?:is/)?(?:are|is) busy or unavailable|cudaErrorDevicesUnavailable", HW,
         "the pod's GPU is busy or unavailable (held by another process or in a bad state)", family="gpu-busy"),
    rule(r"Failed to initialize NVML|NVML_ERROR_(?:DRIVER_NOT_LOADED|LIB_RM_VERSION_MISMATCH|UNKNOWN)"
         r"|nvmlInit\w* failed", HW, "NVML cannot be initialized (the node's GPU driver)", family="nvml"),
    # The interpreter's own crash report: the process's code (an extension, a library) crashed. A crash inside
    # NCCL (`evidence._find_nccl_segfault`) or beside a machine check is the node's, and those outrank this.
    rule(r"Fatal Python error: (?:Segmentation fault|Bus error|Aborted|Floating point exception|Illegal instruction)"
         r"|\bSegmentation fault \(core dumped\)", INT,
         "the process crashed in its own code (the interpreter's crash report: an extension or a library)",
         family="crash"),
    rule(r"device-side assert(?:ion)? triggered|Assertion `[^`]*` failed", INT,
         "a CUDA device-side assertion failed in the script's kernels (e.g. an index out of range)",
         family="device-assert"),
)

# ---- rules from the vendor catalogues (`catalogues`): each code once, after the rules above ----------
_RELOCATE = (". Chose relocation (SUSPECT_NODE): a code bug costs one extra attempt on another node, a bad "
             "device no longer costs the job (ADR 0004)")


def catalogue_rules(catalogue: Catalogue, skip: frozenset[str] = frozenset()) -> tuple[TextRule, ...]:
    """A line rule for each code of `catalogue` that points somewhere (NONE codes make none)."""
    made = []
    for code in catalogue.codes:
        if code.fault is Fault.NONE or code.name in skip:
            continue
        pattern = code.pattern or rf"\b{re.escape(code.name)}\b"
        kind = INT if code.fault is Fault.JOB else HW
        reason = f"{catalogue.title} {code.name}: {code.reason}"
        if code.fault is Fault.AMBIGUOUS:
            reason = f"ambiguous: {reason}{_RELOCATE}"
        made.append(rule(pattern, kind, reason, beats_success=code.beats_success, peer_symptom=code.weak,
                         family=f"{catalogue.key}:{code.code}",
                         unless=QUESTION_LINE if catalogue.key == "nvml-return" else None))
    return tuple(made)


_CUDA_NAMED = frozenset(name for error in CUDA_ERRORS for name in error.names)
#: Every catalogue's rules but the Xids' (`evidence.find_xids` reads those), decisive and ambiguous apart.
CATALOGUE_RULES: tuple[TextRule, ...] = tuple(
    made for catalogue in CATALOGUES if catalogue is not NVIDIA_XID
    for made in catalogue_rules(catalogue, _CUDA_NAMED if catalogue is CUDA_RUNTIME else frozenset()))
CATALOGUE_DECISIVE = tuple(r for r in CATALOGUE_RULES if not r.reason.startswith("ambiguous:"))
CATALOGUE_AMBIGUOUS = tuple(r for r in CATALOGUE_RULES if r.reason.startswith("ambiguous:"))
TEXT_RULES = (*TEXT_RULES, *CATALOGUE_DECISIVE)

#: NCCL's "unhandled cuda error" with no other sign: a CUDA call inside NCCL failed, which is
#: a driver or GPU fault as often as a CUDA/NCCL mismatch in the image. Ambiguous (ADR 0004).
AMBIGUOUS_RULES: tuple[TextRule, ...] = (
    *CUDA_AMBIGUOUS_RULES,
    rule(r"unhandled cuda error|ncclUnhandledCudaError|NCCL WARN Cuda failure\b(?!.*out of memory)", HW,
         "ambiguous: NCCL's CUDA call failed (\"unhandled cuda error\") with no other sign; a driver or GPU "
         "fault as often as a CUDA/NCCL mismatch in the image. Chose relocation (SUSPECT_NODE): a code bug costs "
         "one extra attempt on another node, a bad GPU no longer costs the job (ADR 0004)", family="nccl-cuda"),
    *CATALOGUE_AMBIGUOUS,
)

NCCL_SYSTEM_ERROR = re.compile(r"\bncclSystemError\b|unhandled system error", re.IGNORECASE)
SOCKET_ERROR = re.compile(
    r"Connection reset by peer|Connection refused|Broken pipe|Connection timed out|No route to host"
    r"|Software caused connection abort|Network is unreachable|Connection closed by remote peer",
    re.IGNORECASE,
)
SHM_ERROR = re.compile(r"shared memory|/dev/shm|No space left on device", re.IGNORECASE)
NCCL_FRAME = re.compile(r"libnccl\S*\.so|ncclProxy|\bnccl[A-Z]\w*\(", re.IGNORECASE)
SEGFAULT = re.compile(r"Segmentation fault|SIGSEGV|signal 11\b", re.IGNORECASE)
# How torchrun says a signal ended the run. A child killed by a signal (`exitcode : -9`,
# `Signal 9 (SIGKILL) received by PID`); a child that exited 128+n after handling signal n
# (`exitcode : 143`: the checkpoint engine exits so after its final checkpoint, also when
# another rank got the SIGTERM); torchrun itself stopped by a signal (torch >= 2.x:
# `SignalException: Process <pid> got signal: 15`).
TORCHRUN_SIGNAL = re.compile(
    r"Signal (\d+) \((SIG\w+)\) received by PID|exitcode\s*:\s*-(\d+)"
    r"|SignalException: Process \d+ got signal: (\d+)|exitcode\s*:\s*(129|1[3-8]\d|19[0-2])\b"
)
# The checkpoint engine's line on a rank that stopped because another rank got SIGTERM, and
# the verdict's reason for such a rank (k8s_launch.combine_rank_records ranks it last).
PEER_STOP = re.compile(r"\[Concurrent Checkpoint\] another rank received SIG(?:TERM|INT)")
PEER_STOP_REASON = "stopped with the other ranks after another rank received SIGTERM"
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
# An exception line without its traceback header (an excerpt, assertion-only output, a Ray
# task error): a dotted name ending in Error/Exception/Exit/Interrupt, then `:`, `(` or the end.
HEADERLESS_EXCEPTION = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?:\([\w.]*\))?(?::|$)"
)
# torch.distributed's errors name what a peer or the network did, not the script's own bug.
PEER_EXCEPTIONS = ("DistBackendError", "DistNetworkError", "DistStoreError")
# ...and so does an exception whose message is about the collective or the connection.
PEER_EXCEPTION_MESSAGE = re.compile(
    r"NCCL|communicator|ProcessGroup|collective|watchdog|Connection (?:reset|closed|refused)|Broken pipe",
    re.IGNORECASE,
)
# torchrun's summary of a failed child, and its own reaction to a signal: not a cause.
WRAPPER_EXCEPTIONS = ("ChildFailedError", "SignalException")

# Kubernetes words.
IMAGE_WAITING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "ErrImageInspect",
    "ImageInspectError", "RegistryUnavailable", "ErrRegistryUnavailable",
})
INTERNAL_WAITING_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
INTERNAL_TERMINATION_REASONS = frozenset({"OOMKilled", "ContainerCannotRun", "StartError", "DeadlineExceeded"})
HARDWARE_TERMINATION_REASONS = frozenset({"Evicted", "NodeLost", "UnexpectedAdmissionError", "NodeAffinity"})
#: Evictions the pod brought on itself: over its own ephemeral-storage (or emptyDir) limit.
OWN_LIMIT_EVICTION = re.compile(
    r"exceeds the total limit of containers|exceeded its local ephemeral storage limit"
    r"|Usage of EmptyDir volume .* exceeds the limit",
    re.IGNORECASE,
)
NODE_LOW_ON_RESOURCE = re.compile(r"The node was low on resource|The node had condition", re.IGNORECASE)
PREEMPTED_TERMINATION_REASONS = frozenset({"Preempted", "Preempting", "Shutdown", "Terminated", "NodeShutdown"})
SHUTDOWN_MESSAGE = re.compile(r"node shutdown|shutting down|imminent node shutdown", re.IGNORECASE)
SPOT_WORDS = re.compile(r"\bspot\b|spot.?interrupt|preempt", re.IGNORECASE)
PREEMPTING_DISRUPTIONS = frozenset({"PreemptionByScheduler", "PreemptionByKubeScheduler"})
#: Kueue's pod condition when it evicts the pod's Workload (`WorkloadEvictedDueTo<reason>`, and
#: the older `StoppedByKueue`): which eviction reasons are a preemption (wait for quota, resume),
#: which the node's, and which are weighed only when nothing else is left (ADR 0004).
KUEUE_TERMINATION_CONDITION = "TerminationTarget"
KUEUE_PREEMPTING_EVICTIONS: dict[str, str] = {
    "Preempted": "Kueue preempted the workload to admit another one (priority or fair sharing)",
    "AdmissionCheck": "Kueue withdrew the workload's admission (an admission check such as a provisioning "
                      "request was retried or lost its capacity)",
    "ClusterQueueStopped": "the ClusterQueue was stopped by its operator: the quota went away, not the node",
    "InactiveWorkload": "the workload was deactivated in Kueue: the quota went away, not the node",
    "Deactivated": "the workload was deactivated in Kueue: the quota went away, not the node",
    "StoppedByKueue": "Kueue stopped the workload (its quota was taken back)",
}
KUEUE_NODE_EVICTIONS: dict[str, str] = {
    "NodeFailures": "Kueue evicted the workload because its node failed (topology-aware scheduling)",
}
#: PodsReadyTimeout: the gang did not become ready within Kueue's waitForPodsReady timeout. That
#: is part of the gang waiting for capacity as a rule (Kueue requeues it), but a pod that
#: crash-loops or cannot pull its image does the same, so it counts only when nothing else is
#: left, and then as a preemption (wait for capacity, resume), never as a fault of the node.
KUEUE_WEAK_EVICTIONS: dict[str, str] = {
    "PodsReadyTimeout": "the gang did not become ready within Kueue's waitForPodsReady timeout and Kueue "
                        "requeued it, with no sign of the pods' own failure: waiting for capacity",
}
KUEUE_EVICTION_REASON = re.compile(r"^(?:WorkloadEvictedDueTo|EvictedDueTo)(\w+)$")
#: Older Kueue events say only `Evicted`/`Stopped`; the message names the cause.
KUEUE_MESSAGE_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), cause) for pattern, cause in (
        (r"PodsReady timeout", "PodsReadyTimeout"),
        (r"no replacement for a failed node|node failures?", "NodeFailures"),
        (r"ClusterQueue\b.*\bstopped|stopped ClusterQueue", "ClusterQueueStopped"),
        (r"deactivated|inactive workload", "Deactivated"),
        (r"admission check", "AdmissionCheck"),
        (r"preempted", "Preempted"),
    ))
KUEUE_PREEMPTION_MESSAGE = re.compile(r"Preempted to accommodate|preempted by (?:rule|the scheduler)", re.IGNORECASE)
#: Karpenter's voluntary disruption of a node (consolidation, drift, expiry): a reclaim by policy,
#: not a fault. Events on the node/NodeClaim and the taints it puts on the node being disrupted
#: (`karpenter.sh/disrupted` since v1, `karpenter.sh/disruption=disrupting` before).
KARPENTER_DISRUPTION_EVENTS = frozenset({"DisruptionTerminating", "Disrupted", "DisruptionLaunching",
                                         "DisruptionWaitingReadiness"})
KARPENTER_DISRUPTION_TAINTS = frozenset({"karpenter.sh/disrupted", "karpenter.sh/disruption"})
KARPENTER_DISRUPTION_REASON = re.compile(r"\b(?:Underutili[sz]ed|Empty|Emptiness|Drift(?:ed)?|Expir(?:ed|ation)"
                                         r"|Consolidat\w*)\b", re.IGNORECASE)
#: Karpenter's node repair (v1.1+) deletes unhealthy nodes: the node's fault.
KARPENTER_UNHEALTHY = re.compile(r"\bUnhealthy\b|node repair|NodeRepair", re.IGNORECASE)
#: Notices that a Spot/VM instance is at risk or scheduled for maintenance, but not a kill: a
#: preemption only when the attempt was in fact killed from outside; alone they change nothing.
#: AWS node-termination-handler (events and taints), Azure Scheduled Events via node-problem-detector.
RISK_NOTICE_EVENTS = frozenset({"RebalanceRecommendation", "SpotRebalanceRecommendation", "ScheduledEvent",
                                "ASGLifecycle", "StateChange", "InstanceStopping", "InstanceTerminating",
                                "TerminateScheduled"})
RISK_NOTICE_TAINTS = re.compile(
    r"aws-node-termination-handler/(?:rebalance-recommendation|scheduled-maintenance|asg-lifecycle-termination)",
    re.IGNORECASE,
)
RISK_NOTICE_CONDITIONS = frozenset({"TerminateScheduled"})
#: Azure Scheduled Events' Preempt (a Spot VM eviction notice), as node-problem-detector reports it.
PREEMPT_CONDITIONS = frozenset({"PreemptScheduled"})
IMAGE_EVENT_MESSAGE = re.compile(
    r"Failed to pull image|Back-off pulling image|ErrImagePull|ImagePullBackOff|InvalidImageName"
    r"|pull access denied|manifest unknown|\b(401|403|404)\b.*(Unauthorized|Forbidden|Not Found)",
    re.IGNORECASE,
)
# The kubelet's words when a training pod's probes fail (see backends/kubernetes/supervisor.py):
# the startupProbe (no first training step in time) and the livenessProbe (no progress since).
STARTUP_PROBE = re.compile(r"Startup probe failed|failed startup probe", re.IGNORECASE)
LIVENESS_PROBE = re.compile(r"Liveness probe failed|failed liveness probe", re.IGNORECASE)
STARTUP_REASON = "the start-up did not reach the first training step in time (startup_timeout_seconds)"
PRESSURE_CONDITIONS = frozenset({"MemoryPressure", "DiskPressure", "PIDPressure"})
SPOT_TAINT = re.compile(r"spot-itn|spot-?interrupt|impending-node-termination|preempt", re.IGNORECASE)
#: Node labels (and taints) by which the common providers mark Spot/preemptible capacity;
#: `[sat] spot_node_labels` adds an on-premise pool's. Key -> value (None: any value).
SPOT_CAPACITY_LABELS: dict[str, str | None] = {
    "cloud.google.com/gke-spot": "true",                 # GKE Spot VMs
    "cloud.google.com/gke-preemptible": "true",          # GKE preemptible VMs
    "eks.amazonaws.com/capacityType": "SPOT",            # EKS managed node groups
    "karpenter.sh/capacity-type": "spot",                # Karpenter (EKS and others)
    "kubernetes.azure.com/scalesetpriority": "spot",     # AKS Spot node pools (label and taint)
    "node.kubernetes.io/lifecycle": "spot",              # eksctl / kops self-managed groups
}
NODE_DOWN_TAINTS = frozenset({
    "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready", "node.kubernetes.io/out-of-service",
})

# ---- who ended the process (`classify.ended`): families of words, not lists of reasons ----
#: Words of a disruption, in any component's reason or message (a deletion, an eviction, a
#: preemption, a scale-down, a reclaim, a drain, a consolidation, an expiry, ...).
DISRUPTION_WORDS = re.compile(
    r"preempt|evict|delet|drain|scal\w*[ -]?down|remov|reclaim|disrupt|deschedul|terminat|kill|interrupt"
    r"|consolidat|shut ?down|expir|drift|rebalanc|maintenance|retir|to ?be ?deleted|cordon|stopp?(?:ed|ing)\b"
    r"|underutili|idle|suspend|requeue",
    re.IGNORECASE,
)
#: ...but not these: what failed to happen, or a pod's own problem (a probe, a pull, a mount).
NOT_A_DISRUPTION = re.compile(
    r"fail|error|backoff|back-off|unhealthy|pull|mount|probe|\bScheduled\b|\bCreated\b|\bStarted\b",
    re.IGNORECASE,
)
#: A controller that acts because the node is broken (node repair, a failed-node replacement,
#: a health check): the node's fault, not a reclaim.
NODE_FAULT_WORDS = re.compile(
    r"unhealthy|node ?repair|NodeFailures?|failed node|hardware|health ?check|not ?ready|unreachable|faulty|"
    r"\bbroken\b|\bfault",
    re.IGNORECASE,
)
#: Graceful node shutdown (the kubelet's words): the node went down, as a rule for its owner.
SHUTDOWN_WORDS = re.compile(r"shut ?down|shutting down", re.IGNORECASE)
#: The kubelet, by whatever name an event or a manager gives it.
KUBELET = re.compile(r"^kubelet\b|\bkubelet$", re.IGNORECASE)
#: The kube-scheduler (default-scheduler), by its event source names.
KUBE_SCHEDULER = re.compile(r"^(?:default-scheduler|kube-scheduler|scheduler)$", re.IGNORECASE)
#: The node lifecycle: the node controller, its taint manager, the pod garbage collector.
NODE_CONTROLLERS = re.compile(
    r"node-?controller|node-?lifecycle|taint-?(?:eviction-?)?(?:manager|controller)|pod-?garbage|podgc",
    re.IGNORECASE,
)
#: A `DisruptionTarget` reason that names the kubelet (node pressure, graceful shutdown).
BY_KUBELET = re.compile(r"kubelet", re.IGNORECASE)
#: A `DisruptionTarget` reason that names the node's loss (garbage collection, NoExecute taints).
BY_NODE = re.compile(r"PodGC|GarbageCollect|TaintManager|Taint|NodeLifecycle|NodeLost|Unreachable|NotReady",
                     re.IGNORECASE)
#: Pod termination reasons of the kubelet and the runtime.
RUNTIME_REASONS = re.compile(r"^(?:OOMKilled|Evicted|OutOf\w+|DeadlineExceeded|UnexpectedAdmissionError)$")
#: Pod termination reasons that name the node going away.
NODE_REASONS = re.compile(r"^(?:NodeLost|NodeShutdown|Shutdown|Terminated|NodeAffinity)$")
#: Pod termination reasons that name a controller's preemption.
CONTROLLER_REASONS = re.compile(r"preempt", re.IGNORECASE)
#: Node taints a controller puts on a node it is taking away (cluster-autoscaler's
#: ToBeDeletedByClusterAutoscaler / DeletionCandidateOfClusterAutoscaler, Karpenter's disrupted,
#: a provider's termination or maintenance notice): the node's loss is then a reclaim.
RECLAIM_TAINT = re.compile(
    r"ToBeDeleted|DeletionCandidate|disrupt|drain|reclaim|terminat|preempt|scale-?down|spot|maintenance|rebalanc"
    r"|consolidat|retir",
    re.IGNORECASE,
)


EXTERNAL_KILL_SIGNALS = frozenset({signal_module.SIGKILL, signal_module.SIGTERM, signal_module.SIGHUP})

#: Kernel-log lines timestamped this long before the attempt started are stale.
NODE_LOG_SLACK_BEFORE = timedelta(seconds=60)
#: ...and this long after it ended are about something else.
NODE_LOG_SLACK_AFTER = timedelta(minutes=5)
ISO_STAMP = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:[.,]\d+)?(Z|[+-]\d\d:?\d\d)")


