"""What a training pod runs: the PID 1 supervisor script, the launch command, and the probes that watch it."""

from __future__ import annotations

import math
import re
from typing import Any

from ckpt_engine.contract import CONCURRENT_DIR, PROGRESS_NAME
from sat_tasks.backends.kubernetes.names import ANNOTATION_PLANNED_RESTART
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.core.joblog import START_MARKER
from sat_tasks.core.runtime_env import POD_OUTPUT_DIR
from sat_tasks.spec import Framework, TrainingJob

# How often PID 1 of an attempt on fewer ranks reads its annotations (the kubelet refreshes the
# downward API file on its own sync, typically within a minute of the patch).
GROW_WATCH_SECONDS = 5
# Where the pod's annotations appear (a downwardAPI volume), for an attempt on fewer ranks.
POD_INFO_DIR = "/etc/sat-pod"
POD_ANNOTATIONS_ENV = "SAT_POD_ANNOTATIONS"

# `python [-u|-B|-O...] script.py ...` or `python ... -m module ...`: what a launcher can take over.
_PYTHON_CMD_RE = re.compile(
    r"^\s*python(?:3(?:\.\d+)?)?(?:\s+-[uBOEsI]+)*\s+(?P<rest>-m\s+\S.*|[^-\s].*)$", re.DOTALL
)


# The container's PID 1. It runs the command in its own process group and forwards SIGTERM
# to that whole group, so the training process (not only a shell) gets the Spot / drain
# notice and can write its final checkpoint within the grace period; bash as PID 1 would
# otherwise swallow SIGTERM. The subshell traps TERM (a handler, unlike an ignore, is not
# inherited by the command) so it outlives the signal and reports the command's own exit
# status. A command stopped by SIGTERM never reports success (143), even when it saved a
# final checkpoint and exited 0: the attempt did not finish. When PID 1 exits the kernel
# SIGKILLs every process left in the container, so after SIGTERM it also waits for the
# rest of the command's process group: the `deepspeed` launcher dies at once on SIGTERM
# while its ranks still write their final checkpoint (the kubelet's SIGKILL at the end of
# the grace period bounds the wait). A SIGTERM before the command starts (ranks > 0 wait for
# rank 0's DNS name first) ends the pod at once: PID 1 ignores a signal it has no handler
# for, and the pod would start training on a node being drained. $1 is the (wrapped) command.
# Beside the command runs the node's metrics sidecar (`python -m ckpt_engine.metrics`, from
# the vendored engine): the system and job series of every attempt, whatever the command is;
# it ends (a last sample, the upload) after the command. An image without Python has none.
# An attempt on fewer ranks than the job's nodes (an elastic failover, ADR 0029) also watches
# its own annotations (the downward API file `$SAT_POD_ANNOTATIONS`): once SAT's grow-back watch
# sets `sat.ai/planned-restart`, PID 1 gets SIGTERM as from the kubelet, the command takes its
# final checkpoint and the pod ends 143, kept for classify (no pod is deleted, no exec needed).
# (No `$$` in this script: the kubelet would turn it into `$`; `BASHPID` is PID 1's own.)
_SUPERVISOR = """\
set -m
trap 'echo "[sat] SIGTERM before the command started: exit 143"; exit 143' TERM INT
echo "[sat] attempt ${SAT_ATTEMPT} of job ${SAT_JOB_NAME} on node ${SAT_NODE} (pod ${HOSTNAME}): %(marker)s"
cd "${SAT_CODE_DIR}" || { echo "[sat] code directory ${SAT_CODE_DIR} is missing: was the script staged?" >&2; exit 1; }
sampler=
py=$(command -v python3 || command -v python)
if [ -n "${SAT_METRICS_DIR}" ] && [ -n "${py}" ] && "${py}" -m ckpt_engine.metrics --check 2>/dev/null; then
  "${py}" -m ckpt_engine.metrics & sampler=$!
  export SAT_METRICS_SIDECAR=1
fi
%(wait_for_rank0)s( trap : TERM INT; eval "$1" ) &
child=$!
set +m
stopped=
trap 'stopped=1; kill -TERM -- "-${child}" 2>/dev/null' TERM INT
watch=
if [ -n "${SAT_POD_ANNOTATIONS}" ]; then
  self="${BASHPID}"
  ( while sleep %(grow_poll)d; do
      if grep -q '^%(planned_restart)s=' "${SAT_POD_ANNOTATIONS}" 2>/dev/null; then
        echo "[sat] elastic: this pod's sat.ai/planned-restart annotation is set (capacity is back): SIGTERM to the command for its final checkpoint; the next attempt grows back"
        kill -TERM "${self}"; exit 0
      fi
    done ) & watch=$!
fi
wait "${child}"; rc=$?
while kill -0 "${child}" 2>/dev/null; do wait "${child}"; rc=$?; done
if [ -n "${stopped}" ] && kill -0 -- "-${child}" 2>/dev/null; then
  echo "[sat] the command exited on SIGTERM; waiting for the processes it started (final checkpoint)"
  while kill -0 -- "-${child}" 2>/dev/null; do sleep 0.2; done
  echo "[sat] the command's processes have exited"
fi
if [ -n "${stopped}" ] && [ "${rc}" = 0 ]; then
  echo "[sat] stopped by SIGTERM before the command finished: exit 143"; rc=143
fi
if [ -n "${watch}" ]; then kill "${watch}" 2>/dev/null; fi
if [ -n "${sampler}" ]; then kill -TERM "${sampler}" 2>/dev/null; wait "${sampler}"; fi
exit "${rc}"
"""

# Ranks > 0 wait (bounded) until rank 0's DNS record exists; the launcher then retries the
# TCP connection itself.
_WAIT_FOR_RANK0 = """\
if [ "${NODE_RANK}" != 0 ] && command -v getent >/dev/null 2>&1; then
  for _ in $(seq 1 %(tries)d); do getent hosts "${MASTER_ADDR}" >/dev/null 2>&1 && break; sleep 5; done
fi
"""



def nproc_per_node(job: TrainingJob) -> int:
    return max(job.resources.gpus_per_node, 1)



# `python -m <one of these>` is a launcher already: it runs as written, never inside another.
_LAUNCHER_MODULES = re.compile(
    r"^-m\s+(torch\.distributed\.(run|launch)|deepspeed(\.launcher\.\w+)?|accelerate\.commands\.\w+"
    r"|ckpt_engine\.launch)(\s|$)"
)

# The worker entry point that gives a DeepSpeed script the `--local_rank=<n>` argument the
# `deepspeed` launcher would (ckpt_engine/launch.py, in the vendor directory of every pod).
DEEPSPEED_ENTRY = "-m ckpt_engine.launch"



def launch_command(job: TrainingJob) -> str:
    """The shell command a pod runs: the job's command, wrapped in torchrun when distributed.

    One node: the command as written. Two or more: a command that starts with `python`
    (`python script.py ...` or `python -m module ...`; interpreter flags such as `-u` are
    dropped, the pod sets PYTHONUNBUFFERED) becomes `torchrun` with rendezvous on rank 0
    from the pod's env. For DeepSpeed the workers start through `ckpt_engine.launch`,
    which passes `--local_rank=<n>` first as the `deepspeed` launcher does: torchrun waits
    out the final checkpoint after SIGTERM (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`), the
    `deepspeed` launcher SIGKILLs after 30 s (ADR 0007). Any other command (an explicit
    `torchrun`, `deepspeed`, `accelerate launch`, their `python -m` forms, a script) runs
    as written and reads the
    same env (`MASTER_ADDR`, `MASTER_PORT`, `NODE_RANK`, `NNODES`, `NPROC_PER_NODE`, `PET_*`).
    """
    command = job.command.strip()
    match = _PYTHON_CMD_RE.match(command)
    if not job.distributed or not match or _LAUNCHER_MODULES.match(match.group("rest")):
        return command
    rest = match.group("rest")
    if job.framework is Framework.DEEPSPEED:
        rest = f"{DEEPSPEED_ENTRY} {rest}"
    return (
        'torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
        f'--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" {rest}'
    )



def supervisor_script(job: TrainingJob, settings: KubernetesSettings) -> str:
    wait = ""
    if job.distributed:
        wait = _WAIT_FOR_RANK0 % {"tries": max(settings.rendezvous_dns_wait_seconds // 5, 1)}
    return _SUPERVISOR % {"marker": START_MARKER, "wait_for_rank0": wait, "grow_poll": GROW_WATCH_SECONDS,
                          "planned_restart": ANNOTATION_PLANNED_RESTART.replace(".", "\\.")}



# ---- probes: start-up, then liveness (ADR 0010) -----------------------------------------------
PROGRESS_FILE = f"{POD_OUTPUT_DIR}/{CONCURRENT_DIR}/{PROGRESS_NAME}"
PROBE_PERIOD_SECONDS = 10
# The engine stamps progress.json with its attempt (SAT_ATTEMPT) and the step once training
# runs; written by json.dumps, so with the whitespace removed the keys read `"step":<n>`.
_STARTED_CHECK = (
    'p="%(file)s"; c=$(tr -d " \\n" < "$p" 2>/dev/null) || exit 1; '
    'case "$c" in *"\\"attempt\\":${SAT_ATTEMPT},"*|*"\\"attempt\\":${SAT_ATTEMPT}}"*) ;; *) exit 1;; esac; '
    'case "$c" in *"\\"step\\":"[0-9]*) exit 0;; *) exit 1;; esac'
)
_FRESH_CHECK = 'p="%(file)s"; [ $(( $(date +%%s) - $(stat -c %%Y "$p") )) -lt %(seconds)d ]'


def training_probes(job: TrainingJob) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The pod's startupProbe and livenessProbe, as Kubernetes tells start-up from a hang.

    startupProbe: passes once the engine has reported a training step of this attempt
    (progress.json on the run volume); it may fail for `startup_timeout_seconds`, then the
    kubelet stops the container ("Startup probe failed": a start-up failure, not a
    hardware fault). livenessProbe, which Kubernetes runs only after the startupProbe
    passed: progress.json changed within `heartbeat_timeout_seconds`; else the hung
    container is stopped ("Liveness probe failed": a hang, failed over). A job with
    `startup_timeout_seconds: 0` (its script reports no steps) gets neither.
    """
    if not job.startup_timeout_seconds:
        return None, None
    startup = {
        "exec": {"command": ["bash", "-c", _STARTED_CHECK % {"file": PROGRESS_FILE}]},
        "failureThreshold": max(1, math.ceil(job.startup_timeout_seconds / PROBE_PERIOD_SECONDS)),
        "periodSeconds": PROBE_PERIOD_SECONDS,
        "timeoutSeconds": 5,
    }
    liveness = {
        "exec": {"command": ["bash", "-c", _FRESH_CHECK % {
            "file": PROGRESS_FILE, "seconds": math.ceil(job.heartbeat_timeout_seconds)}]},
        "failureThreshold": 1,
        "periodSeconds": PROBE_PERIOD_SECONDS,
        # A hung process does not write a final checkpoint: it gets a short grace period.
        "terminationGracePeriodSeconds": 30,
        "timeoutSeconds": 5,
    }
    return startup, liveness
