"""The vendor catalogues (issue 43 item 4): each names its source and version, each code is classified once,
and the rules built from them decide lines of each family (and leave their near-misses alone)."""

from __future__ import annotations

import re

import pytest

from sat_tasks.classify import CUDA_ERRORS, VerdictKind, classify
from sat_tasks.classify.catalogues import (
    CATALOGUES,
    CUDA_RUNTIME,
    NVIDIA_XID,
    XID_IMMEDIATE_ACTION,
    XID_NVLINK5_UNIT_EVENT,
    XID_SOURCES,
    Fault,
)
from sat_tasks.classify.rules import (
    APPLICATION_XIDS,
    CATALOGUE_RULES,
    HARDWARE_XIDS,
    NOT_A_NODE_FAULT_XIDS,
    XID_LINE,
)
from sat_tasks.core.attempt import AttemptRecord

HW, INT = VerdictKind.HARDWARE, VerdictKind.INTERNAL
REQUIRED = {"nvidia-xid", "cuda-runtime", "nccl-result", "nvml-return", "dcgm-health", "amd-gpu", "rdma-driver",
            "pcie-aer", "mce-edac", "other-accelerator"}


def record(lines: list[str], exit_code: int = 1, where: str = "node_log") -> AttemptRecord:
    return AttemptRecord(job="j", attempt=1, backend="kubernetes", node="n", exit_code=exit_code, **{where: lines})


def test_every_catalogue_names_its_source_document_and_version():
    assert {c.key for c in CATALOGUES} == REQUIRED
    for catalogue in CATALOGUES:
        assert len(catalogue.source) > 30 and catalogue.title, catalogue.key
        assert re.search(r"\d", catalogue.version), f"{catalogue.key}: a version names a number"
        assert re.search(r"https://\S+", catalogue.source), f"{catalogue.key}: the source says where it is published"
        assert catalogue.codes, catalogue.key


@pytest.mark.parametrize("catalogue", CATALOGUES, ids=lambda c: c.key)
def test_each_code_is_classified_once_with_a_reason(catalogue):
    codes = [code.code for code in catalogue.codes]
    assert len(codes) == len(set(codes)), [c for c in codes if codes.count(c) > 1]
    for code in catalogue.codes:
        assert isinstance(code.fault, Fault) and code.reason and code.name, code
        if code.pattern:
            re.compile(code.pattern)


def test_the_xid_catalogue_covers_every_code_of_nvidias_catalog_and_the_newest():
    codes = set(NVIDIA_XID.by_code())
    assert set(range(1, 173)) <= codes  # the catalog's sheet lists 1-172
    assert 185 in codes
    assert not (set(HARDWARE_XIDS) & set(APPLICATION_XIDS)) and not (set(HARDWARE_XIDS) & set(NOT_A_NODE_FAULT_XIDS))


#: NVIDIA's immediate actions that recover the node itself (XID_SOURCES[0], the "Fault Resolution Buckets" sheet).
NODE_ACTIONS = {"RESET_GPU", "RESTART_BM", "CHECK_MECHANICALS", "RESTART_VM", "UPDATE_SWFW", "WORKFLOW_XID_48",
                "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "XID_154"}


def test_each_xid_family_follows_the_catalogs_immediate_action():
    """A code whose immediate action recovers the node is the node's; one the catalog ignores never is; one after
    which only the application restarts is the job's or ambiguous, never nothing."""
    table = NVIDIA_XID.by_code()
    assert set(XID_IMMEDIATE_ACTION) <= set(table)
    for code, action in XID_IMMEDIATE_ACTION.items():
        fault = table[code].fault
        if action in NODE_ACTIONS:
            assert fault is Fault.NODE, (code, action, fault)
        elif action == "IGNORE":
            assert fault is not Fault.NODE, (code, action, fault)
        elif action == "RESTART_APP":
            assert fault in (Fault.JOB, Fault.AMBIGUOUS), (code, action, fault)
    assert all(source.startswith("NVIDIA, ") and "docs.nvidia.com" in source for source in XID_SOURCES[:2])


@pytest.mark.parametrize(("xid", "fault"), [
    # rows the catalog decides differently from the older table (XID_SOURCES[0])
    (39, Fault.AMBIGUOUS), (40, Fault.AMBIGUOUS),  # copy engines CE0/CE1, like CE2-CE9: RESTART_APP/CONTACT_SUPPORT
    (44, Fault.AMBIGUOUS),  # IGNORE, then CONTACT_SUPPORT: no GPU reset
    (45, Fault.NONE),  # "Not Solo: IGNORE (follow other Xid)"
    (121, Fault.NONE),  # corrected C2C errors, "no operational impact"
    (137, Fault.JOB),  # NVLink privilege error: "typically application-level bugs"
    (24, Fault.AMBIGUOUS), (79, Fault.NODE),  # what tests/e2e/test_rehearsals.py relies on
])
def test_xid_rows_checked_against_the_catalog(xid, fault):
    assert NVIDIA_XID.by_code()[xid].fault is fault


def test_the_cuda_table_and_the_cuda_rules_agree():
    decided = {name: error for error in CUDA_ERRORS for name in error.names}
    for code in CUDA_RUNTIME.codes:
        error = decided.get(code.name)
        if error is None:
            continue
        fault = Fault.AMBIGUOUS if error.ambiguous else Fault.NODE if error.kind is HW else Fault.JOB
        assert code.fault is fault, code


def test_catalogue_rules_have_families():
    assert all(rule.family and ":" in rule.family for rule in CATALOGUE_RULES)


LINES = [
    # NVIDIA Xid: codes the older table lacked, and a code newer than the table read by its words
    ("NVRM: Xid (PCI:0000:3b:00): 46, pid=1, name=python, GPU stopped processing", HW, False),
    ("NVRM: Xid (PCI:0000:3b:00): 8, pid=1, name=python, Channel 00000010 idle timeout", HW, True),
    ("NVRM: Xid (PCI:0000:3b:00): 199, pid='<unknown>', name=<unknown>, Uncorrectable DRAM error on HBM 3", HW, False),
    ("NVRM: Xid (PCI:0000:3b:00): 185, pid='<unknown>', HBM sparing event recorded", INT, False),
    ("NVRM: Xid (PCI:0000:3b:00): 198, pid='<unknown>', corrected error logged", INT, False),
    # codes of the catalog the older table lacked (XID_SOURCES[0])
    ("NVRM: Xid (PCI:0000:3b:00): 171, pid='<unknown>', name=<unknown>, Uncorrectable DRAM error on HBM 3", HW, False),
    ("NVRM: Xid (PCI:0000:3b:00): 158, pid='<unknown>', name=<unknown>, GPU Fatal Timeout", HW, False),
    ("NVRM: Xid (PCI:0000:3b:00): 126, pid=1, name=python, CE10: Unknown Error", HW, True),
    ("NVRM: Xid (PCI:0000:3b:00): 137, pid=1, name=python, NVLink privilege error", INT, False),
    # CUDA runtime codes beyond the text table
    ("RuntimeError: cudaErrorMpsServerNotReady", HW, False),
    ("ImportError: cudaErrorStubLibrary raised while loading", INT, False),
    # NCCL
    ("ncclInternalError: internal error - please report this issue to the NCCL developers", HW, True),
    # NVML
    ("pynvml.NVMLError_CorruptedInforom: Corrupted infoROM", HW, False),
    ("NVML_ERROR_RESET_REQUIRED returned by nvmlDeviceGetHandleByIndex", HW, False),
    # DCGM
    ("DCGM_HEALTH_WATCH_MEM result DCGM_HEALTH_RESULT_FAIL: volatile double-bit ECC error", HW, False),
    # AMD
    ("amdgpu 0000:c1:00.0: amdgpu: 2 uncorrectable hardware errors detected in umc block", HW, False),
    ("[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=3", HW, True),
    ("amdgpu 0000:03:00.0: amdgpu: [gfxhub0] no-retry page fault (src_id:0 ring:24 vmid:3 pasid:32771)", INT, False),
    ("RuntimeError: HIP error: an illegal memory access was encountered", HW, True),
    ("RuntimeError: hipErrorNoDevice", HW, False),
    (("Memory access fault by GPU node-2 (Agent handle: 0x55d8c2f0) on address 0x7f1c00000000. Reason: Page not "
     "present or supervisor privilege."), HW, True),
    # other accelerators
    ("habanalabs hl0: Critical error: device is in an unusable state, reset required", HW, False),
    ("neuron: nd0 nc1: uncorrectable memory error detected in HBM", HW, False),
    ("i915 0000:00:02.0: [drm] GPU HANG: ecode 12:1:85dffffb, in python [4242]", HW, True),
    ("TPU chip 3 became unhealthy: hardware failure detected by the runtime", HW, False),
    # InfiniBand / RoCE / EFA
    ("mlx4_en: eth2: Link Down", HW, False),
    ("ice 0000:3b:00.0 ens1f0: NIC Link is Down", HW, False),
    ("efa 0000:00:1d.0: Failed to create admin queue", HW, False),
    ("NCCL WARN NET/OFI Unable to find a libfabric provider", HW, False),
    ("mlx5_core 0000:81:00.0: probe_one:1234:(pid 1): mlx5_init_one failed with error code -110", HW, False),
    # PCIe AER and MCE/EDAC
    ("pcieport 0000:00:01.0:   [14] CmpltTO                (First)", HW, False),
    ("EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0", HW, False),
    ("{1}[Hardware Error]: event severity: fatal", HW, False),
]
NEAR_MISSES = [
    "NCCL INFO NET/IB : No device found.",  # an INFO line on every host without InfiniBand
    "mlx5_core 0000:81:00.0 ib0: Link up",
    "DCGM_HEALTH_WATCH_MEM result DCGM_HEALTH_RESULT_WARN: single-bit ECC errors",
    "amdgpu 0000:c1:00.0: amdgpu: 1 correctable hardware errors detected in total in gfx block",
    "pcieport 0000:00:1c.0: AER: Corrected error received: 0000:00:1c.0",
    "pcieport 0000:00:1c.0:    [ 0] RxErr",
    "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0",
    "mce: [Hardware Error]: Machine check events logged",
    # NCCL could not open a spare HCA and went on with the others (zai-org/ImageReward#65): yields to the job's own
    # error and to a clean exit
    "NCCL WARN NET/IB : Unable to open device mlx5_59",
    "{1}[Hardware Error]: event severity: corrected",
    "habanalabs hl0: 1 correctable SERR events in HBM",
    "NVRM: Xid (PCI:0000:3b:00): 63, pid=1, Row Remapper: New row marked for remapping, reset gpu to activate.",
    "NVRM: Xid (PCI:0000:3b:00): 93, pid=1, InfoROM wear limit",
    # the catalog ignores these: corrected C2C errors, a failed retirement that leaves the GPU usable
    "NVRM: Xid (PCI:0000:3b:00): 121, pid='<unknown>', name=<unknown>, C2C error corrected",
    "NVRM: Xid (PCI:0000:3b:00): 157, pid='<unknown>', name=<unknown>, Resource Retirement Failure",
    "NVRM: Xid (PCI:0000:3b:00): 161, pid='<unknown>', name=<unknown>, Channel Retirement Failure",
    # lines that look like a fault and are not (issue 43 item 6): the driver's banner (NVIDIA/open-gpu-kernel-modules
    # #489, pytorch/pytorch#3989), a harmless peermem diagnostic (Mellanox/nv_peer_memory#120), NCCL's INFO lines
    # naming the HCA and the missing net plugin (NVIDIA/nccl-tests#182), and an Xid named in words, not by the
    # driver: a reproduction step (NVIDIA/DCGM#235), a metric label, a comment, a path
    ("[    2.757687] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  530.41.03  Release Build  "
     "(archlinux-builder@archalien)  "),
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  384.98  Thu Oct 26 15:16:01 PDT 2017",
    ("[25033.266922] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further "
     "processing"),
    "testgpu2:3255:3262 [1] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB ibs65:10.10.10.101<0>",
    ("testgpu2:3255:3255 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such "
     "file or directory No plugin found (libnccl-net.so), using internal implementation"),
    "Cause or wait for an XID 62 error on a GPU.",
    ('DCGM_FI_DEV_XID_ERRORS{err_code="45", err_msg="Preemptive cleanup, due to previous errors -- Most likely to '
     'see when running multiple cuda", job="dcgm-exporter"}'),
    "make crash-memfault   # Triggers Xid 13/43 then Xid 79 if the GPU does not recover",
    "INFO: health check: no Xid 48, 79 or 95 in dmesg since boot",
    "Loading checkpoint from /mnt/runs/xid 48/step_1000.pt",
]


@pytest.mark.parametrize(("line", "xid"), [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.", 79),
    ("[ 1.2] NVRM: Xid (0000:03:00): 14, Channel 00000001", 14),  # the catalog's own example
    ("gpu-7 kernel: NVRM: Xid 79, GPU has fallen off the bus", 79),
    ("Xid (PCI:0000:3b:00): 48, pid=1, name=python, DBE (double bit error) ECC error", 48),
    ("XidCriticalError: Xid=48 on Device=GPU-5d0d4a3c, the device will go unhealthy.", 48),  # k8s-device-plugin
    ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149", 45),
    ("Cause or wait for an XID 62 error on a GPU.", None),
    ("make crash-memfault   # Triggers Xid 13/43", None),
    ("Loading checkpoint from /mnt/runs/xid 48/step_1000.pt", None),
    ("LOG:  automatic vacuum to prevent wraparound: oldest xid 119 in table", None),
])
def test_an_xid_is_the_emitters_line_not_the_word(line, xid):
    match = XID_LINE.search(line)
    assert (int(match.group(2)) if match else None) == xid, line


@pytest.mark.parametrize(("line", "kind", "ambiguous"), [pytest.param(*case, id=case[0][:48]) for case in LINES])
def test_catalogue_lines(line, kind, ambiguous):
    verdict = classify(record([line]))
    assert verdict.kind is kind, verdict
    assert verdict.reason.startswith("ambiguous:") is ambiguous, verdict.reason


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_catalogue_near_misses_stay_out_of_the_way(line):
    own = ["Traceback (most recent call last):", "ValueError: bad config"]
    assert classify(record([*own, line], where="log_tail")).kind is INT  # the job's own error decides
    assert classify(record([line], exit_code=0)).kind is VerdictKind.SUCCEEDED


# ---- the severity word on the line (issue 43 leftovers): the catalog's "XID 144-150 Decode" sheet ----------------
# Lines as the driver prints them (leptonai/gpud#1160 and #1174 quote them from kmsg): the unit, the severity, the link.
NVLINK5_FATAL = [
    "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 "
    "0x00000000 0x00000000 0x00000000)",
    "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000)",
    "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)",
    "NVRM: Xid (PCI:0000:04:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)",
    "NVRM: Xid (PCI:0000:04:00): 146, TLW_CTRL Link Fatal XC0 i0 Link 03 (0x00000009 0x00000004 0x00000000)",
]
NVLINK5_NONFATAL = [
    "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 "
    "0x00000000 0x00000000)",
    "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 "
    "0x00000000 0x00100000 0x00000004)",
    "NVRM: Xid (PCI:0000:04:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 00 (0x00000013 0x00000001 0x00000000)",
    "NVRM: Xid (PCI:0000:04:00): 148, NVLPW_CTRL/NVLPW Non-fatal XC0 i0 Link 00 (0x0000000f 0x80000000 0x00000000)",
]


@pytest.mark.parametrize("line", NVLINK5_FATAL)
def test_an_nvlink5_xid_the_line_calls_fatal_is_the_nodes(line):
    for exit_code in (1, 0):  # a fatal NVLink error outranks a clean exit: the catalog resets the GPU
        verdict = classify(record([line], exit_code=exit_code))
        assert verdict.kind is HW and not verdict.reason.startswith("ambiguous:"), verdict
        assert "Fatal" in verdict.reason and "RESET_GPU" in verdict.reason, verdict.reason


@pytest.mark.parametrize("line", NVLINK5_NONFATAL)
def test_an_nvlink5_xid_the_line_calls_nonfatal_never_outranks_the_job_or_a_clean_exit(line):
    """The catalog's Nonfatal rows are IGNORE or XID_154_EVAL (whose local effect is often the application's crash on
    that GPU): the job's own error decides, a clean exit stays clean, a failure with nothing else relocates, and the
    Xid 154 the driver prints when a reset is in fact needed decides on its own line."""
    own = ["Traceback (most recent call last):", "ValueError: bad config"]
    assert classify(record([*own, line], where="log_tail")).kind is INT
    assert classify(record([line], exit_code=0)).kind is VerdictKind.SUCCEEDED
    alone = classify(record([line], exit_code=1))
    assert alone.kind is HW and alone.reason.startswith("ambiguous:") and "Nonfatal" in alone.reason.replace(
        "Non-fatal", "Nonfatal"), alone
    reset = "NVRM: Xid (PCI:0000:04:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    both = classify(record([line, reset], exit_code=1))
    assert both.kind is HW and not both.reason.startswith("ambiguous:"), both


def test_an_nvlink5_xid_without_a_severity_word_stays_the_nodes():
    line = "NVRM: Xid (PCI:0000:3b:00): 147, pid=1, name=python, NVLINK: TREX Error"
    assert classify(record([line])).kind is HW


@pytest.mark.parametrize(("line", "kind"), [
    # a code newer than the table, read by its words: "Non-fatal" is not "fatal" (nor is "Nonfatal")
    ("NVRM: Xid (PCI:0000:3b:00): 199, pid=1, name=python, Non-fatal error on unit FOO", INT),
    ("NVRM: Xid (PCI:0000:3b:00): 199, pid=1, name=python, FOO Nonfatal XC0 i0 Link 00", INT),
    ("NVRM: Xid (PCI:0000:3b:00): 199, pid=1, name=python, FOO Fatal XC0 i0 Link 00", HW),
    ("NVRM: Xid (PCI:0000:3b:00): 199, pid=1, name=python, FOO Link Fatal XC0 i0 Link 00", HW),
])
def test_a_newer_xid_reads_the_severity_word_not_the_substring(line, kind):
    assert classify(record([line])).kind is kind


def test_xid_61_follows_the_catalogs_and_the_older_listings_word():
    """The catalog for Ampere and newer lists Xid 61 (PMU_BREAKPOINT) as unused (CONTACT_SUPPORT, no resolution);
    the older listing (r555) says to reset the GPU reporting it and names no application cause: the node's."""
    assert 61 not in XID_IMMEDIATE_ACTION  # unused in the catalog: no immediate action to follow
    code = NVIDIA_XID.by_code()[61]
    assert code.fault is Fault.NODE and "unused" in code.reason and "Reset GPU" in code.reason


@pytest.mark.parametrize(("words", "unit_event"), [
    ("RLW_RXPIPE interrupt hit on link 11 on GPU0: PRIV Error", True),  # NVIDIA/nccl#2241
    ("RLW_REMAP Nonfatal XC0 i0 Link 08 (0x00000000 0x00000000)", True),
    ("NETIR_LINK_EVT Fatal XC0 i0 Link -1 (0x000fe406)", True),
    ("NVLPW_CTRL Nonfatal XC0 i0 Link 3 (0x0)", True),
    # near-misses: a process's own access, units in prose, a unit word inside another name, no link named
    ("pid=20311, name=python3, NVLink: illegal peer access to link memory (PRIV Error)", False),
    ("pid=7, name=rlw_train, PRIV Error on link 4", False),
    ("pid=7, name=TREXLER, PRIV Error on link 4", False),
    ("pid=7, name=my-RLW, PRIV Error on link 4", False),
    ("RLW_RXPIPE PRIV Error", False),
])
def test_an_nvlink5_units_interrupt_on_a_link_is_told_from_a_processs_access(words: str, unit_event: bool):
    assert bool(XID_NVLINK5_UNIT_EVENT.search(words)) is unit_event
