"""The Pod Security Standards' "baseline" and "restricted" profiles, checked on a Pod manifest.

Written from the standard (https://kubernetes.io/docs/concepts/security/pod-security-standards/),
control by control, for the fields SAT's pods could carry; `violations(pod, "restricted")` lists
each broken control as `<control>: <where>`, as the Pod Security admission controller would refuse
the pod in a namespace labelled `pod-security.kubernetes.io/enforce: <profile>`.
"""

from __future__ import annotations

from typing import Any

# Baseline: capabilities a container may add beyond the runtime's default set.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
# Baseline: the SELinux types allowed (or none).
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# Baseline: the "safe" sysctls.
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
# Restricted: the volume types allowed.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
VOLUME_SOURCE_KEYS = {"name"}


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{kind}[{c.get('name')}]", c) for kind in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(kind) or []]


def _baseline(pod: dict[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    pod_ctx = spec.get("securityContext") or {}
    found = []
    # HostProcess
    if (pod_ctx.get("windowsOptions") or {}).get("hostProcess"):
        found.append("HostProcess: spec.securityContext.windowsOptions.hostProcess")
    # Host Namespaces
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"Host Namespaces: spec.{key}")
    # HostPath Volumes
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            found.append(f"HostPath Volumes: volume {volume.get('name')}")
    # AppArmor, SELinux, Seccomp, Sysctls at the pod level
    if (pod_ctx.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        found.append("AppArmor: spec.securityContext.appArmorProfile")
    for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                value == "runtime/default" or value.startswith("localhost/")):
            found.append(f"AppArmor: annotation {key}")
    selinux = pod_ctx.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append("SELinux: spec.securityContext.seLinuxOptions")
    if (pod_ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append("Seccomp: spec.securityContext.seccompProfile Unconfined")
    for sysctl in pod_ctx.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"Sysctls: {sysctl.get('name')}")
    for where, container in _containers(spec):
        ctx = container.get("securityContext") or {}
        if (ctx.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"HostProcess: {where}")
        if ctx.get("privileged"):
            found.append(f"Privileged Containers: {where}")
        added = set((ctx.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            found.append(f"Capabilities: {where} adds {sorted(added - BASELINE_CAPABILITIES)}")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                found.append(f"Host Ports: {where} hostPort {port['hostPort']}")
        if (ctx.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"AppArmor: {where}")
        selinux = ctx.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"SELinux: {where}")
        if ctx.get("procMount") not in (None, "Default"):
            found.append(f"/proc Mount Type: {where}")
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"Seccomp: {where} Unconfined")
    return found


def _restricted(pod: dict[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    pod_ctx = spec.get("securityContext") or {}
    found = []
    # Volume Types
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - VOLUME_SOURCE_KEYS
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"Volume Types: volume {volume.get('name')} is {sorted(kinds - RESTRICTED_VOLUMES)}")
    # Running as Non-root user
    if pod_ctx.get("runAsUser") == 0:
        found.append("Running as Non-root user: spec.securityContext.runAsUser 0")
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    for where, container in _containers(spec):
        ctx = container.get("securityContext") or {}
        # Privilege Escalation: must be set to false
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"Privilege Escalation: {where} allowPrivilegeEscalation is not false")
        # Running as Non-root: the pod says true and the container not false, or the container says true
        if ctx.get("runAsNonRoot") is False or (ctx.get("runAsNonRoot") is not True
                                                and pod_ctx.get("runAsNonRoot") is not True):
            found.append(f"Running as Non-root: {where} runAsNonRoot is not true")
        if ctx.get("runAsUser") == 0:
            found.append(f"Running as Non-root user: {where} runAsUser 0")
        # Seccomp: RuntimeDefault or Localhost, on the pod or on every container
        seccomp = (ctx.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"Seccomp: {where} has no RuntimeDefault or Localhost profile")
        # Capabilities: drop ALL, add at most NET_BIND_SERVICE
        capabilities = ctx.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"Capabilities: {where} does not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"Capabilities: {where} adds more than NET_BIND_SERVICE")
    return found


def violations(pod: dict[str, Any], profile: str = "restricted") -> list[str]:
    """The controls of `profile` ("baseline" or "restricted", which includes baseline) that `pod` breaks."""
    if profile not in ("baseline", "restricted"):
        raise ValueError(f"profile: baseline or restricted, not {profile!r}")
    return _baseline(pod) + (_restricted(pod) if profile == "restricted" else [])
