"""The metrics sidecar's output is the job log's: its own lines, not botocore's credential chatter (issue 45.6)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

SCRIPT = textwrap.dedent("""
    import logging, sys
    {setup}
    import boto3
    boto3.session.Session().get_credentials()  # resolving them is what logs the line
    logging.getLogger("ckpt_engine.metrics.sidecar").info("sidecar: uploaded 3 series files")
""")


def _stderr(setup: str) -> str:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "AKIATESTTESTTESTTEST", "AWS_SECRET_ACCESS_KEY": "t" * 40,
           "PYTHONPATH": str(ROOT)}
    env.pop("AWS_PROFILE", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(setup=setup)], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stderr


def test_the_sidecars_logging_leaves_out_botocores_credential_line():
    plain = _stderr('logging.basicConfig(level=logging.INFO, format="%(message)s")')  # what it did before
    assert "Found credentials in environment variables." in plain, plain  # the line this test is about
    quiet = _stderr("from ckpt_engine.metrics.sidecar import configure_logging; configure_logging()")
    assert "Found credentials" not in quiet and "sidecar: uploaded 3 series files" in quiet, quiet
    assert "AKIATESTTESTTESTTEST" not in quiet + plain
