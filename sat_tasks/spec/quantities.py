"""Kubernetes quantities (`500m`, `1.5`, `2Gi`, `512M`): the API's grammar and its value, from the standard library only.

The spec layer imports no Kubernetes client (import-linter's "the job model ... imports no
Airflow, Kubernetes client or torch"): `import kubernetes` costs ~0.9 s, which `sat validate`
and every DAG parse would pay, and loading one file of that package by its path (what this
module did before) is the same import in disguise. A quantity is a small, fixed grammar
(the `Quantity` schema of the Kubernetes OpenAPI spec, apimachinery's `resource.Quantity`),
so the spec parses it here: `QUANTITY_PATTERN` decides what is a quantity and `parse_quantity`
computes its value. tests/sat_tasks/spec/test_quantities.py holds both against the
kubernetes client's own `kubernetes.utils.parse_quantity` on every form the grammar allows,
so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

# A Kubernetes quantity as the API's OpenAPI schema describes it, without a sign (SAT's
# quantities are amounts of something): number, then a binary or decimal suffix or exponent.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
#: Each suffix's factor: powers of 1024 for the binary ones, of 1000 for the decimal ones.
_FACTORS: dict[str, Decimal] = {
    **{suffix: Decimal(size) for suffix, size in _BINARY},
    **{suffix: Decimal(1000) ** power for suffix, power in
       (("n", -3), ("u", -2), ("m", -1), ("k", 1), ("M", 2), ("G", 3), ("T", 4), ("P", 5), ("E", 6))},
}
_QUANTITY = re.compile(r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>[KMGTPE]i|[numkMGTPE])?$")


def parse_quantity(value: str | float | Decimal) -> Decimal:
    """The quantity's value (cores, bytes); ValueError naming the value when it is not a Kubernetes quantity.

    Numbers are taken as they are; text is a decimal number with an optional binary
    (`Ki`..`Ei`) or decimal (`n`, `u`, `m`, `k`, `M`..`E`) suffix, or a decimal exponent
    (`1e3`), as the Kubernetes API reads it.
    """
    if isinstance(value, bool):  # a validator's error: pydantic reports ValueErrors with the field's rule
        raise ValueError(f"{value!r} is not a Kubernetes quantity")  # noqa: TRY004
    if isinstance(value, (int, float, Decimal)):
        return Decimal(value)
    text = str(value)
    match = _QUANTITY.match(text)
    if match is None:
        try:  # a plain number with an exponent (1e3, 2.5E-1): what Decimal reads
            if re.fullmatch(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][+-]?[0-9.]+", text):
                return Decimal(text)
        except InvalidOperation:
            pass
        raise ValueError(f"{text!r} is not a Kubernetes quantity (a number with an optional suffix such as 500m or 2Gi)")
    number = Decimal(match.group("number"))
    suffix = match.group("suffix")
    return number * _FACTORS[suffix] if suffix else number


def quantity_bytes(value: str) -> int:
    """A memory quantity in whole bytes (rounded up: a limit is never made smaller)."""
    return math.ceil(parse_quantity(value))


def format_bytes(value: int) -> str:
    """Bytes as the largest binary suffix that divides them (`520Gi`), else the plain number."""
    for suffix, size in _BINARY:
        if value and value % size == 0:
            return f"{value // size}{suffix}"
    return str(value)
