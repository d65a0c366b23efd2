"""The layering of STYLE.md, checked on the source: dependencies point one way, Celery lives in
dispatch and tasks modules only, and one module talks to the LLM."""

from __future__ import annotations

import ast
import graphlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = (
    "web",
    "observability",
    "audit",
    "accounts",
    "casehub",
    "planning",
    "oversight",
    "execution",
    "quality",
)
# Worker plumbing that is Celery by nature: the app itself and the heartbeat bootstep.
CELERY_MODULES = {"casehub/celery.py", "execution/bootsteps.py"}
PURE = ("planning.core", "planning.packs")


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative:
                continue
            yield relative, ast.parse(path.read_text(), filename=relative)


def _imports(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def _top(name: str) -> str:
    return name.split(".", 1)[0]


# The stack of STYLE.md, bottom to top: an app imports only itself and the apps below it.
STACK = (
    "web",
    "observability",
    "audit",
    "accounts",
    "planning",
    "oversight",
    "execution",
    "quality",
    "casehub",
)


def module_graph(*packages: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Return each module under the `packages` folders ("planning/core") → the ones it imports.

    Only imports among those modules count, wherever they stand: at the top, in a function, under
    `if TYPE_CHECKING:`. Relative imports are resolved; `from package import name` points at the
    submodule when `name` is one, else at the package.
    """
    paths: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.rsplit(".", node.level - 1)[0]
                    base = f"{anchor}.{base}" if base else anchor
                names = [f"{base}.{alias.name}" for alias in node.names]
            for name in names:
                while name and name not in paths:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    imported.add(name)
        graph[module] = imported
    return graph


def import_cycle(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Return one cycle of `graph` (module → the modules it imports) as [a, b, …, a], or []."""
    try:
        # graphlib reads the mapping as node → predecessors and reports the cycle that way round
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))
    return []


def test_the_module_graph_sees_every_import_and_the_cycle_finder_its_circle(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def late() -> None:\n    from .b import thing\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\nthing = 1\n"
    )
    (package / "c.py").write_text("import pkg.a\nimport os\n")
    graph = module_graph("pkg", root=tmp_path)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    cycle = import_cycle(graph)
    assert len(cycle) == 4 and cycle[0] == cycle[-1]
    assert all(after in graph[before] for before, after in itertools.pairwise(cycle))
    assert import_cycle({"pkg.a": {"pkg.b"}, "pkg.b": set()}) == []


def test_no_import_cycles_in_the_core() -> None:
    cycle = import_cycle(module_graph(*(name.replace(".", "/") for name in PURE)))
    assert cycle == [], " imports ".join(cycle)


def test_apps_import_only_downwards() -> None:
    offenders = [
        f"{path}: {name}"
        for path, tree in _sources()
        for name in _imports(tree)
        if _top(name) in STACK and STACK.index(_top(name)) > STACK.index(_top(path.split("/")[0]))
    ]
    assert offenders == []


def test_the_web_layer_and_observability_import_no_app() -> None:
    """`web` and `observability` sit below every app (any app may import them); `web` is the
    lower of the two. Neither imports an app or the project, even inside a function."""
    allowed = {"web": {"web"}, "observability": {"web", "observability"}}
    project = set(STACK)
    offenders = [
        f"{path}: {name}"
        for path, tree in _sources()
        if _top(path.split("/", 1)[0]) in allowed
        for name in _imports(tree)
        if _top(name) in project and _top(name) not in allowed[path.split("/", 1)[0]]
    ]
    assert offenders == []


def test_no_app_imports_the_project() -> None:
    offenders = [
        f"{path}: {name}"
        for path, tree in _sources()
        if not path.startswith("casehub/")
        for name in _imports(tree)
        if _top(name) == "casehub"
    ]
    assert offenders == []


def test_the_planning_core_and_packs_import_no_app() -> None:
    offenders = [
        f"{path}: {name}"
        for path, tree in _sources()
        if path.startswith(("planning/core/", "planning/packs/"))
        for name in _imports(tree)
        if _top(name) in {"django", "celery", "ninja", "django_htmx"} | (set(STACK) - {"planning"})
        or (
            name.startswith("planning.")
            and not name.startswith(("planning.core", "planning.packs"))
        )
    ]
    assert offenders == []


def test_only_dispatch_and_tasks_modules_know_celery() -> None:
    offenders = []
    for path, tree in _sources():
        if path.endswith(("/dispatch.py", "/tasks.py")) or path in CELERY_MODULES:
            continue
        offenders += [f"{path}: import {name}" for name in _imports(tree) if _top(name) == "celery"]
        offenders += [
            f"{path}:{node.lineno}: .{node.func.attr}()"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"delay", "apply_async", "send_task"}
        ]
    assert offenders == []


def test_tasks_are_sent_by_name_from_dispatch_modules_only() -> None:
    offenders = [
        f"{path}: {name}"
        for path, tree in _sources()
        if path.endswith("/dispatch.py")
        for name in _imports(tree)
        if name.endswith(".tasks")
    ]
    assert offenders == []


def test_one_module_talks_to_the_llm_server() -> None:
    users = sorted(
        path for path, tree in _sources() if any(_top(name) == "openai" for name in _imports(tree))
    )
    assert users == ["planning/core/llm/transport.py"]


def test_no_import_cycles_between_the_modules_of_any_app() -> None:
    cycle = import_cycle(module_graph(*STACK))
    assert cycle == [], " imports ".join(cycle)


def _function_imports(tree: ast.Module) -> Iterator[ast.ImportFrom | ast.Import]:
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom) and any(
                    _top(name) in STACK
                    for name in _imports(ast.Module(body=[node], type_ignores=[]))
                ):
                    yield node


def test_a_project_import_inside_a_function_says_why() -> None:
    """An import of the project placed in a function has a comment saying why (a start-up order
    reason), on its line or above it in its block of imports."""
    offenders = []
    for path, tree in _sources():
        lines = (ROOT / path).read_text().splitlines()
        for node in _function_imports(tree):
            above = node.lineno - 1
            explained = "#" in lines[above]
            while not explained and above > 0:
                above -= 1
                text = lines[above].strip()
                if text.startswith("#"):
                    explained = True
                elif not text.startswith(("from ", "import ")):
                    break
            if not explained:
                offenders.append(f"{path}:{node.lineno}")
    assert offenders == []
