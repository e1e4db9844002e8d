"""The layout holds: import contracts (import-linter), no branching on a backend's kind, a quick command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

BIN = Path(sys.executable).parent


def test_import_contracts_are_kept():
    """pyproject.toml's [tool.importlinter] contracts: layers point down, no circles, no Airflow where none belongs."""
    result = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=REPO, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and " KEPT" in result.stdout


# A comparison with, or a branch on, one backend's kind: what the DAG factory and the task
# functions must not do (they ask the Backend protocol instead).
_BRANCH = re.compile(r"BackendKind\.(LOCAL|KUBERNETES)|Backend\.(LOCAL|KUBERNETES)|[=!]=\s*[\"'](local|kubernetes)[\"']")


@pytest.mark.parametrize("package", ["sat_tasks/airflow", "sat_tasks/pipeline", "dags"])
def test_dag_factory_and_task_functions_never_branch_on_the_backend(package):
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in sorted((REPO / package).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), start=1) if _BRANCH.search(line)]
    assert found == []


def test_the_branch_pattern_finds_a_branch():
    """The check above can fail: it sees the shapes a branch on the backend takes."""
    assert _BRANCH.search("if job.backend is BackendKind.KUBERNETES:")
    assert _BRANCH.search('if kind == "kubernetes":')
    assert not _BRANCH.search("backend_for(job).stage(run, log)")


COMMANDS = {
    "validate": ["validate", "include/jobs/tiny-llama-demo.yaml"],
    "schema": ["schema"],
    "render": ["render", "include/jobs/tiny-llama-demo.yaml"],
    "classify": ["classify", "tests/sat_tasks/fixtures/attempts/k8s-xid79-fallen-off-bus/pod.json"],
    "ckpt-ls": ["ckpt", "ls", "include"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_quick_commands_import_neither_torch_nor_airflow(command):
    """`python -X importtime` lists every module a command imports: none is torch, Airflow or the
    kubernetes client (0.8 s alone; `sat render` builds manifests as the API's JSON)."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "sat_tasks.cli", *COMMANDS[command]],
                            cwd=REPO, capture_output=True, text=True, check=False)
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "sat_tasks.cli" in imported, result.stderr[-2000:]  # the trace is there
    assert result.returncode in (0, 2), result.stdout + result.stderr[-2000:]
    heavy = sorted(m for m in imported if m.split(".")[0] in ("torch", "airflow", "transformers", "deepspeed", "kubernetes"))
    assert heavy == []


def _cycles(graph, modules) -> list[list[str]]:
    """Strongly connected groups of more than one module (each an import circle)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in modules:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_circles_anywhere():
    """Not only between layers: no two modules of sat_tasks or ckpt_engine import each other, even lazily."""
    import grimp

    graph = grimp.build_graph("sat_tasks", "ckpt_engine", exclude_type_checking_imports=True)
    assert _cycles(graph, set(graph.modules)) == []


def test_the_circle_check_finds_a_circle():
    class Graph:
        imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, module):
            return self.imports[module]

    assert _cycles(Graph(), {"a", "b", "c", "d"}) == [["a", "b", "c"]]
