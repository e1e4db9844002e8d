"""Vendor catalogues as data: each code classified once, with its reason, its source document and version.

A `Catalogue` is one vendor's list (NVIDIA Xid, CUDA runtime errors, NCCL results, NVML
returns, DCGM health systems, AMD amdgpu/RAS/HIP, other accelerators (Gaudi, Neuron, Intel
GPUs, TPU), the InfiniBand/RoCE/EFA drivers, PCIe AER, MCE/EDAC). Each `Code` says what it means for a training attempt (`Fault`):

- NODE: the node (a device, its driver, its link) is at fault: HARDWARE, fail over;
- JOB: the job's code, configuration or image: INTERNAL;
- AMBIGUOUS: the vendor leaves the cause open between the device and the code: an
  "ambiguous:" HARDWARE verdict that `core.node_health` makes SUSPECT_NODE (relocation);
- NONE: logged, but no evidence of a fault on its own (corrected, informational, unused).

`rules` builds its line rules from these tables (`catalogue_rules`); `evidence.find_xids`
reads the Xid table, and decides an Xid that is not in it by the words of its own line
(`XID_NODE_WORDS`), so a code newer than this table is still read by family. ADR 0004 lists
the tables and their sources; tests/sat_tasks/classify/test_catalogues.py checks each names
its source and version and classifies each code once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Fault(str, Enum):
    NODE = "node"
    JOB = "job"
    AMBIGUOUS = "ambiguous"
    NONE = "none"


@dataclass(frozen=True)
class Code:
    """One code of a catalogue. `pattern`: how it shows in a log line (regex, case-insensitive; empty: the
    code's name as a word). `beats_success`: the line can turn a clean exit into a failure. `weak`: it yields
    to any error of the job's own (a peer symptom)."""

    code: int | str
    name: str
    fault: Fault
    reason: str
    pattern: str = ""
    beats_success: bool = True
    weak: bool = False  # what a healthy rank may also log (a peer's or a spare device's): yields to the job's error


@dataclass(frozen=True)
class Catalogue:
    key: str
    title: str
    source: str  # the document (and where it is published)
    version: str  # the version of the document or the software it describes
    codes: tuple[Code, ...]

    def by_code(self) -> dict[int | str, Code]:
        return {code.code: code for code in self.codes}


N, J, A, X = Fault.NODE, Fault.JOB, Fault.AMBIGUOUS, Fault.NONE
#: The pattern of a code that a dedicated gatherer decides from the lines around it (never matches alone).
DEDICATED = "(?!)"


def _codes(*rows: tuple) -> tuple[Code, ...]:
    return tuple(Code(*row) for row in rows)


def _range(first: int, last: int, name: str, fault: Fault, reason: str) -> list[tuple]:
    return [(code, name, fault, reason) for code in range(first, last + 1)]


# ---- NVIDIA Xid ------------------------------------------------------------------------------
# Each row follows NVIDIA's Xid catalog for Ampere and newer (XID_SOURCES[0]): its description, and its resolution
# buckets: the immediate action (XID_IMMEDIATE_ACTION) and the investigatory one. A code the catalog lists as unused on
# A100/H100/B100/GB200 follows NVIDIA's older Xid listing (XID_SOURCES[1]), whose columns name the possible causes
# (HW error, driver error, user app error, system memory corruption, bus error, thermal, FB corruption). Families:
# - NODE: the immediate action recovers the node (RESET_GPU, RESTART_BM, CHECK_MECHANICALS, RESTART_VM, UPDATE_SWFW,
#   the ECC and NVLink workflows), or an unused code whose older listing names only the GPU, its driver or its bus;
# - JOB: RESTART_APP (or IGNORE) and the catalog names the application (CHECK_APP/CUDA, or its trigger text says
#   "typically application-level bugs"), and the older listing agrees that the user application is a cause;
# - AMBIGUOUS: RESTART_APP with CONTACT_SUPPORT (an engine exception the application or the device can cause), the
#   catalog points at the application but the older listing names only node causes, or the catalog gives no action;
# - NONE: unused, IGNORE with nothing to recover (corrected, recorded, informational), or an engine no compute job uses.
XID_SOURCES = (
    ("NVIDIA, Analyzing Xid Errors with the Xid Catalog, https://docs.nvidia.com/deploy/xid-errors/"
     "analyzing-xid-catalog.html (and its spreadsheet https://docs.nvidia.com/Xid-Catalog.xlsx): codes 1-172, "
     "columns Description, Applies to A100/H100/B100/GB200, Resolution Bucket (Immediate Action / Investigatory "
     "Action), Trigger Conditions; as mirrored by leptonai/gpud components/accelerator/nvidia/xid/"
     "catalog_generated.go (generated 2025-10-29)"),
    ("NVIDIA, Xid Errors, Xid Error Listing, https://docs.nvidia.com/deploy/xid-errors/index.html#xid-error-listing "
     "(r555): the possible causes of each code (HW error, driver error, user app error, system memory corruption, "
     "bus error, thermal issue, FB corruption); as copied by leptonai/gpud "
     "components/accelerator/nvidia/query/xid/xid.go (commit a4539822)"),
    "NVIDIA, open-gpu-kernel-modules src/common/sdk/nvidia/inc/nverror.h: the mnemonics of codes 13-125",
)
#: The catalog's "Resolution Bucket (Immediate Action)" of each code it lists as applying to a current GPU
#: (XID_SOURCES[0]); the codes it lists as unused (CONTACT_SUPPORT, "N/A; Unused") and those without an action
#: (162-172) are absent. tests/sat_tasks/classify/test_catalogues.py checks each row's family against it.
XID_IMMEDIATE_ACTION: dict[int, str] = {
    **dict.fromkeys((8, 11, 13, 25, 31, 32, 39, 40, 41, 60, 68, 69, 70, 71, 72, 75, 76, 77, 80, 82, 83, 84, 85, 86,
                     88, 89, 94, *range(96, 106), *range(126, 136), 139), "RESTART_APP"),
    **dict.fromkeys((14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 108, 121, 137, 141, 152, 153, 157, 160, 161),
                    "IGNORE"),
    **dict.fromkeys((46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158), "RESET_GPU"),
    45: "WORKFLOW_XID_45", 48: "WORKFLOW_XID_48", 54: "CHECK_MECHANICALS", 74: "WORKFLOW_NVLINK_ERR",
    78: "UPDATE_SWFW", 79: "RESTART_BM", 142: "CONTACT_SUPPORT", **dict.fromkeys(range(144, 151), "WORKFLOW_NVLINK5_ERR"),
    151: "RESTART_VM", 154: "XID_154", 159: "CHECK_UVM",
}
_UNUSED = "unused on Ampere and newer GPUs (the catalog lists it as unused), and no cause in the older listing"
_UNUSED_ENGINE = ("unused on Ampere and newer GPUs; a video/display engine's error on older ones: not an engine a "
                  "training job's failure comes from")
_DISPLAY = "a display engine event (unused on Ampere and newer): not evidence for a compute node"
_ENGINE = ("an exception of a video/JPEG/optical-flow engine on the job's channel: the catalog restarts the "
           "application, then contacts support (the older listing names the GPU and its driver): relocation decides")
_CE = ("a copy engine exception: a bad address or size from the application as often as the engine: the catalog "
       "restarts the application, then contacts support")
_NVLINK5 = ("an NVLink5 fault (Blackwell): the catalog's \"XID 144-150 Decode\" sheet gives each unit and status a "
            "severity, printed on the line: Fatal and Link Fatal → RESET_GPU (the node's), Nonfatal → IGNORE or "
            "XID_154_EVAL (nothing alone: an Xid 154 or 48 line that follows decides); a line without the word is "
            "read as the node's")
NVIDIA_XID = Catalogue(
    key="nvidia-xid",
    title="NVIDIA Xid",
    source="; ".join(XID_SOURCES) + "; and NVIDIA GPU Operational Events release notes (Xid 185, HBM sparing)",
    version="Xid catalog for Ampere/Hopper/Blackwell (A100, H100, B100, GB200), codes 1-172, driver branches "
            "R535-R580 (CUDA 12.7-12.9); older Xid listing r555",
    codes=_codes(
        (1, "Unused (ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD)", X, _UNUSED),
        (2, "Unused (ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD)", X, _UNUSED),
        (3, "Unused (ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD)", X, _UNUSED),
        (4, "Unused (ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY)", X, _UNUSED),
        (5, "Unused (ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW)", X, _UNUSED),
        (6, "Unused (ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR)", X, _UNUSED),
        (7, "Unused (ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR)", X, _UNUSED),
        (8, "GPU stopped processing (ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT)", A,
         ("the GPU stopped processing a channel: the catalog restarts the application, then contacts support; the "
          "older listing names the driver, the application, the bus and heat (a hung kernel or a hung device)")),
        (9, "Unused (ROBUST_CHANNEL_GR_ERROR_INSTANCE)", X, _UNUSED),
        (10, "Unused (ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP)", X, _UNUSED),
        (11, "Invalid or corrupted push buffer stream (ROBUST_CHANNEL_GR_ERROR_MISSING_HW)", A,
         ("an invalid push buffer stream: the catalog checks the application/CUDA first, the older listing names only "
          "the driver, system memory, the bus and the framebuffer")),
        (12, "Unused (ROBUST_CHANNEL_GR_ERROR_SW_METHOD)", X, _UNUSED),
        (13, "Graphics Engine Exception (ROBUST_CHANNEL_GR_EXCEPTION)", J,
         ("graphics engine exception: the catalog logs it for general user application faults (out of bounds, "
          "illegal instruction); hardware only when it repeats on the same TPC/GPC")),
        (14, "Fake or injected error (ROBUST_CHANNEL_FAKE_ERROR)", X,
         "a fake or injected error from user space (the catalog: IGNORE)"),
        (15, "Unused (ROBUST_CHANNEL_SCANLINE_TIMEOUT)", X, _UNUSED),
        (16, "Display engine hung (ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT)", X, _DISPLAY),
        (17, "Unused (ROBUST_CHANNEL_PARAMETER_ERROR)", X, _UNUSED),
        (18, "Bus mastering disabled in PCI config space (ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR)", N,
         ("unused on Ampere and newer; on older GPUs the GPU's PCI bus mastering was disabled (the older listing: "
          "the driver)")),
        (19, "Display engine error (ROBUST_CHANNEL_DISP_MISSED_NOTIFIER)", X, _DISPLAY),
        (20, "Invalid or corrupted MPEG push buffer (ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD)", X, _UNUSED_ENGINE),
        (21, "Invalid or corrupted motion estimation push buffer (ROBUST_CHANNEL_ME_ERROR_SW_METHOD)", X,
         _UNUSED_ENGINE),
        (22, "Invalid or corrupted video processor push buffer (ROBUST_CHANNEL_VP_ERROR_SW_METHOD)", X,
         _UNUSED_ENGINE),
        (23, "Unused (ROBUST_CHANNEL_RC_LOGGING_ENABLED)", X, _UNUSED),
        (24, "GPU semaphore timeout (ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT)", A,
         ("a GPU semaphore timed out: unused on Ampere and newer; the older listing names the driver, the "
          "application, system memory, the bus, heat and the framebuffer")),
        (25, "Invalid or illegal push buffer stream (ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY)", J,
         "an illegal push buffer stream: the catalog checks the application/CUDA (the older listing names it too)"),
        (26, "Framebuffer timeout (ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT)", N,
         "unused on Ampere and newer; on older GPUs the framebuffer timed out (the older listing: the driver)"),
        (27, "Video processor exception (ROBUST_CHANNEL_VP_ERROR)", X, _UNUSED_ENGINE),
        (28, "Video processor exception (ROBUST_CHANNEL_VP2_ERROR)", X, _UNUSED_ENGINE),
        (29, "Video processor exception (ROBUST_CHANNEL_BSP_ERROR)", X, _UNUSED_ENGINE),
        (30, "GPU semaphore access error (ROBUST_CHANNEL_BAD_ADDR_ACCESS)", A,
         "unused on Ampere and newer; a GPU semaphore access failed (the older listing: the driver)"),
        (31, "GPU memory page fault (ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT)", J,
         ("GPU memory page fault: the catalog calls these typically application-level bugs (an illegal address); "
          "hardware only when they repeat on the same GPU")),
        (32, "Invalid or corrupted push buffer stream (ROBUST_CHANNEL_PBDMA_ERROR)", A,
         ("a push buffer DMA error: the catalog checks the application/CUDA but says these are primarily PCIe "
          "quality issues, not the application; the older listing names the driver, memory, the bus and heat")),
        (33, "Internal micro-controller error (ROBUST_CHANNEL_SEC_ERROR)", A,
         "unused on Ampere and newer; an internal micro-controller error (the older listing: the driver)"),
        (34, "Video processor exception (ROBUST_CHANNEL_MSVLD_ERROR)", X, _UNUSED_ENGINE),
        (35, "Video processor exception (ROBUST_CHANNEL_MSPDEC_ERROR)", X, _UNUSED_ENGINE),
        (36, "Video processor exception (ROBUST_CHANNEL_MSPPP_ERROR)", X, _UNUSED_ENGINE),
        (37, "Driver firmware error (ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD)", A,
         ("a driver firmware error: the catalog ignores it and checks the application/CUDA; the older listing names "
          "the driver, system memory and the bus")),
        (38, "Driver firmware error (ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT)", A,
         "a driver firmware watchdog timeout: the catalog ignores it, then contacts support (the driver or the device)"),
        (39, "Copy Engine Exception (ROBUST_CHANNEL_CE0_ERROR)", A, _CE),
        (40, "Copy Engine Exception (ROBUST_CHANNEL_CE1_ERROR)", A, _CE),
        (41, "Copy Engine Exception (ROBUST_CHANNEL_CE2_ERROR)", A, _CE),
        (42, "Unused (ROBUST_CHANNEL_VIC_ERROR)", X, _UNUSED_ENGINE),
        (43, "GPU stopped processing (ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR)", J,
         ("the application hit a software-induced fault and must terminate; the GPU remains healthy (the catalog's "
          "trigger text)")),
        (44, "Graphics Engine fault during context switch (ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW)", A,
         ("a graphics engine fault during a context switch: the catalog ignores it, then contacts support (no GPU "
          "reset); the older listing names the driver")),
        (45, "Preemptive cleanup, due to previous errors (ROBUST_CHANNEL_PREEMPTIVE_REMOVAL)", X,
         ("the driver tore the application's channels down after it aborted (Ctrl-C, SIGKILL, a GPU reset) or after "
          "another Xid: the catalog follows the other Xid; not a fault alone")),
        (46, "GPU stopped processing (ROBUST_CHANNEL_GPU_TIMEOUT_ERROR)", N,
         "the GPU stopped processing: the catalog resets the GPU"),
        (47, "Unused (ROBUST_CHANNEL_NVENC0_ERROR)", X, _UNUSED_ENGINE),
        (48, "Double Bit ECC Error (ROBUST_CHANNEL_GPU_ECC_DBE)", N,
         "double-bit (uncorrectable) ECC error: a GPU reset or node reboot clears it"),
        (49, "Unused (SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY)", X, _UNUSED),
        (50, "Unused (SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR)", X, _UNUSED),
        (51, "Unused (SILENT_RUNNING_STRESS_TEST_FAILURE)", X, _UNUSED),
        (52, "Unused (SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE)", X, _UNUSED),
        (53, "Unused (SILENT_RUNNING_TEMP_REDUCED_CLOCKING)", X, _UNUSED),
        (54, "Auxiliary power is not connected to the GPU board (SILENT_RUNNING_PWR_REDUCED_CLOCKING)", N,
         "the GPU board's auxiliary power is missing (the catalog: check the mechanicals)"),
        (55, "Unused (SILENT_RUNNING_TEMPERATURE_READ_ERROR)", X, _UNUSED),
        (56, "Display engine error (DISPLAY_CHANNEL_EXCEPTION)", X, _DISPLAY),
        (57, "Error programming video memory interface (FB_LINK_TRAINING_FAILURE_ERROR)", N,
         "unused on Ampere and newer; the video memory interface could not be programmed (the older listing: HW)"),
        (58, "Unstable video memory interface detected (FB_MEMORY_ERROR)", N,
         "unused on Ampere and newer; the video memory interface is unstable (the older listing: HW)"),
        (59, "Internal micro-controller error (PMU_ERROR)", N,
         "unused on Ampere and newer; an internal micro-controller error (the older listing: the driver)"),
        (60, "Video processor exception (ROBUST_CHANNEL_SEC2_ERROR)", A, _ENGINE),
        (61, "Internal micro-controller breakpoint/warning (PMU_BREAKPOINT)", N,
         ("a PMU breakpoint: the GPU's internal micro-controller stopped. The catalog for Ampere and newer lists it "
          "as unused (CONTACT_SUPPORT, no resolution bucket); the older Xid listing (r555) says \"PMU Breakpoint. "
          "Report a GPU Issue and Reset GPU(s) reporting the XID\" and names no application cause: the device's")),
        (62, "Internal micro-controller halt (PMU_HALT_ERROR)", N,
         "GPU internal micro-controller halt: the catalog resets the GPU"),
        (63, "GPU memory remapping event (INFOROM_DRAM_RETIREMENT_EVENT)", X,
         "ECC page retirement / row remapping recorded (the memory protected itself): the catalog ignores it"),
        (64, "GPU memory remapping failure (INFOROM_DRAM_RETIREMENT_FAILURE)", N,
         "ECC page retirement / row remapping failure: the catalog resets the GPU"),
        (65, "Unused (ROBUST_CHANNEL_NVENC1_ERROR)", X, _UNUSED_ENGINE),
        (66, "Illegal access by driver (ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION)", A,
         "an illegal access by the driver: the catalog investigates the software (the older listing adds the app)"),
        (67, "Illegal access by driver (ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION)", A,
         "an illegal access by the driver: the catalog ignores it, then contacts support (driver or application)"),
        (68, "NVDEC0 Exception (ROBUST_CHANNEL_NVDEC0_ERROR)", A,
         ("video decoder (NVDEC) exception: the catalog restarts the application, then contacts support; the older "
          "listing names hardware, the driver and the application")),
        (69, "Graphics Engine class error (ROBUST_CHANNEL_GR_CLASS_ERROR)", A,
         ("a graphics engine class error: the catalog checks the application/CUDA, the older listing names only the "
          "GPU and its driver")),
        *[(code, f"{ce}: Unknown Error (ROBUST_CHANNEL_{ce}_ERROR)", A, _CE)
          for code, ce in ((70, "CE3"), (71, "CE4"), (72, "CE5"), (75, "CE6"), (76, "CE7"), (77, "CE8"),
                           (85, "CE9"), *((126 + i, f"CE{10 + i}") for i in range(10)))],
        (73, "Unused (ROBUST_CHANNEL_NVENC2_ERROR)", X, _UNUSED_ENGINE),
        (74, "NVLINK Error (NVLINK_ERROR)", N,
         "NVLink error: a GPU reset or node reboot clears it (the link, or the GPU at its other end)"),
        (78, "vGPU Start Error (VGPU_START_ERROR)", N,
         "a vGPU could not start: the host's and the guest's drivers disagree (the catalog: update the software)"),
        (79, "GPU has fallen off the bus (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS)", N,
         "GPU has fallen off the bus: the catalog restarts the machine"),
        (80, "Corrupted data sent to GPU (PBDMA_PUSHBUFFER_CRC_MISMATCH)", A,
         ("corrupted data reached the GPU: the catalog checks the application/CUDA, the older listing names the GPU, "
          "its driver, system memory, the bus and the framebuffer")),
        (81, "VGA Subsystem Error (ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR)", N,
         "unused on Ampere and newer; a VGA subsystem error (the older listing: HW)"),
        (82, "NVJPG0 Error (ROBUST_CHANNEL_NVJPG0_ERROR)", A, _ENGINE),
        (83, "NVDEC1 Error (ROBUST_CHANNEL_NVDEC1_ERROR)", A, _ENGINE),
        (84, "NVDEC2 Error (ROBUST_CHANNEL_NVDEC2_ERROR)", A, _ENGINE),
        (86, "OFA Exception (ROBUST_CHANNEL_OFA0_ERROR)", A, _ENGINE),
        (87, "Unused (NVTELEMETRY_DRIVER_REPORT)", X, _UNUSED),
        (88, "NVDEC3 Error (ROBUST_CHANNEL_NVDEC3_ERROR)", A, _ENGINE),
        (89, "NVDEC4 Error (ROBUST_CHANNEL_NVDEC4_ERROR)", A, _ENGINE),
        (90, "Unused (LTC_ERROR)", X, _UNUSED), (91, "Unused (RESERVED_XID)", X, _UNUSED),
        (92, "High single-bit ECC error rate (EXCESSIVE_SBE_INTERRUPTS)", X,
         "high single-bit (corrected) ECC error rate: the catalog ignores it"),
        (93, "Non-fatal violation of provisioned InfoROM wear limit (INFOROM_ERASE_LIMIT_EXCEEDED)", X,
         "InfoROM wear limit (informational; the catalog ignores it)"),
        (94, "Contained memory error (ROBUST_CHANNEL_CONTAINED_ERROR)", A,
         ("a contained memory (ECC) error: the application that hit it must restart, the others are unaffected, and "
          "the GPU is reset when convenient: relocation and the health check decide")),
        (95, "Uncontained memory error (ROBUST_CHANNEL_UNCONTAINED_ERROR)", N,
         "uncontained memory (ECC) error: the catalog resets the GPU before applications restart"),
        *[(code, f"NVDEC{code - 91} Error (ROBUST_CHANNEL_NVDEC{code - 91}_ERROR)", A, _ENGINE)
          for code in range(96, 99)],
        *[(code, f"NVJPG{code - 98} Error (ROBUST_CHANNEL_NVJPG{code - 98}_ERROR)", A, _ENGINE)
          for code in range(99, 106)],
        (106, "SMBPBI Test Message (SMBPBI_TEST_MESSAGE)", X, "a test message"),
        (107, "SMBPBI Test Message Silent (SMBPBI_TEST_MESSAGE_SILENT)", X, "a test message"),
        (108, "Unused (NVLINK_REMOTE_TRANSLATION_ERROR)", X, "unused (the catalog ignores it)"),
        (109, "Context Switch Timeout Error (ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR)", N,
         "context switch timeout: the catalog resets the GPU"),
        (110, "Security Fault Error (SEC_FAULT_ERROR)", N,
         "a security fault on the GPU: uncommon unless the hardware failed; the catalog resets the GPU"),
        *[(code, f"Display error ({mnemonic})", X, _DISPLAY)
          for code, mnemonic in ((111, "BUNDLE_ERROR_EVENT"), (112, "DISP_SUPERVISOR_ERROR"), (113, "DP_LT_FAILURE"),
                                 (114, "HEAD_RG_UNDERFLOW"), (115, "CORE_CHANNEL_REGS"),
                                 (116, "WINDOW_CHANNEL_REGS"), (117, "CURSOR_CHANNEL_REGS"), (118, "HEAD_REGS"))],
        (119, "GSP RPC Timeout (GSP_RPC_TIMEOUT)", N,
         "GSP RPC timeout: the GPU's system processor stopped answering; the catalog resets the GPU"),
        (120, "GSP Error (GSP_ERROR)", N, "GSP error: the catalog resets the GPU"),
        (121, "C2C Error (C2C_ERROR)", X,
         ("corrected errors on the C2C NVLink to a Grace CPU: corrected by the system with no operational impact "
          "(the catalog ignores it)")),
        (122, "SPI PMU RPC Read Failure (SPI_PMU_RPC_READ_FAIL)", N,
         "unused on Ampere and newer; the PMU could not read its SPI flash (the older listing: HW)"),
        (123, "SPI PMU RPC Write Failure (SPI_PMU_RPC_WRITE_FAIL)", N,
         "unused on Ampere and newer; the PMU could not write its SPI flash (the older listing: HW)"),
        (124, "SPI PMU RPC Erase Failure (SPI_PMU_RPC_ERASE_FAIL)", N,
         "unused on Ampere and newer; the PMU could not erase its SPI flash (the older listing: HW)"),
        (125, "InfoROM FS Failure (INFOROM_FS_ERROR)", N,
         "unused on Ampere and newer; the InfoROM file system failed (the older listing: HW)"),
        (136, "Link Training Failed (ALI_TRAINING_FAIL)", N,
         "NVLink training failed (H100): the catalog resets the GPU and investigates the link"),
        (137, "NVLink Privilege Error (NVLINK_PRIV_ERR)", J,
         ("an illegal NVLink peer-to-peer access reported by the remote MMU: typically an application-level bug "
          "(the catalog's trigger text)")),
        (138, "Unused (ROBUST_CHANNEL_DLA_ERROR)", X, _UNUSED),
        (139, "OFA1 Error (ROBUST_CHANNEL_OFA1_ERROR)", A, _ENGINE),
        (140, "ECC Unrecovered Error (UNRECOVERABLE_ECC_ERROR_ESCAPE)", N,
         "uncorrectable memory errors escaped page offlining/row remapping: the catalog resets the GPU"),
        (141, "CUDA Fast Path Error (ROBUST_CHANNEL_FAST_PATH_ERROR)", X,
         "a CUDA fast path error: the catalog ignores it (nothing to recover)"),
        (142, "NVENC3 Error (ROBUST_CHANNEL_NVENC3_ERROR)", A,
         "a video encoder exception (GB200): the catalog contacts support: relocation decides"),
        (143, "GPU Initialization Error (GPU_INIT_ERROR)", N, "the GPU failed to initialize: the catalog resets it"),
        *[(code, f"NVLINK: {unit} Error (NVLINK_{unit}_ERROR)", N, _NVLINK5)
          for code, unit in ((144, "SAW"), (145, "RLW"), (146, "TLW"), (147, "TREX"), (148, "NVLPW_CTRL"),
                             (149, "NETIR"), (150, "MSE"))],
        (151, "Key rotation Error (ROBUST_CHANNEL_KEY_ROTATION_ERROR)", N,
         "a key rotation error (confidential computing): the catalog restarts the VM that owns the GPU"),
        (152, "DLA SMMU Error (ROBUST_CHANNEL_DLA_SMMU_ERROR)", X, "a DLA error: no data-center GPU has a DLA"),
        (153, "DLA timeout Error (ROBUST_CHANNEL_DLA_TIMEOUT)", X, "a DLA error: no data-center GPU has a DLA"),
        (154, "GPU Recovery Action Changed (GPU_RECOVERY_ACTION_CHANGED)", N,
         "the driver asks for a GPU reset or node reboot (a fault unless the new action is None)"),
        (155, "NVLINK: SW Defined Error (NVLINK_SW_DEFINED_ERROR)", N,
         "an NVLink link went down by intent (e.g. to SLEEP): the catalog resets the GPU"),
        (156, "Resource Retirement Event (RESOURCE_RETIREMENT_EVENT)", N,
         "a GPU resource was retired: the catalog resets the GPU (to activate the retirement)"),
        (157, "Resource Retirement Failure (RESOURCE_RETIREMENT_FAILURE)", X,
         "no spare resource left to retire: workloads may still run (the catalog ignores it, then contacts support)"),
        (158, "GPU Fatal Timeout (GPU_FATAL_TIMEOUT)", N, "a fatal GPU timeout: the catalog resets the GPU"),
        (159, "CHI Non-Data Error (ROBUST_CHANNEL_CHI_NON_DATA_ERROR)", A,
         ("a C2C-link (CHI) error: the catalog resets the GPU only where UVM/vGPU is in use, and calls it "
          "sympathetic to another error: relocation and the health check decide")),
        (160, "Channel Retirement Event (CHANNEL_RETIREMENT_EVENT)", X,
         "a channel was retired: the catalog ignores it (investigates the software)"),
        (161, "Channel Retirement Failure (CHANNEL_RETIREMENT_FAILURE)", X,
         "a channel could not be retired: the catalog ignores it (investigates the software)"),
        (162, "Power Smoothing HW Circuitry capability reengaged (PSHC_REENGAGED)", X, "power smoothing state"),
        (163, "Power Smoothing HW Circuitry capability disengaged (PSHC_DISENGAGED)", X,
         "power smoothing disengaged: no GPU reset required"),
        (164, "Power Smoothing HW Circuitry low lifetime reached (PSHC_LOW_LIFETIME)", X,
         "power smoothing circuitry near its end of life: monitor power swings"),
        (165, "Power Smoothing HW Circuitry lifetime exhausted (PSHC_ZERO_LIFETIME)", X,
         "power smoothing disabled by the driver: the GPU goes on, with power swings"),
        (166, "CC traffic before the link was configured for encryption (NVLINK_SECURE_CRYPTO_ERR)", A,
         "a confidential-computing NVLink configuration event; the catalog gives no action: relocation decides"),
        (167, "PCIe fatal timeout (PCIE_FATAL_TIMEOUT)", N, "a fatal PCIe timeout on the GPU's link"),
        (168, "Errors found in WPR (REDUCED_GPU_MEMORY_CAPACITY)", N,
         "memory errors in the write-protected region (seen with ECC disabled): the GPU's memory"),
        (169, "Internal micro-controller halt (SEC2_HALT_ERROR)", N, "the GPU's SEC2 micro-controller halted"),
        (170, "Interrupt seen in CC mode (NVLINK_SECURE_OTHER)", A,
         "a confidential-computing NVLink interrupt; the catalog gives no action: relocation decides"),
        (171, "Uncorrectable DRAM error (UNCORRECTABLE_DRAM_ERROR)", N,
         "an uncorrectable error in the GPU's DRAM (HBM), detailing an Xid 48"),
        (172, "Uncorrectable SRAM error (UNCORRECTABLE_SRAM_ERROR)", N,
         "an uncorrectable error in the GPU's on-chip SRAM, detailing an Xid 48"),
        (185, "HBM sparing event", X,
         "HBM sparing state changed (the memory spared a failing region; like a row remap, not a fault alone)"),
    ),
)

#: Words of an Xid line whose code is not in the table: the driver describes the event after the code, and
#: a code newer than this table is still read by family (the node's when its words name an uncorrectable,
#: fatal or lost condition; nothing when they name a corrected or recorded one).
XID_NODE_WORDS = re.compile(
    r"uncorrect\w*|uncontained|unrecover\w*|(?<!non-)(?<!non )\bfatal\b|fallen off|\blost\b|link (?:down|fail\w*)|reset (?:required|"
    r"fail\w*)|retirement fail\w*|remap\w* fail\w*|sparing fail\w*|\btimeout\b|timed out|poison",
    re.IGNORECASE,
)
XID_NONE_WORDS = re.compile(r"\bcorrected\b|\bcontained\b|recorded|pending|informational|no action|\bnon-?\s?fatal\b",
                            re.IGNORECASE)

#: Codes whose line carries the severity the catalog decodes them by (its "XID 144-150 Decode" sheet: the unit, then
#: `Fatal`, `Link Fatal` or `Nonfatal`, e.g. `145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x...)`): the word decides,
#: not the code alone. Fatal and Link Fatal rows are RESET_GPU; Nonfatal rows are IGNORE or XID_154_EVAL (an Xid
#: 154 line, or the Xid 48/94/95 a row says it leads to, is then its own evidence).
XID_SEVERITY_CODES = frozenset(range(144, 151))
XID_SEVERITY = re.compile(r"(?<![\w-])(?:(?P<nonfatal>Non-?\s?fatal)|(?P<fatal>(?:Link\s+)?Fatal))\b", re.IGNORECASE)
#: An NVLink5 unit's own interrupt on a link, as the 144-150 lines and the lines those units raise under other codes
#: print it: the unit (SAW, RLW, TLW, TREX, NVLPW_CTRL, NETIR, MSE, with its sub-unit: `RLW_RXPIPE`), then the link
#: (`... Link 11`, `interrupt hit on link 11`). A code the catalog blames on the application (Xid 137, an illegal
#: NVLink peer access) whose line is such a unit's report came from the link, not from a process: NVIDIA's answer
#: to an Xid 137 `RLW_RXPIPE interrupt hit on link 11 ... PRIV Error` beside an Xid 145 on the same link was
#: "fabric manager / nvlink issues" (NVIDIA/nccl#2241). Case-sensitive: the driver prints the units in capitals.
XID_NVLINK5_UNIT_EVENT = re.compile(
    r"(?<![\w-])(?:SAW|RLW|TLW|TREX|NVLPW(?:_CTRL)?|NETIR|MSE)(?:_[A-Z0-9]+)*\b[^\n]{0,80}?\b[Ll]ink\s+-?\d+\b")


# ---- CUDA runtime errors (beyond rules.CUDA_ERRORS, which decides the codes it names) ---------------------
_MISUSE = "a CUDA API misused or misconfigured by the job's code"
CUDA_RUNTIME = Catalogue(
    key="cuda-runtime",
    title="CUDA runtime cudaError_t",
    source="NVIDIA, CUDA Runtime API reference, enum cudaError (driver_types.h), and the Driver API's CUresult: "
           "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html, "
           "https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html",
    version="CUDA 12.8 / 13.0",
    codes=_codes(
        (1, "cudaErrorInvalidValue", J, _MISUSE), (2, "cudaErrorMemoryAllocation", J, "out of GPU memory"),
        (3, "cudaErrorInitializationError", A, "CUDA could not be initialized (driver or GPU; a fork also)"),
        (4, "cudaErrorCudartUnloading", J, "a CUDA call while the runtime unloads (the job's shutdown order)"),
        (9, "cudaErrorInvalidConfiguration", J, _MISUSE), (12, "cudaErrorInvalidPitchValue", J, _MISUSE),
        (13, "cudaErrorInvalidSymbol", J, _MISUSE), (16, "cudaErrorInvalidHostPointer", J, _MISUSE),
        (17, "cudaErrorInvalidDevicePointer", J, _MISUSE), (18, "cudaErrorInvalidTexture", J, _MISUSE),
        (21, "cudaErrorInvalidMemcpyDirection", J, _MISUSE),
        (34, "cudaErrorStubLibrary", J, "the image links CUDA's stub library instead of the driver (the image)"),
        (35, "cudaErrorInsufficientDriver", J, "the image needs a newer driver than the fleet's (the image)"),
        (36, "cudaErrorCallRequiresNewerDriver", J, "the image needs a newer driver than the fleet's (the image)"),
        (46, "cudaErrorDevicesUnavailable", N, "the pod's GPU is busy or unavailable"),
        (49, "cudaErrorIncompatibleDriverContext", J, _MISUSE), (52, "cudaErrorMissingConfiguration", J, _MISUSE),
        (53, "cudaErrorPriorLaunchFailure", A, "an earlier launch failed (the earlier error decides)"),
        (98, "cudaErrorInvalidDeviceFunction", J, "no kernel for this function in the image (the image)"),
        (100, "cudaErrorNoDevice", N, "CUDA sees no GPU though the pod was given one"),
        (101, "cudaErrorInvalidDevice", A, "invalid device ordinal: the job's configuration or a GPU the node lost"),
        (102, "cudaErrorDeviceNotLicensed", N, "the node's vGPU is not licensed"),
        (127, "cudaErrorStartupFailure", N, "the CUDA driver failed to start on the node"),
        (200, "cudaErrorInvalidKernelImage", J, "an invalid kernel image (the image)"),
        (201, "cudaErrorDeviceUninitialized", J, _MISUSE),
        (209, "cudaErrorNoKernelImageForDevice", J, "no kernel image for this GPU architecture (the image)"),
        (214, "cudaErrorECCUncorrectable", N, "an uncorrectable ECC error"),
        (216, "cudaErrorDeviceAlreadyInUse", N, "the GPU is held by another process (exclusive mode)"),
        (217, "cudaErrorPeerAccessUnsupported", A, "peer access unavailable on this node's topology"),
        (218, "cudaErrorInvalidPtx", J, "invalid PTX (the image's toolchain)"),
        (220, "cudaErrorNvlinkUncorrectable", N, "an uncorrectable NVLink error"),
        (221, "cudaErrorJitCompilerNotFound", J, "the PTX JIT compiler is missing (the image)"),
        (222, "cudaErrorUnsupportedPtxVersion", J, "PTX newer than the driver (the image)"),
        (226, "cudaErrorContained", N, "a contained device error (hardware, or a bad NVLink peer access)"),
        (302, "cudaErrorSharedObjectSymbolNotFound", J, "a shared object symbol is missing (the image)"),
        (303, "cudaErrorSharedObjectInitFailed", J, "a shared object failed to initialize (the image)"),
        (304, "cudaErrorOperatingSystem", A, "an operating-system call inside CUDA failed"),
        (400, "cudaErrorInvalidResourceHandle", J, _MISUSE), (401, "cudaErrorIllegalState", J, _MISUSE),
        (500, "cudaErrorSymbolNotFound", J, _MISUSE), (600, "cudaErrorNotReady", X, "not an error (not ready yet)"),
        (700, "cudaErrorIllegalAddress", A, "an illegal memory access: a bad kernel or a bad device"),
        (701, "cudaErrorLaunchOutOfResources", J, "a launch asked for too many resources"),
        (702, "cudaErrorLaunchTimeout", A, "the watchdog stopped a kernel: a node setting or a hung GPU"),
        (704, "cudaErrorPeerAccessAlreadyEnabled", J, _MISUSE), (705, "cudaErrorPeerAccessNotEnabled", J, _MISUSE),
        (709, "cudaErrorContextIsDestroyed", J, _MISUSE), (710, "cudaErrorAssert", J, "a device-side assert"),
        (711, "cudaErrorTooManyPeers", J, _MISUSE),
        (714, "cudaErrorHardwareStackError", A, "the device's call stack failed: a kernel or the device"),
        (715, "cudaErrorIllegalInstruction", A, "an illegal instruction: a bad build or a bad device"),
        (716, "cudaErrorMisalignedAddress", J, "a misaligned access in a kernel"),
        (717, "cudaErrorInvalidAddressSpace", J, "a kernel used an invalid address space"),
        (718, "cudaErrorInvalidPc", J, "a kernel jumped to an invalid address"),
        (719, "cudaErrorLaunchFailure", A, "an exception on the device while a kernel ran: a kernel or the device"),
        (720, "cudaErrorCooperativeLaunchTooLarge", J, _MISUSE),
        (800, "cudaErrorNotPermitted", J, _MISUSE), (801, "cudaErrorNotSupported", J, _MISUSE),
        (802, "cudaErrorSystemNotReady", N, "the GPU system is not initialized (Fabric Manager)"),
        (803, "cudaErrorSystemDriverMismatch", J, "the image's compat driver does not match the node's (the image)"),
        (804, "cudaErrorCompatNotSupportedOnDevice", J, "forward compatibility unsupported on this GPU (the image)"),
        (805, "cudaErrorMpsConnectionFailed", N, "the node's MPS server could not be reached"),
        (806, "cudaErrorMpsRpcFailure", N, "the node's MPS server failed"),
        (807, "cudaErrorMpsServerNotReady", N, "the node's MPS server is not ready"),
        (808, "cudaErrorMpsMaxClientsReached", N, "the node's MPS server has no room"),
        (809, "cudaErrorMpsMaxConnectionsReached", N, "the node's MPS server has no room"),
        (810, "cudaErrorMpsClientTerminated", N, "the node's MPS server terminated the client"),
        (900, "cudaErrorStreamCaptureUnsupported", J, _MISUSE), (901, "cudaErrorStreamCaptureInvalidated", J, _MISUSE),
        (909, "cudaErrorTimeout", A, "a wait timed out: a hung kernel or device"),
        (910, "cudaErrorGraphExecUpdateFailure", J, _MISUSE),
        (911, "cudaErrorExternalDevice", N, "an asynchronous error in a device outside CUDA (a NIC, NVLink peer)"),
        (999, "cudaErrorUnknown", N, "CUDA's unknown error: the driver or the GPU is in a bad state"),
    ),
)

# ---- NCCL ------------------------------------------------------------------------------------
NCCL_RESULTS = Catalogue(
    key="nccl-result",
    title="NCCL ncclResult_t",
    source="NVIDIA, NCCL documentation, API Types: ncclResult_t (nccl.h): "
           "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/types.html",
    version="NCCL 2.18-2.27",
    codes=_codes(
        (0, "ncclSuccess", X, "success"),
        (1, "ncclUnhandledCudaError", A, "a CUDA call inside NCCL failed: a driver or GPU fault, or the image"),
        (2, "ncclSystemError", A, ("a system call failed: a socket (the network) or /dev/shm (the job's setup); "
                                  "the lines around it decide (`evidence._find_nccl_system_errors`)"), DEDICATED),
        (3, "ncclInternalError", A, "NCCL's internal error: a corrupted transport (the network) or an NCCL bug",
         r"\bncclInternalError\b|NCCL error[^\n]{0,80}internal error"),
        (4, "ncclInvalidArgument", J, "invalid NCCL argument (the code)"),
        (5, "ncclInvalidUsage", J, "invalid use of NCCL (the code)"),
        (6, "ncclRemoteError", N, "a peer or the network failed"),
        (7, "ncclInProgress", X, "non-blocking call in progress (not an error)"),
    ),
)

# ---- NVML ------------------------------------------------------------------------------------
#: A line that asks (ends with a question mark, perhaps inside quotes) is a person's prose quoting a tool, not the
#: tool's report: the rules over NVML's and the driver's words do not apply to it (`rules.TextRule.unless`).
QUESTION_LINE = re.compile(r"\?[\s'\"`)\]]*$")


def _nvml(code: int, name: str, fault: Fault, reason: str) -> tuple:
    camel = "".join(part.capitalize() for part in name.split("_"))
    return (code, f"NVML_ERROR_{name}", fault, reason, rf"\bNVML_ERROR_{name}\b|\bNVMLError_{camel}\b")


NVML_RETURNS = Catalogue(
    key="nvml-return",
    title="NVML nvmlReturn_t",
    source="NVIDIA, NVML API Reference Guide, Device Enums: nvmlReturn_t (nvml.h): "
           "https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceEnumvs.html",
    version="NVML for driver R550-R580",
    codes=_codes(
        _nvml(1, "UNINITIALIZED", J, "NVML used before nvmlInit (the code)"),
        _nvml(2, "INVALID_ARGUMENT", J, "an invalid NVML argument (the code)"),
        _nvml(3, "NOT_SUPPORTED", X, "not supported on this GPU (not an error of the node)"),
        _nvml(4, "NO_PERMISSION", J, "the job lacks the permission (its security context)"),
        _nvml(6, "NOT_FOUND", J, "an NVML query for something absent (the code)"),
        _nvml(7, "INSUFFICIENT_SIZE", J, "a buffer too small (the code)"),
        _nvml(8, "INSUFFICIENT_POWER", N, "the GPU's power cables are not attached properly"),
        _nvml(9, "DRIVER_NOT_LOADED", N, "the NVIDIA driver is not loaded on the node"),
        _nvml(10, "TIMEOUT", N, "the GPU did not answer in time"),
        _nvml(11, "IRQ_ISSUE", N, "the NVIDIA kernel detected an interrupt problem with the GPU"),
        _nvml(12, "LIBRARY_NOT_FOUND", N, "the NVML library is missing in the container (the runtime's injection)"),
        _nvml(13, "FUNCTION_NOT_FOUND", J, "the NVML library is older than the job expects (the image)"),
        _nvml(14, "CORRUPTED_INFOROM", N, "the GPU's InfoROM is corrupted"),
        _nvml(15, "GPU_IS_LOST", N, "the GPU has fallen off the bus or is otherwise inaccessible"),
        _nvml(16, "RESET_REQUIRED", N, "the GPU needs a reset"),
        _nvml(17, "OPERATING_SYSTEM", N, "the GPU control device was blocked by the operating system"),
        _nvml(18, "LIB_RM_VERSION_MISMATCH", N, "the node's NVIDIA driver and library versions differ"),
        _nvml(19, "IN_USE", X, "the GPU is in use (an operation refused, not a fault)"),
        _nvml(20, "MEMORY", J, "NVML could not allocate host memory"),
        _nvml(21, "NO_DATA", X, "no data (not an error)"),
        _nvml(22, "VGPU_ECC_NOT_SUPPORTED", X, "ECC unsupported in this vGPU mode"),
        _nvml(23, "INSUFFICIENT_RESOURCES", J, "not enough resources for the request"),
        _nvml(25, "ARGUMENT_VERSION_MISMATCH", J, "a struct version the library does not know (the image)"),
        _nvml(27, "NOT_READY", N, "the GPU or its driver is not ready"),
        _nvml(28, "GPU_NOT_FOUND", N, "a GPU the node should have was not found"),
        _nvml(29, "INVALID_STATE", N, "the GPU is in an invalid state"),
        _nvml(999, "UNKNOWN", N, "NVML's unknown error (the driver or the GPU)"),
    ),
)

# ---- DCGM health-watch systems -----------------------------------------------------------------------
_DCGM_LINE = (r"(?:DCGM_HEALTH_WATCH_{0}\b[^\n]{{0,160}}(?:FAIL|[Ff]ail)"
              r"|Health Monitor[^\n]{{0,40}}\b{1}\b[^\n]{{0,120}}(?:FAIL|[Ff]ail))")


def _dcgm(system: str, words: str, reason: str) -> tuple:
    return (system, f"DCGM_HEALTH_WATCH_{system}", N, f"DCGM's health watch failed: {reason}",
            _DCGM_LINE.format(system, words))


DCGM_HEALTH = Catalogue(
    key="dcgm-health",
    title="DCGM health-watch systems",
    source="NVIDIA, DCGM User Guide, Health and Diagnostics: dcgmHealthSystems_t (dcgm_structs.h); a system "
           "whose result is DCGM_HEALTH_RESULT_FAIL (a WARN is not a fault alone): "
           "https://docs.nvidia.com/datacenter/dcgm/latest/reference/dcgm-api/dcgm-api-health-mon.html",
    version="DCGM 3.3-4.x",
    codes=_codes(
        _dcgm("PCIE", "PCIe", "PCIe replays or link errors"),
        _dcgm("NVLINK", "NVLink", "NVLink errors"),
        _dcgm("PMU", "PMU", "the power management unit"),
        _dcgm("MCU", "MCU", "the micro-controller unit"),
        _dcgm("MEM", "(?:Memory|MEM)", "memory (ECC, retired pages, row remapping)"),
        _dcgm("SM", "SM", "streaming multiprocessors"),
        _dcgm("INFOROM", "InfoROM", "the InfoROM"),
        _dcgm("THERMAL", "Thermal", "thermal violations"),
        _dcgm("POWER", "Power", "power violations"),
        _dcgm("DRIVER", "Driver", "the driver"),
        _dcgm("NVSWITCH_NONFATAL", "NVSwitch", "NVSwitch non-fatal errors"),
        _dcgm("NVSWITCH_FATAL", "NVSwitch", "NVSwitch fatal errors"),
    ),
)

# ---- AMD: amdgpu kernel lines, RAS, HIP --------------------------------------------------------------
AMD_GPU = Catalogue(
    key="amd-gpu",
    title="AMD amdgpu kernel driver, RAS and HIP errors",
    source="AMD, ROCm documentation: HIP Runtime API hipError_t (hip_runtime_api.h), AMD Instinct RAS / amdgpu "
           "RAS error reporting, and the Linux amdgpu driver's messages (drivers/gpu/drm/amd): "
           "https://rocm.docs.amd.com/projects/HIP/en/latest/reference/error_codes.html, "
           "https://docs.kernel.org/gpu/amdgpu/ras.html",
    version="ROCm 6.x, Linux 6.x amdgpu",
    codes=_codes(
        ("ras-uncorrectable", "amdgpu RAS uncorrectable error", N, "an uncorrectable error on the AMD GPU (RAS)",
         (r"amdgpu[^\n]{0,120}(?:uncorrectable|uncorrected)[^\n]{0,80}(?:error|ECC)|\bERREVENT_ATHUB_INTERRUPT\b"
         r"|amdgpu[^\n]{0,80}RAS[^\n]{0,80}\b(?:UE|fatal)\b|amdgpu[^\n]{0,80}poison (?:consumed|consumption|created)")),
        ("ras-correctable", "amdgpu RAS correctable error", X, "a corrected error (RAS): not a fault alone",
         r"amdgpu[^\n]{0,120}\bcorrectable hardware errors? detected"),
        ("gpu-reset-failed", "amdgpu GPU reset/recovery failed", N, "the AMD GPU could not be recovered",
         r"amdgpu[^\n]{0,80}(?:GPU reset|GPU recovery|ASIC reset|mode[12] reset|BACO)[^\n]{0,40}\bfail\w*"),
        ("init-failed", "amdgpu initialization failed", N, "the AMD GPU failed to initialize",
         (r"amdgpu[^\n]{0,80}(?:Fatal error during GPU init|amdgpu_device_init failed|hw_init of IP block[^\n]*failed"
         r"|SMU (?:is not ready|failed)|PSP (?:load|init)[^\n]{0,20}fail\w*)")),
        ("ring-timeout", "amdgpu ring timeout", A,
         "a ring timed out (a hung kernel or a hung GPU): the driver resets it",
         r"amdgpu_job_timedout|amdgpu[^\n]{0,60}ring \S+ timeout"),
        ("vm-fault", "amdgpu VM page fault", J, "a GPU memory page fault (the application, as NVIDIA's Xid 31)",
         r"amdgpu[^\n]{0,80}\[(?:gfxhub|mmhub)\w*\] (?:no-retry )?page fault|amdgpu[^\n]{0,40}VM_L2_PROTECTION_FAULT"),
        ("hsa-memory-fault", "HSA memory access fault", A,
         "the ROCm runtime's memory access fault (a bad pointer in a kernel, or the device's memory)",
         r"Memory access fault by GPU node-\d+|HSA_STATUS_ERROR_MEMORY_(?:APERTURE_VIOLATION|FAULT)"),
        ("hsa-exception", "HSA hardware exception", A, "the ROCm runtime saw a hardware exception on the queue",
         r"HSA_STATUS_ERROR_(?:EXCEPTION|ILLEGAL_INSTRUCTION)"),
        ("hsa-out-of-resources", "HSA out of resources", J, "the ROCm runtime ran out of resources (the job's use)",
         r"HSA_STATUS_ERROR_OUT_OF_RESOURCES"),
        ("hipErrorOutOfMemory", "hipErrorOutOfMemory", J, "out of GPU memory",
         r"\bhipErrorOutOfMemory\b|HIP out of memory"),
        ("hipErrorIllegalAddress", "hipErrorIllegalAddress", A, "an illegal memory access: a kernel or the device",
         r"\bhipErrorIllegalAddress\b|HIP error: an illegal memory access"),
        ("hipErrorLaunchFailure", "hipErrorLaunchFailure", A, "a kernel launch failed: a kernel or the device",
         r"\bhipErrorLaunchFailure\b|HIP error: unspecified launch failure"),
        ("hipErrorIllegalInstruction", "hipErrorIllegalInstruction", A, "an illegal instruction: a build or the device",
         r"\bhipErrorIllegalInstruction\b"),
        ("hipErrorNoDevice", "hipErrorNoDevice", N, "HIP sees no GPU though the pod was given one",
         r"\bhipErrorNoDevice\b|no ROCm-capable device is detected"),
        ("hipErrorInvalidDevice", "hipErrorInvalidDevice", A,
         "invalid device ordinal: the configuration or a GPU the node lost", r"\bhipErrorInvalidDevice\b"),
        ("hipErrorECCNotCorrectable", "hipErrorECCNotCorrectable", N, "an uncorrectable ECC error",
         r"\bhipErrorECCNotCorrectable\b"),
        ("hipErrorHardwareStackError", "hipErrorHardwareStackError", A, "the device's stack failed",
         r"\bhipErrorHardwareStackError\b"),
        ("hipErrorNotInitialized", "hipErrorNotInitialized", A, "HIP could not be initialized (driver or GPU)",
         r"\bhipError(?:NotInitialized|InitializationError)\b"),
        ("hipErrorLaunchTimeOut", "hipErrorLaunchTimeOut", A, "a kernel timed out", r"\bhipErrorLaunchTimeOut\b"),
        ("hipErrorUnknown", "hipErrorUnknown", N, "HIP's unknown error (the driver or the GPU)",
         r"\bhipErrorUnknown\b"),
        ("hipErrorRuntimeMemory", "hipErrorRuntimeMemory", A, "the HSA runtime's memory call failed",
         r"\bhipErrorRuntime(?:Memory|Other)\b"),
        ("hipErrorInvalidValue", "hipErrorInvalidValue", J, "an invalid HIP argument (the code)",
         r"\bhipErrorInvalid(?:Value|DevicePointer|Configuration|Symbol|ResourceHandle)\b"),
        ("hipErrorNoBinaryForGpu", "hipErrorNoBinaryForGpu", J, "no kernels for this GPU architecture (the image)",
         r"\bhipErrorNoBinaryForGpu\b|HIP error: invalid device function"),
        ("hipErrorInsufficientDriver", "hipErrorInsufficientDriver", J, "the image needs a newer ROCm driver",
         r"\bhipErrorInsufficientDriver\b"),
        ("hipErrorAssert", "hipErrorAssert", J, "a device-side assert", r"\bhipErrorAssert\b"),
    ),
)

# ---- InfiniBand / RoCE / EFA drivers ---------------------------------------------------------------
_NIC_DRIVERS = r"(?:mlx4_core|mlx4_en|mlx4_ib|mlx5_core|mlx5_ib|irdma|\bice\b|bnxt_re|\befa\b)"
RDMA_DRIVERS = Catalogue(
    key="rdma-driver",
    title="InfiniBand, RoCE and EFA drivers",
    source="Linux kernel drivers mlx4/mlx5 (NVIDIA/Mellanox), irdma/ice (Intel), bnxt_re (Broadcom), efa (AWS "
           "Elastic Fabric Adapter) messages; libibverbs async events (ibv_get_async_event: IBV_EVENT_*); NCCL's "
           "NET/IB and NET/OFI warnings: https://docs.kernel.org/networking/device_drivers/ethernet/mellanox/mlx5/"
           "index.html, https://man7.org/linux/man-pages/man3/ibv_get_async_event.3.html, "
           "https://github.com/aws/aws-ofi-nccl",
    version="Linux 5.15-6.x, rdma-core 4x-5x, NCCL 2.18-2.27, aws-ofi-nccl 1.x",
    codes=_codes(
        ("link-down", "NIC/HCA link down", N, "the node's RDMA link went down",
         (rf"{_NIC_DRIVERS}[^\n]{{0,120}}\b(?:link (?:is )?down|Link DOWN|port \d+ (?:state )?(?:changed to )?DOWN)\b"
         r"|\bNIC Link is Down\b"), False),
        ("port-error", "port error (IBV_EVENT_PORT_ERR)", N, "an RDMA port went into error",
         r"\bIBV_EVENT_PORT_ERR\b|\bport error\b[^\n]{0,40}(?:mlx|efa|irdma|ib)", False),
        ("device-fatal", "device fatal (IBV_EVENT_DEVICE_FATAL / firmware)", N, "the RDMA device failed",
         (rf"\bIBV_EVENT_DEVICE_FATAL\b|{_NIC_DRIVERS}[^\n]{{0,160}}(?:\bfatal\b|internal error|device'?s? health "
         r"(?:compromised|poll failed)|health compromised|firmware (?:fatal|error|timeout|hang)|reset failed"
         r"|(?:admin|command)[^\n]{0,40}(?:timeout|timed out|failed))")),
        ("device-absent", "RDMA device absent or failed to come up", N,
         "the node's RDMA device never came up (its driver's probe or initialisation failed)",
         (rf"{_NIC_DRIVERS}[^\n]{{0,120}}(?:probe (?:of [^\n]* )?failed|failed to (?:probe|load|initiali[sz]e|enable|"
         r"create)|\w*init\w* failed|(?:device|adapter) (?:is )?not (?:ready|responding|found))")),
        # NCCL's own words for a device it could not open: weak (NCCL goes on with the others when it has them),
        # so they yield to the job's own error and cannot turn a clean exit into a failure.
        ("nccl-device-absent", "NCCL could not open an RDMA device", N,
         "NCCL could not open or find the node's RDMA device (the HCA, its driver or the libfabric provider)",
         (r"NCCL WARN NET/(?:IB|OFI)[^\n]{0,80}(?:ibv_open_device failed|ibv_query_port failed|fi_getinfo failed"
         r"|Unable to (?:find|open)[^\n]{0,30}(?:device|provider)|No (?:usable )?(?:device|NIC|provider)s? found)"
         r"|NCCL WARN Call to ibv_open_device failed"), False, True),
        ("cq-error", "work completion error", N, "an RDMA completion error (a peer or the link)",
         r"\bIBV_WC_(?:RETRY_EXC_ERR|RNR_RETRY_EXC_ERR|REM_ACCESS_ERR|LOC_LEN_ERR|REM_OP_ERR|WR_FLUSH_ERR)\b", False),
    ),
)

# ---- PCIe AER --------------------------------------------------------------------------------
PCIE_AER = Catalogue(
    key="pcie-aer",
    title="PCIe Advanced Error Reporting",
    source="PCI-SIG, PCI Express Base Specification, Advanced Error Reporting capability; the Linux kernel's "
           "AER driver messages (drivers/pci/pcie/aer.c) and Documentation/PCI/pcieaer-howto: "
           "https://pcisig.com/specifications, https://docs.kernel.org/PCI/pcieaer-howto.html",
    version="PCIe Base 5.0/6.0; Linux 5.x-6.x",
    codes=_codes(
        ("corrected", "Corrected", X, "a corrected PCIe error (the link retried it)",
         r"AER: (?:Multiple )?Corrected error|severity=Corrected"),
        ("non-fatal", "Uncorrected (Non-Fatal)", N, "an uncorrected, non-fatal PCIe error",
         r"AER: (?:Multiple )?Uncorrect(?:ed|able) \(Non-Fatal\)|severity=Uncorrect(?:ed|able) \(Non-Fatal\)", False),
        ("fatal", "Uncorrected (Fatal)", N, "a fatal uncorrected PCIe error",
         r"AER: (?:Multiple )?Uncorrect(?:ed|able) \(Fatal\)|severity=Uncorrect(?:ed|able) \(Fatal\)"),
        ("surprise-down", "Surprise Down Error", N, "the PCIe link went down unexpectedly", r"\bSurprise ?Down\b"),
        ("completion-timeout", "Completion Timeout", N, "a PCIe completion timed out (a device stopped answering)",
         r"\bCmpltTO\b|Completion Timeout"),
        ("poisoned-tlp", "Poisoned TLP", N, "poisoned data on the PCIe link", r"\bPoisoned ?TLP\b|\bPoisonTLP\b"),
        ("malformed-tlp", "Malformed TLP", N, "a malformed PCIe packet", r"\bMalformed ?TLP\b|\bMalfTLP\b"),
        ("dlp", "Data Link Protocol Error", N, "a PCIe data link protocol error", r"\bDLP\b.*\bFatal\b"),
        ("recovery-failed", "device recovery failed", N, "the kernel could not recover the device",
         r"AER: (?:device recovery failed|can't recover)|error_detected\(\) failed"),
        ("receiver-error", "Receiver Error (corrected)", X, "a corrected receiver error", r"\bRxErr\b"),
        ("bad-tlp", "Bad TLP / Bad DLLP / Replay (corrected)", X, "a corrected link error",
         r"\bBad(?:TLP|DLLP)\b|\bReplay(?:Timer|Rollover)\b"),
    ),
)

# ---- MCE / EDAC ------------------------------------------------------------------------------
MCE_EDAC = Catalogue(
    key="mce-edac",
    title="Machine checks and EDAC memory errors",
    source="Linux kernel: x86 MCE (arch/x86/kernel/cpu/mce), EDAC (drivers/edac), APEI/GHES (drivers/acpi/apei) "
           "and memory-failure (mm/memory-failure.c) messages; rasdaemon: "
           "https://docs.kernel.org/admin-guide/RAS/main.html, https://github.com/mchehab/rasdaemon",
    version="Linux 5.x-6.x",
    codes=_codes(
        ("edac-ce", "EDAC corrected error (CE)", X, "a corrected memory error", r"EDAC [^\n]{0,80}\bCE\b"),
        ("edac-ue", "EDAC uncorrected error (UE)", N, "an uncorrected memory error", r"EDAC [^\n]{0,80}\bUE\b"),
        ("ghes-fatal", "APEI/GHES fatal or recoverable", N, "an uncorrected hardware error reported by firmware",
         r"\[Hardware Error\][^\n]{0,80}(?:event severity: (?:fatal|recoverable)|severity: (?:fatal|recoverable))"),
        ("ghes-corrected", "APEI/GHES corrected", X, "a corrected hardware error reported by firmware",
         r"\[Hardware Error\][^\n]{0,80}(?:event )?severity: corrected"),
        ("mce-uncorrected", "machine check, uncorrected", N, "an uncorrected machine check",
         (r"Machine check:[^\n]{0,60}(?:Processor context corrupt|uncorrect\w*)|Fatal [Mm]achine check"
         r"|mce: [^\n]{0,80}\bUncorrected\b|\[Hardware Error\]: [^\n]{0,40}Machine Check Exception")),
        ("mce-logged", "machine check events logged", X, "the kernel logged machine checks (corrected as a rule)",
         r"Machine check events logged"),
        ("memory-failure", "memory failure (hwpoison)", N, "a host memory page failed",
         r"Memory failure: 0x[0-9a-f]+"),
    ),
)

# ---- other accelerators: Intel Gaudi, AWS Neuron, Intel GPUs, Google TPU ---------------------------------
OTHER_ACCELERATORS = Catalogue(
    key="other-accelerator",
    title="Other accelerators' drivers",
    source="Linux habanalabs driver (Intel Gaudi, drivers/accel/habanalabs), AWS Neuron runtime and driver "
           "messages (Neuron documentation, troubleshooting), Linux i915/xe drivers (Intel GPUs), Cloud TPU "
           "runtime errors (libtpu); read by family: the driver's name with the words of a fault: "
           "https://awsdocs-neuron.readthedocs-hosted.com/, "
           "https://cloud.google.com/tpu/docs/troubleshooting/troubleshooting",
    version="Linux 6.x, Neuron SDK 2.x, libtpu 0.x (2024-2026)",
    codes=_codes(
        ("gaudi-fatal", "habanalabs critical or uncorrectable error", N, "the Gaudi device failed",
         (r"habanalabs[^\n]{0,160}(?:critical error|\bfatal\b|uncorrectable|double.?bit|\bDERR\b|failed to reset"
         r"|device is (?:disabled|unusable|in an unusable state)|heartbeat (?:failed|lost)|PCI link (?:down|error))")),
        ("gaudi-correctable", "habanalabs correctable error", X, "a corrected error on the Gaudi device",
         r"habanalabs[^\n]{0,160}(?:\bcorrectable\b|\bSERR\b)"),
        ("neuron-hardware", "Neuron device hardware error", N, "the Neuron device failed",
         (r"\bneuron\w*\b[^\n]{0,160}(?:uncorrectable|hardware error|\bHW error|\bfatal\b|device (?:is )?(?:unhealthy|"
         r"unavailable)|DMA (?:error|timeout)|\bhang\b)")),
        ("intel-gpu-wedged", "i915/xe GPU wedged or reset failed", N, "the Intel GPU could not be recovered",
         r"\b(?:i915|xe) [^\n]{0,120}(?:wedged|GPU reset failed|reset failed|uncorrectable|\bfatal\b)"),
        ("intel-gpu-hang", "i915/xe GPU hang", A, "a GPU hang: a hung kernel or a hung device (the driver resets it)",
         r"\b(?:i915|xe) [^\n]{0,120}GPU HANG"),
        ("tpu-hardware", "TPU hardware error", N, "the TPU chip or its host failed",
         (r"\bTPU\b[^\n]{0,160}(?:hardware (?:error|failure|fault)|uncorrectable|(?:is|became) (?:unhealthy|not healthy)"
         r"|chip (?:error|failure|fault))")),
    ),
)

CATALOGUES: tuple[Catalogue, ...] = (NVIDIA_XID, CUDA_RUNTIME, NCCL_RESULTS, NVML_RETURNS, DCGM_HEALTH, AMD_GPU,
                                     OTHER_ACCELERATORS, RDMA_DRIVERS, PCIE_AER, MCE_EDAC)
