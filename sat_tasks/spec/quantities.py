"""Kubernetes quantities (`500m`, `1.5`, `2Gi`, `512M`), parsed by the kubernetes client's own `parse_quantity`.

`import kubernetes` costs ~0.9 s (the whole generated client), which `sat validate` must
not pay. `kubernetes/utils/quantity.py` needs only `decimal`, so when the package is not
imported yet its file is loaded on its own: the same function, without the package's
`__init__`. Once `kubernetes` is imported (a DAG task on the kubernetes backend), its
module is used directly.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Callable

# A Kubernetes quantity as the API's OpenAPI schema describes it, without a sign (SAT's
# quantities are amounts of something): number, then a binary or decimal suffix or exponent.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


@lru_cache(maxsize=1)
def _parser() -> Callable[[str], Decimal]:
    loaded = sys.modules.get("kubernetes.utils.quantity")
    if loaded is not None:
        return loaded.parse_quantity
    spec = importlib.util.find_spec("kubernetes")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the kubernetes client is not installed (pip install kubernetes)")
    path = Path(next(iter(spec.submodule_search_locations))) / "utils" / "quantity.py"
    module_spec = importlib.util.spec_from_file_location("sat_tasks.spec._kubernetes_quantity", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.parse_quantity


def parse_quantity(value: str | int | float) -> Decimal:
    """The quantity's value (cores, bytes); ValueError when it is not a Kubernetes quantity."""
    return _parser()(value)


def quantity_bytes(value: str) -> int:
    """A memory quantity in whole bytes (rounded up: a limit is never made smaller)."""
    return int(math.ceil(parse_quantity(value)))


def format_bytes(value: int) -> str:
    """Bytes as the largest binary suffix that divides them (`520Gi`), else the plain number."""
    for suffix, size in _BINARY:
        if value and value % size == 0:
            return f"{value // size}{suffix}"
    return str(value)
