"""The layering of STYLE.md, checked on the source: dependencies point one way, Celery lives in
dispatch and tasks modules only, and one module talks to the LLM."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("web", "observability", "audit", "accounts", "casehub", "planning", "oversight", "quality")
# Worker plumbing that is Celery by nature: the app itself and the heartbeat bootstep.
CELERY_MODULES = {"casehub/celery.py", "oversight/worker.py"}
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
STACK = ("web", "observability", "audit", "accounts", "planning", "oversight", "quality", "casehub")


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
    assert users == ["planning/core/llm/client.py"]
