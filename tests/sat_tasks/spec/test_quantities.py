"""The spec's own quantity parser agrees with the kubernetes client's on every form the API grammar allows."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from decimal import Decimal

import pytest
from kubernetes.utils import parse_quantity as client_parse_quantity

from sat_tasks.spec.quantities import QUANTITY_PATTERN, format_bytes, parse_quantity, quantity_bytes

NUMBERS = ("0", "1", "2", "1.5", ".5", "10.", "512", "0.001", "1024", "123456789")
SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
            "e3", "E3", "e-2", "e+1", "E0", "e.5", "e1.5")
GRAMMAR = [n + s for n, s in itertools.product(NUMBERS, SUFFIXES) if re.match(QUANTITY_PATTERN, n + s)]


def test_the_grammar_cases_cover_every_suffix():
    """The comparison below is not vacuous: every suffix kind is in it."""
    assert len(GRAMMAR) > 150
    assert {"1Ki", "1m", "1E", "1e3", "1.5Gi", ".5M"} <= set(GRAMMAR)


@pytest.mark.parametrize("text", GRAMMAR)
def test_every_grammatical_quantity_has_the_clients_value(text):
    try:
        expected = client_parse_quantity(text)
    except ValueError:  # the grammar admits exponents such as e1.5 that neither reads as a number
        with pytest.raises(ValueError):
            parse_quantity(text)
        return
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "Gi", "1ki", "1K", "1Gb", "-", "1 Gi", "abc", "1e", "1.2.3", "0x10", "1Gi ",
                                  "NaN", "Infinity"])
def test_what_is_not_a_quantity_is_refused_with_the_value_named(text):
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


def test_numbers_bytes_and_formatting():
    assert parse_quantity(2) == Decimal(2) and parse_quantity(0.5) == Decimal("0.5")
    assert quantity_bytes("1.5Ki") == 1536 and quantity_bytes("1m") == 1  # rounded up, never smaller
    assert format_bytes(520 * 2**30) == "520Gi" and format_bytes(1000) == "1000"


def test_the_spec_layer_parses_quantities_without_importing_the_kubernetes_client():
    code = ("import sys; from sat_tasks.spec.quantities import parse_quantity; "
            "assert parse_quantity('2Gi') == 2**31; print(sorted(m for m in sys.modules if m.startswith('kubernetes')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
