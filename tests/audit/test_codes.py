"""Every audit event code the source writes is in the registry (`audit.codes`), and every code
in the registry is written somewhere.

The source of every app is read with `ast`: each `append_event(...)` and `NewEvent(...)` names its
code as a literal, a module constant (of its own module or imported), a dict of literals indexed,
or a parameter of the function around it. A parameter is followed to every call of that function
(across modules, through imports) and the argument each passes is resolved the same way, so a
helper that takes a code (`_deny(user, gate, "oversight.gate.decision_denied", why)`) is checked
at the places that choose the code. Anything else (an f-string, a value computed at run time)
fails with the file and line: write the codes out so that they can be checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from audit import codes

ROOT = Path(__file__).resolve().parent.parent.parent
APPS = (
    "casehub",
    "planning",
    "oversight",
    "audit",
    "accounts",
    "execution",
    "quality",
    "observability",
    "web",
)
# The functions that take an event's code first (or as `action=`).
WRITERS = {"append_event", "NewEvent"}
# Codes only older versions wrote: registered so their events keep a title, written no more.
WRITTEN_BY_OLDER_VERSIONS: frozenset[str] = frozenset()


class Unresolved(Exception):
    """A code whose values cannot be read from the source."""


@dataclass(slots=True)
class Module:
    """One source file: its tree, its imports and where each node sits."""

    name: str
    path: str
    tree: ast.Module
    # alias -> (module, name) for `from module import name as alias`; (module, None) for modules.
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """Return the innermost function around node, or None at module level."""
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return None

    def is_method(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """Tell whether function is defined directly in a class body."""
        return isinstance(self.parents.get(function), ast.ClassDef)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _load(path: Path) -> Module:
    relative = path.relative_to(ROOT).as_posix()
    module = Module(_module_name(path), relative, ast.parse(path.read_text(), filename=relative))
    package = module.name if path.name == "__init__.py" else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
        for child in ast.iter_child_nodes(node):
            module.parents[child] = node
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    module.imports[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    module.imports[top] = (top, None)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([source] if source else [])])
            for alias in node.names:
                module.imports[alias.asname or alias.name] = (source, alias.name)
    return module


@dataclass(slots=True)
class Source:
    """Every module of the apps, and what each writes."""

    modules: dict[str, Module]

    @classmethod
    def read(cls) -> Source:
        """Parse every Python file under the app directories that exist."""
        modules = {}
        for app in APPS:
            for path in sorted((ROOT / app).rglob("*.py")) if (ROOT / app).is_dir() else ():
                module = _load(path)
                modules[module.name] = module
        return cls(modules)

    def writer_calls(self) -> Iterator[tuple[Module, ast.Call, ast.expr | None]]:
        """Yield each call that writes an event, with the expression of its code."""
        for module in self.modules.values():
            for node in ast.walk(module.tree):
                if not isinstance(node, ast.Call) or _called_name(node) not in WRITERS:
                    continue
                function = module.enclosing_function(node)
                if function is not None and function.name in WRITERS | {"append_events"}:
                    continue  # the writer itself, passing its own argument on
                keyword = next((k.value for k in node.keywords if k.arg == "action"), None)
                yield module, node, node.args[0] if node.args else keyword

    # Resolving an expression to the codes it may hold ----------------------------------------

    def values(
        self, module: Module, expr: ast.expr, seen: frozenset[int] = frozenset()
    ) -> set[str]:
        """Return every string expr may hold. Raises Unresolved when the source cannot tell."""
        key = id(expr)  # the trees live as long as the Source, so ids are not reused
        if key in seen:
            return set()  # a recursive helper passing its code on to itself
        seen = seen | {key}
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        if isinstance(expr, ast.IfExp):
            return self.values(module, expr.body, seen) | self.values(module, expr.orelse, seen)
        if isinstance(expr, ast.Subscript):
            table = self._dict_literal(module, expr.value)
            if table is not None:
                return set().union(*(self.values(module, v, seen) for v in table.values))
        if isinstance(expr, ast.Name):
            return self._name_values(module, expr, seen)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            target = module.imports.get(expr.value.id)
            if target is not None and target[1] is None and target[0] in self.modules:
                return self._global_values(self.modules[target[0]], expr.attr, expr, seen)
        what = "an f-string" if isinstance(expr, ast.JoinedStr) else repr(ast.unparse(expr))
        raise Unresolved(f"{module.path}:{expr.lineno}: the code is {what}; name it literally")

    def _dict_literal(self, module: Module, expr: ast.expr) -> ast.Dict | None:
        if isinstance(expr, ast.Dict):
            return expr
        if isinstance(expr, ast.Name):
            for value in self._global_assignments(module, expr.id):
                if isinstance(value, ast.Dict):
                    return value
        return None

    def _name_values(self, module: Module, expr: ast.Name, seen: frozenset) -> set[str]:
        function = module.enclosing_function(expr)
        while function is not None:
            arguments = function.args
            parameters = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            if any(p.arg == expr.id for p in parameters):
                return self._parameter_values(module, function, expr.id, seen)
            local = list(_local_assignments(function, expr.id))
            if local:
                return set().union(*(self.values(module, value, seen) for value in local))
            function = module.enclosing_function(function)
        return self._global_values(module, expr.id, expr, seen)

    def _global_assignments(self, module: Module, name: str) -> list[ast.expr]:
        found = []
        for statement in module.tree.body:
            if isinstance(statement, ast.Assign):
                targets = statement.targets
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                targets = [statement.target]
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found.append(statement.value)
        return found

    def _global_values(
        self, module: Module, name: str, where: ast.expr, seen: frozenset
    ) -> set[str]:
        assigned = self._global_assignments(module, name)
        if assigned:
            return set().union(*(self.values(module, value, seen) for value in assigned))
        imported = module.imports.get(name)
        if imported is not None and imported[1] is not None and imported[0] in self.modules:
            return self._global_values(self.modules[imported[0]], imported[1], where, seen)
        raise Unresolved(
            f"{module.path}:{where.lineno}: the code is {name!r}, which is no module constant "
            "of the apps; name it literally"
        )

    def _parameter_values(
        self,
        module: Module,
        function: ast.FunctionDef | ast.AsyncFunctionDef,
        name: str,
        seen: frozenset,
    ) -> set[str]:
        arguments = function.args
        positional = [p.arg for p in [*arguments.posonlyargs, *arguments.args]]
        with_default = positional[len(positional) - len(arguments.defaults) :]
        defaults = dict(zip(with_default, arguments.defaults, strict=True))
        defaults |= {
            p.arg: d
            for p, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
            if d is not None
        }
        found: set[str] = set()
        calls = list(self._calls_of(module, function))
        if not calls:
            raise Unresolved(
                f"{module.path}:{function.lineno}: {function.name}() passes its {name!r} on as "
                "a code, but no call of it was found"
            )
        for caller, call, bound in calls:
            index = positional.index(name) - bound if name in positional else None
            argument = next((k.value for k in call.keywords if k.arg == name), None)
            if argument is None and index is not None and 0 <= index < len(call.args):
                argument = call.args[index]
                if any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
                    argument = None
            if argument is not None:
                found |= self.values(caller, argument, seen)
            elif name in defaults and not any(k.arg is None for k in call.keywords):
                found |= self.values(module, defaults[name], seen)
            else:
                raise Unresolved(
                    f"{caller.path}:{call.lineno}: cannot tell which {name!r} this call passes "
                    f"to {function.name}()"
                )
        return found

    def _calls_of(
        self, module: Module, function: ast.FunctionDef | ast.AsyncFunctionDef
    ) -> Iterator[tuple[Module, ast.Call, int]]:
        """Yield each call of function: the calling module, the call and its bound arguments.

        Raises Unresolved when function is used other than by calling it (a callback, say).
        """
        method = module.is_method(function)
        for other in self.modules.values():
            for node in ast.walk(other.tree):
                if not self._refers_to(other, node, module, function.name, method):
                    continue
                parent = other.parents.get(node)
                if isinstance(parent, ast.Call) and parent.func is node:
                    yield other, parent, 1 if method else 0
                elif not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Store):
                    raise Unresolved(
                        f"{other.path}:{node.lineno}: {function.name}() takes a code, so call "
                        "it directly (not as a callback) for its codes to be checked"
                    )

    def _refers_to(
        self, other: Module, node: ast.AST, module: Module, name: str, method: bool
    ) -> bool:
        if method:
            # Methods are called on self or cls in their own module.
            return (
                other is module
                and isinstance(node, ast.Attribute)
                and node.attr == name
                and isinstance(node.value, ast.Name)
                and node.value.id in {"self", "cls"}
            )
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if other is module:
                return node.id == name
            return other.imports.get(node.id) == (module.name, name)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return node.attr == name and other.imports.get(node.value.id) == (module.name, None)
        return False


def _local_assignments(
    function: ast.FunctionDef | ast.AsyncFunctionDef, name: str
) -> Iterator[ast.expr]:
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                yield node.value
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr | ast.AugAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name and node.value:
                yield node.value
        elif (
            isinstance(node, ast.For | ast.comprehension)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            if isinstance(node.iter, ast.Tuple | ast.List | ast.Set):
                yield from node.iter.elts
            else:
                yield node.iter  # not a literal: it fails to resolve, naming its line


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


@dataclass(frozen=True, slots=True)
class Written:
    """The codes the source writes, by call site, and the call sites it cannot read."""

    sites: dict[str, set[str]]
    unresolved: list[str]


@pytest.fixture(scope="module")
def written() -> Written:
    source = Source.read()
    sites: dict[str, set[str]] = {}
    unresolved: list[str] = []
    for module, call, expr in source.writer_calls():
        where = f"{module.path}:{call.lineno}"
        if expr is None:
            unresolved.append(f"{where}: the call names no code")
            continue
        try:
            sites[where] = source.values(module, expr)
        except Unresolved as exc:
            message = str(exc)
            unresolved.append(message if message.startswith(where) else f"{where}: {message}")
    return Written(sites, unresolved)


def test_the_source_walk_finds_the_event_writers(written: Written) -> None:
    assert len(written.sites) + len(written.unresolved) > 50
    assert {site.split(":")[0] for site in written.sites} >= {
        "oversight/actions/gates.py",
        "planning/actions.py",
        "accounts/signals.py",
    }


def test_a_helper_passing_its_code_on_is_followed_to_its_callers(written: Written) -> None:
    # gates._deny(user, gate, action, why) is called with two codes; policies._deny through
    # _require_admin, one helper further; accounts.tokens._revoke by keyword and by default.
    assert {"oversight.gate.decision_denied", "oversight.signature.refused"} in [
        values
        for site, values in written.sites.items()
        if site.startswith("oversight/actions/gates")
    ]
    assert {"oversight.policy.denied", "oversight.reason_code.denied"} in written.sites.values()
    assert {"auth.token.revoked", "auth.token.expired"} in written.sites.values()


def test_every_code_written_can_be_read_from_the_source(written: Written) -> None:
    problems = "\n".join(written.unresolved)
    assert not problems, f"name these codes literally, as constants or as dict values:\n{problems}"


def test_every_code_written_is_registered(written: Written) -> None:
    unknown = [
        f"{site}: {code!r} is not in audit/codes.py"
        for site, values in sorted(written.sites.items())
        for code in sorted(values)
        if code not in codes.CODES
    ]
    assert not unknown, "\n".join(unknown)


def test_every_registered_code_is_written_somewhere(written: Written) -> None:
    used = set().union(*written.sites.values())
    assert set(codes.CODES) >= WRITTEN_BY_OLDER_VERSIONS
    unused = sorted(set(codes.CODES) - used - WRITTEN_BY_OLDER_VERSIONS)
    assert not unused, f"registered but written nowhere (remove, or list as older): {unused}"


# The registry itself ---------------------------------------------------------------------------


def test_each_code_is_registered_once_with_its_own_title() -> None:
    assert len(codes.CODES) == len(codes.EVENT_CODES)
    titles = [entry.title for entry in codes.EVENT_CODES]
    assert sorted(t for t in set(titles) if titles.count(t) > 1) == []


def test_codes_are_dotted_and_titles_are_short_sentences() -> None:
    for entry in codes.EVENT_CODES:
        assert all(entry.code.split(".")) and entry.code.count(".") >= 1, entry
        assert entry.code == entry.code.lower() and " " not in entry.code, entry
        assert entry.title[:1].isupper() and not entry.title.endswith("."), entry
        assert entry.title != entry.code and len(entry.title) <= 60, entry


def test_the_title_of_a_registered_code_is_its_entry_s() -> None:
    assert codes.title("oversight.gate.decided") == "Gate decided"
    assert codes.CODES["oversight.gate.decided"].app == codes.App.OVERSIGHT


def test_an_unregistered_code_is_its_own_title() -> None:
    assert codes.title("ci.audit.checked") == "ci.audit.checked"
    assert codes.title("") == ""


def test_the_registry_imports_neither_django_nor_the_project() -> None:
    tree = ast.parse((ROOT / "audit" / "codes.py").read_text())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert imported <= {"__future__", "collections", "dataclasses", "enum", "types"}
