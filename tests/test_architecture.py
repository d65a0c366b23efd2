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


def _private_imports(tree: ast.Module) -> Iterator[str]:
    """The `_private` names a module takes from another module of the project."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or _top(node.module or "") in STACK):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield f"{node.module}.{alias.name}"


def test_no_module_imports_a_private_name_of_another() -> None:
    offenders = [f"{path}: {name}" for path, tree in _sources() for name in _private_imports(tree)]
    assert offenders == []


def test_the_private_import_finder_finds_one() -> None:
    tree = ast.parse(
        "from execution.claiming import _claim_data, claim_leaf\n"
        "from .runners import _schemas\n"
        "from os import _exit\n"
        "from typing import __all__\n"
    )
    assert list(_private_imports(tree)) == ["execution.claiming._claim_data", "runners._schemas"]


# A module a reader can hold in mind: 800 lines at most, in every app (casehub_verify.py, not an
# app, is one file on purpose: an auditor reads and runs it alone).
MAX_MODULE_LINES = 800


def test_no_module_is_over_800_lines() -> None:
    long = {
        path: lines
        for path, _ in _sources()
        if (lines := len((ROOT / path).read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


# State machines ----------------------------------------------------------------------------------

# The status fields that are state machines (STYLE.md "State machines"), by model. Each has one
# table and its move functions in a transition module; only those modules assign the field.
STATE_MACHINES = {"WorkItem", "Gate", "Case", "PlanNode"}
TRANSITION_MODULES = {
    "audit/transitions.py",
    "execution/transitions.py",
    "oversight/transitions.py",
    "planning/transitions.py",
}
# What a receiver's type is told by, when it is not a model's name itself: the element of these.
_ELEMENT_OF = {"list", "sorted", "reversed", "tuple", "set", "next", "iter", "cast"}


def _annotation_names(node: ast.expr | None) -> set[str]:
    """Return the class names an annotation names (`Gate | None`, `"Case"`, `list[WorkItem]`)."""
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _annotation_names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


class _Types:
    """What the source tells of a name's type, read the simple ways (no inference engine).

    A name is typed by its annotation as a parameter; by the root of what is assigned to it
    (`Case.objects.get(...)` is a Case; `_load(...)` is what `_load` is annotated to return;
    `list(Gate.objects...)` and `for gate in ...` are Gates); `self` by its class. A name the
    source does not type this way has no types: its status writes count as writes to the four.
    """

    def __init__(self, tree: ast.Module) -> None:
        self.parents = {
            child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)
        }
        self.returns = {
            node.name: _annotation_names(node.returns)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }

    def _scopes(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
                yield node

    def of(self, expr: ast.expr, seen: frozenset[str] = frozenset()) -> set[str]:
        """Return the class names `expr` may be an instance (or a query) of; empty: unknown."""
        while isinstance(expr, ast.Call | ast.Attribute | ast.Subscript):
            if isinstance(expr, ast.Call):
                if isinstance(expr.func, ast.Name) and expr.func.id in _ELEMENT_OF and expr.args:
                    expr = expr.args[-1] if expr.func.id == "cast" else expr.args[0]
                    continue
                if isinstance(expr.func, ast.Name) and expr.func.id in self.returns:
                    return self.returns[expr.func.id]
                expr = expr.func
            else:
                expr = expr.value
        if not isinstance(expr, ast.Name) or expr.id in seen:
            return set()
        name = expr.id
        if name[:1].isupper():
            return {name}
        for scope in self._scopes(expr):
            if name == "self" and isinstance(scope, ast.ClassDef):
                return {scope.name}
            if name == "self":
                continue
            if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = scope.args
                for parameter in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                    if parameter.arg == name:
                        return _annotation_names(parameter.annotation)
            found: set[str] = set()
            for node in ast.walk(scope):
                value: ast.expr | None = None
                if isinstance(node, ast.Assign) and any(
                    name in {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
                    for t in node.targets
                ):
                    value = node.value
                elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and (
                    isinstance(node.target, ast.Name) and node.target.id == name
                ):
                    found |= _annotation_names(getattr(node, "annotation", None))
                    value = node.value
                elif isinstance(node, ast.For | ast.comprehension) and name in {
                    n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)
                }:
                    value = node.iter
                if value is not None:
                    found |= self.of(value, seen | {name})
            if found:
                return found
        return set()


def _names_status(node: ast.expr) -> bool:
    """Tell whether an expression is the field name "status" or a literal list or dict with it."""
    if isinstance(node, ast.Constant):
        return node.value == "status"
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return any(_names_status(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(k is not None and _names_status(k) for k in node.keys)
    return False


def status_writes(path: str, tree: ast.Module, models: set[str]) -> Iterator[str]:
    """Yield each place that assigns the status field of one of `models` (or of a receiver the
    source does not type): `x.status = …`, `setattr(x, "status", …)`, `.update(status=…)` (also
    as a literal `**{"status": …}`), `.update_or_create(defaults={"status": …})`,
    `.save(update_fields=[…"status"…])`, `bulk_update(…, ["status"])`.

    Allowed, and so not yielded: filters (`filter(status=…)` reads), and creating a row in its
    first status (`objects.create(status=…)`, a constructor, `bulk_create`,
    `get_or_create(defaults=…)`): a new row does not move from a status, so there is no pair to
    check, and the event that creates it (`oversight.gate.opened`, `planning.case.submitted`…)
    audits it. Not seen: a mapping unpacked from a name (`update(**changes)`) and raw SQL; the
    source has none that sets a status.
    """
    types = _Types(tree)
    for node in ast.walk(tree):
        found = _status_write(node)
        if found is not None:
            receiver, what = found
            types_of = types.of(receiver)
            if not types_of or types_of & models:
                yield f"{path}:{node.lineno}: {what}"


def _status_write(node: ast.AST) -> tuple[ast.expr, str] | None:
    """Return the receiver of a status write at `node` and how it reads, or None."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = [t for target in node.targets for t in ast.walk(target)]
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    for target in targets:
        if (
            isinstance(target, ast.Attribute)
            and target.attr == "status"
            and isinstance(target.ctx, ast.Store)
        ):
            return target.value, f"{ast.unparse(target)} = …"
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    keywords = {k.arg: k.value for k in node.keywords}
    if isinstance(func, ast.Name):
        if func.id == "setattr" and len(node.args) >= 2 and _names_status(node.args[1]):
            return node.args[0], "setattr(…, 'status', …)"
        return None
    if not isinstance(func, ast.Attribute):
        return None
    receiver = func.value
    if func.attr == "update" and (
        "status" in keywords or any(k.arg is None and _names_status(k.value) for k in node.keywords)
    ):
        return receiver, f"{ast.unparse(receiver)[:60]}.update(status=…)"
    if func.attr == "save" and _names_status(keywords.get("update_fields", ast.List([]))):
        return receiver, f"{ast.unparse(receiver)}.save(update_fields=[…'status'…])"
    if func.attr == "update_or_create" and _names_status(keywords.get("defaults", ast.Dict())):
        return receiver, "update_or_create(defaults={'status': …})"
    fields = [*node.args[1:2], keywords.get("fields", ast.List([]))]
    if func.attr == "bulk_update" and any(_names_status(arg) for arg in fields):
        return receiver, "bulk_update(…, ['status'])"
    return None


def test_only_the_transition_modules_assign_a_state_machine_s_status() -> None:
    """Each state machine's status moves only through its transition functions (STYLE.md),
    which check the move against the field's table and audit it; other models' status fields
    (promoted methods, policy versions, two-person requests) are not state machines here."""
    offenders = [
        write
        for path, tree in _sources()
        if path not in TRANSITION_MODULES
        for write in status_writes(path, tree, STATE_MACHINES)
    ]
    assert offenders == [], "move these through their transition functions:\n" + "\n".join(
        offenders
    )


def test_the_status_write_finder_finds_each_kind_of_write() -> None:
    source = """
from execution.models import WorkItem

def close(item: WorkItem, items, method: PromotedMethod) -> None:
    item.status = "cancelled"
    item.save(update_fields=["status", "output"])
    WorkItem.objects.filter(pk=1).update(status="cancelled")
    WorkItem.objects.filter(pk=1).update(**{"status": "cancelled"})
    setattr(item, "status", "open")
    WorkItem.objects.bulk_update([item], ["status"])
    items.update(status="open")
    method.status = "retired"
    WorkItem.objects.filter(status="open").update(output=None)
    WorkItem.objects.create(status="open")
    WorkItem.objects.update_or_create(pk=1, defaults={"status": "open"})
    for other in WorkItem.objects.all():
        other.status = "open"
    row = _get()
    row.status = "open"

def _get() -> PromotedMethod: ...
"""
    found = [
        line.split(": ", 1)[0] for line in status_writes("x.py", ast.parse(source), {"WorkItem"})
    ]
    # Lines 5-11 write a work item's status (11: a query of unknown type), so do 15 and 17 (in a
    # loop); a promoted method's (12, 19), a filter (13) and a creation (14) are not writes.
    assert found == [f"x.py:{n}" for n in (5, 6, 7, 8, 9, 10, 11, 15, 17)]
