"""The layout holds: import contracts (import-linter), no branching on a backend's kind, a quick command line."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sat_tasks.spec.model import installed_backends
from tests.support import import_contracts
from tests.support.paths import REPO

BIN = Path(sys.executable).parent


def test_import_contracts_are_kept():
    """pyproject.toml's [tool.importlinter] contracts, with every installed backend: layers point down, no circles."""
    result = import_contracts.check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and " KEPT" in result.stdout


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_backends_contract_takes_its_backends_from_the_entry_points():
    """A third backend, in this package or another distribution's, is checked without editing pyproject.toml."""
    found = import_contracts.installed_backend_modules([
        ("local", "sat_tasks.backends.local:BACKEND"), ("kubernetes", "sat_tasks.backends.kubernetes:BACKEND"),
        ("slurm", "sat_tasks.backends.slurm:BACKEND"), ("ray", "acme_ray.backend:BACKEND")])
    text = import_contracts.contracts_config(_pyproject(), found)
    assert "    kubernetes | local | slurm\n    launch\n    base" in text
    assert "root_packages =\n    sat_tasks\n    ckpt_engine\n    acme_ray\n" in text
    forbidden = text[text.index("name = backend acme_ray"):]
    for module in ("sat_tasks.backends.local", "sat_tasks.backends.kubernetes", "sat_tasks.backends.slurm",
                   "sat_tasks.pipeline", "sat_tasks.airflow", "sat_tasks.ui"):
        assert f"    {module}\n" in forbidden
    installed = import_contracts.installed_backend_modules()
    assert set(installed) == set(installed_backends())


def test_the_kubernetes_layers_name_every_module_of_the_backend():
    """A module the layers contract omits is checked by nothing: each one is in a layer."""
    contract = next(c for c in _pyproject()["tool"]["importlinter"]["contracts"]
                    if c.get("containers") == ["sat_tasks.backends.kubernetes"])
    named = {m.strip() for layer in contract["layers"] for m in layer.split("|")}
    modules = {p.stem for p in (REPO / "sat_tasks/backends/kubernetes").glob("*.py") if p.stem != "__init__"}
    assert modules == named


# Outside `sat_tasks/backends/` nothing asks which backend it is on: it asks the backend's
# `capabilities` (ADR 0010). Every package is scanned: sat_tasks' own (all but backends/,
# and its top-level modules), the DAG files and the plugins.
_INSTALLED = "|".join(installed_backends())
# A comparison with, or a branch on, one backend's name or member.
_BRANCH = re.compile(rf"BackendKind\.[A-Z][A-Z0-9_]*\b|Backend\.(LOCAL|KUBERNETES)|[=!]=\s*[\"']({_INSTALLED})[\"']"
                     rf"|[\"']({_INSTALLED})[\"']\s*[=!]=|\bin\s*[(\[{{]\s*[\"']({_INSTALLED})[\"']")
# An import of one backend's package (not of `sat_tasks.backends` or its `base`).
_NAMED_IMPORT = re.compile(rf"^\s*(from|import)\s+sat_tasks\.backends\.({_INSTALLED})\b")
# Commands whose output is one backend's own format: `sat render` prints a Kubernetes job's
# manifests, `sat workspace render` a workspace's Kueue objects and the warm pool's PriorityClass.
_RENDERS_FOR_ONE_BACKEND = {"sat_tasks/cli/render.py", "sat_tasks/cli/workspace.py"}
# The host's container tooling (the project's podman configuration and the training image's name) lives with
# the local backend that runs attempts in it; `sat up` also uses it, whatever the backend, to run its embedded
# registry and push the training image there (ADR 0042). Only those two modules, and only from these files.
_HOST_CONTAINER_TOOLING = re.compile(r"^\s*from\s+sat_tasks\.backends\.local\.(containers|image_build)\s+import\b")
_USES_HOST_CONTAINER_TOOLING = {"sat_tasks/cli/up.py", "sat_tasks/service/registry.py", "sat_tasks/service/stack.py"}
_OUTSIDE_BACKENDS = [
    *sorted(f"sat_tasks/{p.name}" for p in (REPO / "sat_tasks").iterdir()
            if (p / "__init__.py").exists() and p.name != "backends"),
    "sat_tasks/*.py", "dags", "plugins",
]


def _python_files(package: str) -> list[Path]:
    if package.endswith("/*.py"):
        return sorted((REPO / package).parent.glob("*.py"))
    return sorted((REPO / package).rglob("*.py"))


def _lines(package: str):
    for path in _python_files(package):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            yield path.relative_to(REPO).as_posix(), number, line


@pytest.mark.parametrize("package", _OUTSIDE_BACKENDS)
def test_nothing_outside_the_backends_branches_on_one(package):
    found = [f"{path}:{number}: {line.strip()}" for path, number, line in _lines(package) if _BRANCH.search(line)]
    assert found == []


@pytest.mark.parametrize("package", _OUTSIDE_BACKENDS)
def test_nothing_outside_the_backends_imports_one_by_name(package):
    """The backends are reached through `get_backend`/`backend_for`; only the renderers of one backend's format import it."""
    found = [f"{path}:{number}: {line.strip()}" for path, number, line in _lines(package)
             if _NAMED_IMPORT.search(line) and path not in _RENDERS_FOR_ONE_BACKEND
             and not (path in _USES_HOST_CONTAINER_TOOLING and _HOST_CONTAINER_TOOLING.search(line))]
    assert found == []


def test_the_guard_scans_every_package_outside_the_backends():
    """A new package under sat_tasks is scanned without editing the list; the backends are not."""
    scanned = {path for package in _OUTSIDE_BACKENDS for path in _python_files(package)}
    assert REPO / "sat_tasks/pipeline/steps.py" in scanned and REPO / "sat_tasks/config.py" in scanned
    assert REPO / "sat_tasks/ui/app.py" in scanned and REPO / "dags/sat_jobs_00.py" in scanned
    assert not any(path.is_relative_to(REPO / "sat_tasks/backends") for path in scanned)


@pytest.mark.parametrize("line", [
    pytest.param("if job.backend is BackendKind.KUBERNETES:", id="member"),
    pytest.param("if job.backend is BackendKind.LOCAL:", id="member-local"),
    pytest.param('if kind == "kubernetes":', id="equals"),
    pytest.param("if 'local' != backend:", id="reversed"),
    pytest.param('if backend in ("local", "other"):', id="in-tuple"),
])
def test_the_branch_pattern_finds_a_branch(line):
    """The check above can fail: it sees the shapes a branch on the backend takes."""
    assert _BRANCH.search(line)


@pytest.mark.parametrize("line", [
    pytest.param("backend_for(job).stage(run, log)", id="protocol-call"),
    pytest.param("if backend_for(job).capabilities.watches_stop_request:", id="capability"),
    pytest.param("BackendKind(sat_setting('backend'))", id="by-value"),
])
def test_the_branch_pattern_lets_the_protocol_be(line):
    assert not _BRANCH.search(line)


def test_the_import_pattern_finds_a_named_backend():
    assert _NAMED_IMPORT.search("    from sat_tasks.backends.kubernetes.workspace import pool_name")
    assert _NAMED_IMPORT.search("import sat_tasks.backends.local.runner")
    assert not _NAMED_IMPORT.search("from sat_tasks.backends.base import workspace_pool_name")
    assert not _NAMED_IMPORT.search("from sat_tasks.backends import backend_for")


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
        imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}  # noqa: RUF012

        def find_modules_directly_imported_by(self, module):
            return self.imports[module]

    assert _cycles(Graph(), {"a", "b", "c", "d"}) == [["a", "b", "c"]]


# ckpt_engine/contract.py is the one home of the environment variables and file names the
# orchestrator and the training container share (ADR 0018): anywhere else they are its
# constants, so renaming one is one edit the type checker follows. Docstrings and comments
# may name them; a string literal (a key, a path, a message) may not, except where a place
# below says why it must.
def _contract_names() -> list[str]:
    from ckpt_engine import contract

    return sorted({value for name, value in vars(contract).items() if isinstance(value, str)
                   and (name.endswith(("_ENV", "_NAME")) or name == "CONCURRENT_DIR")}, key=len, reverse=True)


_CONTRACT_NAME = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, _contract_names())) + r")(?![\w-])")
_MAY_SPELL_CONTRACT_NAMES = {
    # The pod's PID-1 shell script and its start-up probe are shell: they read the environment by name.
    "sat_tasks/backends/kubernetes/supervisor.py": {"SAT_ATTEMPT", "SAT_JOB_NAME", "SAT_NODE", "SAT_CODE_DIR",
                                                    "SAT_METRICS_DIR", "SAT_METRICS_SIDECAR"},
}


def _string_literals(source: str):
    """(line, text) of every string constant of a module but its docstrings (f-strings' literal parts included)."""
    import ast

    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def _contract_names_spelt(source: str) -> list[tuple[int, str]]:
    return [(line, name) for line, text in _string_literals(source) for name in _CONTRACT_NAME.findall(text)]


@pytest.mark.parametrize("package", ["sat_tasks", "ckpt_engine"])
def test_the_runtime_contracts_names_are_spelt_only_in_the_contract(package):
    found = []
    for path in _python_files(package):
        relative = path.relative_to(REPO).as_posix()
        if relative == "ckpt_engine/contract.py":
            continue
        allowed = _MAY_SPELL_CONTRACT_NAMES.get(relative, set())
        found += [f"{relative}:{line}: {name!r} (use ckpt_engine.contract's constant)"
                  for line, name in _contract_names_spelt(path.read_text()) if name not in allowed]
    assert found == []


@pytest.mark.parametrize("source, names", [
    pytest.param('env["SAT_RUN_ID"] = run_id\n', ["SAT_RUN_ID"], id="env-key"),
    pytest.param('uri = f"{prefix}checkpoint-{step}/manifest.json"\n', ["manifest.json"], id="f-string-path"),
    pytest.param('glob("*/progress.json")\n', ["progress.json"], id="glob"),
    pytest.param("log(f'expected SAT_MAX_STEPS={steps}')\n", ["SAT_MAX_STEPS"], id="message"),
    pytest.param('x = "${SAT_OUTPUT_DIR}/concurrent_checkpoint"\n', ["SAT_OUTPUT_DIR", "concurrent_checkpoint"],
                 id="shell"),
    pytest.param('"""Reads progress.json (SAT_ATTEMPT)."""\nx = 1  # manifest.json\n', [], id="docstring-comment"),
    pytest.param('x = "SAT_RUN_IDS", "my_progress.json", "status.jsonl", "x.job.log"\n', [], id="longer-names"),
])
def test_the_contract_name_guard_finds_a_planted_literal(source, names):
    """The check above can fail: a planted literal is found, prose outside literals and longer names are not."""
    assert [name for _, name in _contract_names_spelt(source)] == names


# ---- the view's URLs: paths under /sat, never the router's names ------------------------------------------
URL_FOR = re.compile(r"\burl_for\(")


def test_the_view_never_builds_a_url_from_a_route_name():
    """Inside Airflow the view is one opaque ASGI app (`LazyApp`) mounted at /sat: `url_for` cannot find its
    routes there (NoMatchFound, a 500 that the view's own TestClient apps never showed). Paths are spelt."""
    view = REPO / "sat_tasks" / "ui"
    offenders = [str(path.relative_to(REPO)) for path in sorted(view.rglob("*"))
                 if path.suffix in {".py", ".html"} and URL_FOR.search(path.read_text())]
    assert offenders == []


def test_the_url_for_guard_finds_a_template_call():
    assert URL_FOR.search("""action="{{ url_for('release_node_form', node=h.node) }}">""")
    assert not URL_FOR.search("action=\"/sat/nodes/{{ h.node | urlencode }}/release\"")


# ---- one root for SAT's own errors (issue 46 item 4) ---------------------------------------------
# Exceptions outside SatError, each with why: they stand for something that is not SAT's error.
_NOT_SAT_ERRORS = {
    "RehearsedUserError": "the user's own exception a rehearsal raises inside the training (not SAT's)",
    "JobCheckFailed": "a pytest assertion of the user's CI test (`sat test`): pytest reports AssertionErrors",
}


def test_every_error_sat_raises_on_purpose_is_a_sat_error():
    import ast
    import importlib

    from sat_tasks.errors import SatError

    outside = {}
    for path in sorted((REPO / "sat_tasks").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id in {"Exception", "ValueError", "RuntimeError", "KeyError",
                                                         "LookupError", "OSError", "TypeError", "AssertionError"}
                    for b in node.bases):
                outside[node.name] = module
    assert outside, "the scan found no exception class: its pattern is wrong"
    for name, module in outside.items():
        if name in _NOT_SAT_ERRORS or name.startswith("_") or module.endswith("sitecustomize"):
            continue  # a module's private signal between its own functions never reaches a caller
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, SatError), f"{module}.{name} is not a SatError: subclass it, or list it with why"
