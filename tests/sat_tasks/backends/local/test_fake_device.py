"""What an injected Xid leaves on the node's fake device for its health check (ADR 0004, NVIDIA's catalogue)."""

from __future__ import annotations

import json

import pytest

from sat_tasks.backends.local.runner import write_fake_device
from sat_tasks.io.node_probe import FAKE_DEVICE_FILE


@pytest.mark.parametrize(("xid", "ecc", "kernel_ok"), [
    pytest.param(48, 1, True, id="48-double-bit-ecc"),
    pytest.param(171, 1, True, id="171-uncorrectable-dram"),
    pytest.param(172, 1, True, id="172-uncorrectable-sram"),
    pytest.param(79, 0, False, id="79-off-the-bus"),
    pytest.param(143, 0, False, id="143-gpu-init-error"),
    pytest.param(13, 0, True, id="13-warp-exception-clean"),
    pytest.param(94, 0, True, id="94-contained-ecc-relocates"),
])
def test_an_injected_xid_leaves_what_the_catalogue_says_on_the_device(tmp_path, xid, ecc, kernel_ok):
    write_fake_device(tmp_path, xid)
    (device,) = json.loads((tmp_path / FAKE_DEVICE_FILE).read_text())["devices"]
    assert (device["ecc_uncorrected_volatile"], device["kernel_ok"]) == (ecc, kernel_ok)
