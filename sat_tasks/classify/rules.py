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
    61: "internal micro-controller breakpoint/warning",
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
#: Xids whose cause NVIDIA's catalog leaves open (hardware, driver or the application): the
#: verdict says so and errs toward HARDWARE, the cheaper mistake (ADR 0004).
AMBIGUOUS_XIDS: dict[int, str] = {
    68: "video decoder (NVDEC) exception: hardware, driver or application",
}
XID_RECOVERY_ACTION = 154  # GPU recovery action changed; a fault unless the action is "None"

XID_LINE = re.compile(r"\bxid\b(?:\s+error)?\s*(?:\(([^)]*)\))?\s*[:=]?\s*(\d{1,3})\b", re.IGNORECASE)

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

    `peer_symptom`: what a healthy rank logs when another rank (or the link) failed; any
    evidence of the job's own error outranks it (a rank's exception, not its peers' timeouts).
    """

    pattern: re.Pattern[str]
    kind: VerdictKind
    reason: str
    beats_success: bool = True
    peer_symptom: bool = False


def rule(pattern: str, kind: VerdictKind, reason: str, *, beats_success: bool = True,
         peer_symptom: bool = False) -> TextRule:
    return TextRule(re.compile(pattern, re.IGNORECASE), kind, reason, beats_success, peer_symptom)


HW, INT = VerdictKind.HARDWARE, VerdictKind.INTERNAL

# The NVIDIA container runtime's hook failing on the node (driver not loaded, NVML, device
# node missing): the container never starts, Kubernetes says StartError/ContainerCannotRun.
NVIDIA_RUNTIME_PATTERN = (
    r"nvidia-container-cli(?:\.real)?: \w+ error|nvidia-container-runtime(?:-hook)?\b.*(?:error|failed)"
    r"|error running (?:prestart )?hook.*nvidia|prestart hook #?\d+.*nvidia"
)
NVIDIA_RUNTIME = re.compile(NVIDIA_RUNTIME_PATTERN, re.IGNORECASE)

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
          "NCCL remote error (a peer or the network failed)", beats_success=False, peer_symptom=True),
    rule(r"IBV_WC_RETRY_EXC_ERR|transport retry counter exceeded|ibv_poll_cq error", HW,
          "InfiniBand transport error", beats_success=False),
    rule(r"gloo.*(Connection (reset|closed) by peer|Connection refused|Read error|Timed out)"
          r"|Gloo connectFullMesh failed", HW, "gloo network error (a peer or the network failed)",
          beats_success=False, peer_symptom=True),
    rule(r"Watchdog caught collective operation timeout|collective operation timeout", HW,
          "a collective operation hung (NCCL watchdog timeout)", beats_success=False, peer_symptom=True),
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
    # The GPU is on the node and given to the pod, but cannot be used: the node's fault.
    rule(NVIDIA_RUNTIME_PATTERN, HW, "the NVIDIA container runtime failed on the node"),
    rule(r"CUDA-capable devices?(?:\(s\))? (?:is/)?(?:are|is) busy or unavailable|cudaErrorDevicesUnavailable", HW,
          "the pod's GPU is busy or unavailable (held by another process or in a bad state)"),
    rule(r"Failed to initialize NVML|NVML_ERROR_(?:DRIVER_NOT_LOADED|LIB_RM_VERSION_MISMATCH|UNKNOWN)"
          r"|nvmlInit\w* failed", HW, "NVML cannot be initialized (the node's GPU driver)"),
    rule(r"\b(?:IBV_EVENT_PORT_ERR|port state (?:changed to )?(?:DOWN|INIT)|Link (?:DOWN|down)\b.*mlx5|mlx5_\S+: .*Link DOWN"
          r"|NET/IB : Got async event : port error)", HW, "InfiniBand/RoCE link down", beats_success=False),
    rule(r"device-side assert(?:ion)? triggered|Assertion `[^`]*` failed", INT,
          "a CUDA device-side assertion failed in the script's kernels (e.g. an index out of range)"),
)

#: NCCL's "unhandled cuda error" with no other sign: a CUDA call inside NCCL failed, which is
#: a driver or GPU fault as often as a CUDA/NCCL mismatch in the image. Ambiguous (ADR 0004).
AMBIGUOUS_RULES: tuple[TextRule, ...] = (
    rule(r"unhandled cuda error|ncclUnhandledCudaError", HW,
          "ambiguous: NCCL's CUDA call failed (\"unhandled cuda error\") with no other sign; a driver or GPU "
          "fault as often as a CUDA/NCCL mismatch in the image. Chose HARDWARE: a wrong failover costs at most "
          "three retries from the last checkpoint, a wrong stop costs the job (ADR 0004)"),
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

EXTERNAL_KILL_SIGNALS = frozenset({signal_module.SIGKILL, signal_module.SIGTERM, signal_module.SIGHUP})

#: Kernel-log lines timestamped this long before the attempt started are stale.
NODE_LOG_SLACK_BEFORE = timedelta(seconds=60)
#: ...and this long after it ended are about something else.
NODE_LOG_SLACK_AFTER = timedelta(minutes=5)
ISO_STAMP = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:[.,]\d+)?(Z|[+-]\d\d:?\d\d)")


