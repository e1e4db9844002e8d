"""The import contracts with the backends found through the `sat.backends` entry point group, then checked.

`pyproject.toml`'s `[tool.importlinter]` names the built-in backends (`local | kubernetes`); a
backend another distribution installs would go unchecked there. This reads those contracts,
puts every installed backend under `sat_tasks.backends` into the "independent of one another"
layer, gives every backend from another package a contract of its own (it imports no other
backend and nothing above `sat_tasks.backends`), and runs `lint-imports` on the result:

    python -m tests.support.import_contracts      # what `make lint` and tests/test_architecture.py run
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

GROUP = "sat.backends"
BACKENDS_PACKAGE = "sat_tasks.backends"
# The layers above the backends (pyproject's first contract): a backend imports none of them.
_ABOVE_BACKENDS = ["sat_tasks.testing", "sat_tasks.cli", "sat_tasks.service", "sat_tasks.ui", "sat_tasks.airflow",
                   "sat_tasks.pipeline"]


def installed_backend_modules(found: Iterable[tuple[str, str]] | None = None) -> dict[str, str]:
    """`{name: the package its BACKEND lives in}` for every `sat.backends` entry point (`found`: name, value)."""
    pairs = found if found is not None else ((e.name, e.value) for e in entry_points(group=GROUP))
    return {name: value.split(":", 1)[0] for name, value in pairs}


def contracts_config(pyproject: Mapping[str, Any], backends: Mapping[str, str]) -> str:
    """The `.importlinter` (INI) text: pyproject's contracts with `backends` (name -> package) filled in."""
    linter = dict(pyproject["tool"]["importlinter"])
    contracts = [dict(c) for c in linter.pop("contracts")]
    roots = list(linter.pop("root_packages"))
    inside = sorted(p.removeprefix(BACKENDS_PACKAGE + ".") for p in backends.values()
                    if p.startswith(BACKENDS_PACKAGE + ".") and p.count(".") == 2)
    outside = sorted({p.split(".")[0] for p in backends.values() if not p.startswith(BACKENDS_PACKAGE + ".")})
    seam = [c for c in contracts if c.get("containers") == [BACKENDS_PACKAGE]]
    if len(seam) != 1:
        raise SystemExit(f"pyproject.toml: expected one layers contract with containers = [{BACKENDS_PACKAGE!r}]")
    seam[0]["layers"] = [" | ".join(inside), *seam[0]["layers"][1:]]
    for package in outside:
        roots.append(package)
        contracts.append({
            "name": f"backend {package}: imports no other backend and nothing above sat_tasks.backends",
            "type": "forbidden", "source_modules": [package],
            "forbidden_modules": [*(f"{BACKENDS_PACKAGE}.{name}" for name in inside), *_ABOVE_BACKENDS],
        })
    lines = ["[importlinter]", _ini("root_packages", roots)]
    lines += [_ini(key, value) for key, value in linter.items()]
    for number, contract in enumerate(contracts, start=1):
        lines += ["", f"[importlinter:contract:{number}]"] + [_ini(k, v) for k, v in contract.items()]
    return "\n".join(lines) + "\n"


def _ini(key: str, value: Any) -> str:
    if isinstance(value, list):
        return f"{key} =\n" + "\n".join(f"    {item}" for item in value)
    if isinstance(value, bool):
        return f"{key} = {'True' if value else 'False'}"
    return f"{key} = {value}"


def check(backends: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `lint-imports` on the contracts with the installed backends; its completed process."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    text = contracts_config(pyproject, backends if backends is not None else installed_backend_modules())
    with tempfile.NamedTemporaryFile("w", suffix=".importlinter", delete=False) as config:
        config.write(text)
    try:
        return subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache", config.name],
                              cwd=REPO, capture_output=True, text=True, check=False)
    finally:
        Path(config.name).unlink(missing_ok=True)


if __name__ == "__main__":
    result = check()
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    sys.exit(result.returncode)
