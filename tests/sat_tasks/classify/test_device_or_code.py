"""Device-or-code ambiguity goes to relocation (issue 43 item 2, ADR 0004).

A CUDA status that can mean a bad device or a bad kernel is an "ambiguous:" HARDWARE verdict,
which `core.node_health.suspect_node` makes SUSPECT_NODE: the job moves once, and the same
failure on a second node is INTERNAL; a clean run there blames the first node.
"""

from __future__ import annotations

import pytest

from sat_tasks.classify import VerdictKind, classify
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.node_health import RELOCATION, diagnose, suspect_node

HW, INT = VerdictKind.HARDWARE, VerdictKind.INTERNAL

AMBIGUOUS_LINES = [
    pytest.param("RuntimeError: CUDA error: an illegal instruction was encountered", id="illegal-instruction"),
    pytest.param("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", id="illegal-address"),
    pytest.param("RuntimeError: CUDA error: unspecified launch failure", id="launch-failure"),
    pytest.param("RuntimeError: CUDA error: invalid device ordinal", id="invalid-device-ordinal"),
    pytest.param("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda "
                 "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", id="nccl-unhandled-cuda"),
    pytest.param("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
                 "capacity of 79.15 GiB of which 76.10 GiB is free. Process 4242 has 3.05 GiB memory in use.",
                 id="allocation-with-memory-free"),
    pytest.param("RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 39.59 GiB total capacity; "
                 "1.10 GiB already allocated; 37.90 GiB free; 1.20 GiB reserved in total by PyTorch)",
                 id="allocation-with-memory-free-old-format"),
]


def record(node: str = "gpu-1", **fields) -> AttemptRecord:
    return AttemptRecord(**{"job": "j", "attempt": 1, "backend": "kubernetes", "node": node, "exit_code": 1, **fields})


@pytest.mark.parametrize("line", AMBIGUOUS_LINES)
def test_device_or_code_is_a_suspect_node(line):
    verdict = classify(record(log_tail=["Traceback (most recent call last):", line]))
    assert verdict.kind is HW and verdict.reason.startswith("ambiguous:"), verdict
    assert "relocation" in verdict.reason
    assert suspect_node(verdict).kind is VerdictKind.SUSPECT_NODE


@pytest.mark.parametrize("line", AMBIGUOUS_LINES)
def test_the_second_node_decides(line):
    log = ["Traceback (most recent call last):", line]
    first = suspect_node(classify(record(log_tail=log)).model_copy(update={"attempt": 1, "node": "gpu-1"}))
    same = suspect_node(classify(record(node="gpu-2", log_tail=log)).model_copy(update={"attempt": 2,
                                                                                         "node": "gpu-2"}))
    again = diagnose(same, [first], job="j", run_id="r")
    assert again.verdict.kind is INT and again.rule == RELOCATION  # the job's own, one attempt later
    clean = classify(record(node="gpu-2", exit_code=0)).model_copy(update={"attempt": 2, "node": "gpu-2"})
    cleared = diagnose(clean, [first], job="j", run_id="r")
    assert cleared.blamed == "gpu-1" and cleared.rule == RELOCATION  # the first node's


@pytest.mark.parametrize(("fields", "kind"), [
    # an Xid beside it decides: the application's MMU fault is the job's, a hardware Xid the node's
    pytest.param({"node_log": ["NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=python, MMU Fault"]}, INT, id="with-xid31"),
    pytest.param({"node_log": ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."]},
                 HW, id="with-xid79"),
])
def test_an_xid_beside_an_illegal_address_decides(fields, kind):
    verdict = classify(record(log_tail=["RuntimeError: CUDA error: an illegal memory access was encountered"],
                              **fields))
    assert verdict.kind is kind and not verdict.reason.startswith("ambiguous:"), verdict


@pytest.mark.parametrize("line", [
    # the device was full: the job's own (near-misses of the allocation-with-memory-free family)
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
     "79.15 GiB of which 1.10 GiB is free. Including non-PyTorch memory, this process has 78.03 GiB memory in use."),
    ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB "
     "already allocated; 3.19 MiB free; 14.71 GiB reserved in total by PyTorch)"),
    ("RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 23.69 GiB total capacity; 22.1 GiB "
     "already allocated; 700.00 MiB free; 22.5 GiB reserved in total by PyTorch)"),
    "RuntimeError: CUDA error: out of memory",
])
def test_an_allocation_on_a_full_device_is_the_jobs(line):
    verdict = classify(record(log_tail=[line]))
    assert verdict.kind is INT and not verdict.reason.startswith("ambiguous:"), verdict
