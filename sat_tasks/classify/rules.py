"""What the classifier knows: the NVIDIA Xid catalog, the log-line rules, and the Kubernetes words it reads.

Data only (patterns and tables); `sat_tasks.classify.evidence` applies them to a record.
docs/adr/0004-failure-classification.md says why each entry points where it does.
"""

from __future__ import annotations

import re
import signal as signal_module
from dataclasses import dataclass
from datetime import timedelta

from sat_tasks.core.contracts import VerdictKind

HW, INT = VerdictKind.HARDWARE, VerdictKind.INTERNAL

#: NVIDIA Xids that mean the node (GPU, NVLink, GSP, memory) is at fault → fail over.
HARDWARE_XIDS: dict[int, str] = {
    48: "double-bit (uncorrectable) ECC error",
    62: "GPU internal micro-controller halt",
    64: "ECC page retirement / row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    136: "hardware fault (NVIDIA Xid catalog)",
    140: "unrecovered ECC error",
    143: "hardware fault (NVIDIA Xid catalog)",
    **{xid: "NVLink fault" for xid in range(144, 151)},
}
#: Xids caused by the application (bad kernel, illegal address, ...) → the user's bug.
APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception (application fault)",
    31: "GPU memory page fault (application fault)",
    43: "GPU stopped processing after an application fault",
    45: "preemptive cleanup after an earlier error",
}
#: Xids that are logged but do not make the node faulty (corrected/contained ECC events).
NOT_A_NODE_FAULT_XIDS: dict[int, str] = {
    63: "ECC page retirement / row remapping recorded",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
}
XID_RECOVERY_ACTION = 154  # GPU recovery action changed; a fault unless the action is "None"

XID_LINE = re.compile(r"\bxid\b(?:\s+error)?\s*(?:\(([^)]*)\))?\s*[:=]?\s*(\d{1,3})\b", re.IGNORECASE)

# Lines as they come from `kubectl logs --timestamps`, torchrun and PyTorch rank prefixes.
LINE_PREFIX = re.compile(r"^(?:\d{4}-\d\d-\d\dT[\d:.,]+(?:Z|[+-]\d\d:?\d\d)?\s+)?(?:\[(?:rank|default)\d+\]:\s?)?")


@dataclass(frozen=True)
class TextRule:
    pattern: re.Pattern[str]
    kind: VerdictKind
    reason: str
    beats_success: bool = True


def rule(pattern: str, kind: VerdictKind, reason: str, *, beats_success: bool = True) -> TextRule:
    return TextRule(re.compile(pattern, re.IGNORECASE), kind, reason, beats_success)


HW, INT = VerdictKind.HARDWARE, VerdictKind.INTERNAL

#: Line rules applied to the container log, the node's kernel log and event messages.
TEXT_RULES: tuple[TextRule, ...] = (
    rule(r"fallen off the bus", HW, "GPU has fallen off the bus"),
    rule(r"\bGPU is lost\b|NVML_ERROR_GPU_IS_LOST", HW, "GPU is lost"),
    rule(r"uncorrectable ECC error encountered|\buncorrectable\b.*\bECC\b|\bECC\b.*\buncorrectable\b"
          r"|double bit error|\bDBE\b|uncontained ECC", HW, "uncorrectable ECC error"),
    rule(r"\[Hardware Error\].*(uncorrected|fatal)|EDAC .*\bUE\b", HW, "uncorrected machine check / memory error"),
    rule(r"Memory failure: 0x[0-9a-f]+", HW, "host memory failure (hwpoison)"),
    rule(r"RmInitAdapter failed", HW, "GPU failed to initialize"),
    rule(r"Driver/library version mismatch", HW, "NVIDIA driver/library mismatch on the node"),
    rule(r"I/O error, dev \w+|Remounting filesystem read-only", HW, "node disk I/O error", beats_success=False),
    rule(r"NCCL WARN NET/(IB|Socket|OFI|Plugin)\b(?!.*No device found)", HW, "NCCL network error",
          beats_success=False),
    rule(r"remote process exited or there was a network error|\bncclRemoteError\b", HW,
          "NCCL remote error (a peer or the network failed)", beats_success=False),
    rule(r"IBV_WC_RETRY_EXC_ERR|transport retry counter exceeded|ibv_poll_cq error", HW,
          "InfiniBand transport error", beats_success=False),
    rule(r"gloo.*(Connection (reset|closed) by peer|Connection refused|Read error|Timed out)"
          r"|Gloo connectFullMesh failed", HW, "gloo network error (a peer or the network failed)",
          beats_success=False),
    rule(r"Watchdog caught collective operation timeout|collective operation timeout", HW,
          "a collective operation hung (NCCL watchdog timeout)", beats_success=False),
    rule(r"CUDA out of memory|OutOfMemoryError", INT, "out of GPU memory"),
    rule(r"Out of memory: Killed process|Memory cgroup out of memory|oom-kill:", INT,
          "out of host memory (kernel OOM killer)"),
    rule(r"insufficient shared memory|Unexpected bus error encountered in worker", INT,
          "shared memory (/dev/shm) too small for the data loader"),
    rule(r"error: (unrecognized arguments|the following arguments are required|argument \S+: invalid)", INT,
          "bad command-line arguments"),
    rule(r"can't open file .*No such file or directory|command not found|executable file not found"
          r"|exec format error", INT, "the command cannot be run"),
    rule(r"\bncclInvalidUsage\b|\bncclInvalidArgument\b", INT, "invalid use of NCCL"),
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
PREEMPTED_TERMINATION_REASONS = frozenset({"Preempted", "Preempting", "Shutdown", "Terminated", "NodeShutdown"})
SHUTDOWN_MESSAGE = re.compile(r"node shutdown|shutting down|imminent node shutdown", re.IGNORECASE)
SPOT_WORDS = re.compile(r"\bspot\b|spot.?interrupt|preempt", re.IGNORECASE)
PREEMPTING_DISRUPTIONS = frozenset({"PreemptionByScheduler", "PreemptionByKubeScheduler"})
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
NODE_DOWN_TAINTS = frozenset({
    "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready", "node.kubernetes.io/out-of-service",
})

EXTERNAL_KILL_SIGNALS = frozenset({signal_module.SIGKILL, signal_module.SIGTERM, signal_module.SIGHUP})

#: Kernel-log lines timestamped this long before the attempt started are stale.
NODE_LOG_SLACK_BEFORE = timedelta(seconds=60)
#: ...and this long after it ended are about something else.
NODE_LOG_SLACK_AFTER = timedelta(minutes=5)
ISO_STAMP = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:[.,]\d+)?(Z|[+-]\d\d:?\d\d)")


