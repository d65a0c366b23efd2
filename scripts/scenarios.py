"""List which reliability scenarios the tests automate, which are missing, and unknown ids.

The catalogue is the `| id | scenario | must hold |` table of ../shared/RELIABILITY.md, plus its
oversight rules R1, R2, ... (reported apart). A test automates a row when it carries
`@pytest.mark.scenario("E1")`, on the function, its class, a `pytest.param`, or in a module's
`pytestmark`. The tests are read as source (AST), never imported: no database, no settings.
Exit status: 0 when every id used in the tests is in the catalogue, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CATALOGUE = ROOT.parent / "shared" / "RELIABILITY.md"
DEFAULT_TESTS = (ROOT / "tests",)

_HEADER = re.compile(r"^\|\s*id\s*\|\s*scenario\s*\|\s*must hold\s*\|", re.IGNORECASE)
_ROW = re.compile(r"^\|\s*([A-Z]+[0-9]+)\s*\|")
_RULE = re.compile(r"^\s*[-*]\s+(R[0-9]+)\b")


class CatalogueMissing(FileNotFoundError):
    """The reliability catalogue is not where it was looked for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalogue:
    """The scenario ids of the table and the rule ids, each in the document's order."""

    scenarios: tuple[str, ...]
    rules: tuple[str, ...]

    @property
    def ids(self) -> frozenset[str]:
        """Return every id the catalogue knows."""
        return frozenset(self.scenarios) | frozenset(self.rules)


@dataclass(slots=True, kw_only=True)
class Coverage:
    """Which tests name each id, plus the markers that could not be read."""

    tests_by_id: dict[str, list[str]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)

    def add(self, scenario_id: str, test: str) -> None:
        """Record that a test automates an id (once per test)."""
        tests = self.tests_by_id.setdefault(scenario_id, [])
        if test not in tests:
            tests.append(test)


def parse_catalogue(text: str) -> Catalogue:
    """Read the scenario ids of the catalogue table and the R-numbered rules from markdown."""
    scenarios: list[str] = []
    rules: list[str] = []
    in_table = False
    for line in text.splitlines():
        if _HEADER.match(line):
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                in_table = False
            elif row := _ROW.match(line):
                scenarios.append(row.group(1))
                continue
        if rule := _RULE.match(line):
            rules.append(rule.group(1))
    return Catalogue(scenarios=tuple(dict.fromkeys(scenarios)), rules=tuple(dict.fromkeys(rules)))


def load_catalogue(path: Path) -> Catalogue:
    """Parse the catalogue file; raises CatalogueMissing when it does not exist."""
    if not path.is_file():
        raise CatalogueMissing(str(path))
    return parse_catalogue(path.read_text(encoding="utf-8"))


def _is_scenario_mark(node: ast.expr, aliases: set[str]) -> bool:
    # pytest.mark.scenario, mark.scenario (from pytest import mark), or a name bound to either.
    if isinstance(node, ast.Name):
        return node.id in aliases
    if not (isinstance(node, ast.Attribute) and node.attr == "scenario"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "mark") or (
        isinstance(owner, ast.Name) and owner.id == "mark"
    )


def _aliases(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_scenario_mark(node.value, set()):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


class _MarkerFinder(ast.NodeVisitor):
    """Attribute each scenario marker to the innermost test, class or module around it."""

    def __init__(self, where: str, coverage: Coverage, aliases: set[str]) -> None:
        self.scope = [where]
        self.coverage = coverage
        self.aliases = aliases

    def _visit_scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = _visit_scope
    visit_AsyncFunctionDef = _visit_scope
    visit_ClassDef = _visit_scope

    def visit_Call(self, node: ast.Call) -> None:
        if _is_scenario_mark(node.func, self.aliases):
            test = "::".join(self.scope)
            ids = [
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            ]
            if not node.args or len(ids) != len(node.args) or node.keywords:
                self.coverage.unreadable.append(
                    f"{test} (line {node.lineno}): scenario() takes string literals only"
                )
            for scenario_id in ids:
                self.coverage.add(scenario_id.strip(), test)
        self.generic_visit(node)


def scan_tests(roots: Iterable[Path], relative_to: Path = ROOT) -> Coverage:
    """Collect the scenario markers of every tests .py file under the roots."""
    coverage = Coverage()
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in files:
            try:
                where = str(path.resolve().relative_to(relative_to.resolve()))
            except ValueError:
                where = str(path)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            _MarkerFinder(where, coverage, _aliases(tree)).visit(tree)
    return coverage


def _order(ids: Iterable[str]) -> list[str]:
    # Catalogue-like order: letters, then the number (E2 before E10).
    def key(scenario_id: str) -> tuple[str, int, str]:
        match = re.fullmatch(r"([A-Za-z]*)([0-9]*)(.*)", scenario_id)
        letters, number, rest = match.groups() if match else (scenario_id, "", "")
        return letters, int(number or 0), rest

    return sorted(ids, key=key)


def _section(title: str, ids: Sequence[str], coverage: Coverage) -> list[str]:
    lines = [f"{title} ({len(ids)}):"]
    width = max((len(i) for i in ids), default=0)
    for scenario_id in ids:
        first, *others = coverage.tests_by_id[scenario_id]
        lines.append(f"  {scenario_id:<{width}}  {first}")
        lines += [f"  {'':<{width}}  {test}" for test in others]
    return lines


def report(catalogue: Catalogue | None, coverage: Coverage) -> tuple[list[str], bool]:
    """Return the report's lines and whether it is clean (no unknown id, no unreadable marker)."""
    used = set(coverage.tests_by_id)
    unreadable = [f"unreadable marker: {u}" for u in coverage.unreadable]
    if catalogue is None:
        lines = _section("ids used in tests", _order(used), coverage) + unreadable
        lines.append(f"scenarios: {len(used)} ids used in tests; the catalogue was not found")
        return lines, not coverage.unreadable
    lines = []
    summaries: list[str] = []
    for kind, ids in (("scenarios", catalogue.scenarios), ("rules", catalogue.rules)):
        covered = [i for i in ids if i in used]
        missing = [i for i in ids if i not in used]
        lines += _section(f"{kind} covered", covered, coverage)
        lines.append(f"{kind} missing ({len(missing)}): {' '.join(missing) or '-'}")
        summary = f"{kind}: {len(covered)} of {len(ids)} covered"
        # The rules' summary first, so the last line is the scenarios'.
        summaries.insert(0, f"{summary}; missing: {' '.join(missing)}" if missing else summary)
    unknown = _order(used - catalogue.ids)
    if unknown:
        lines += _section("unknown ids (used in tests, not in the catalogue)", unknown, coverage)
    lines += unreadable
    if unknown:
        summaries.insert(0, f"unknown: {' '.join(unknown)}")
    return lines + summaries, not unknown and not coverage.unreadable


def main(argv: Sequence[str] | None = None) -> int:
    """Print the coverage report; return 1 when a test names an unknown id or is unreadable."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--catalogue", type=Path, default=DEFAULT_CATALOGUE)
    parser.add_argument("tests", nargs="*", type=Path, default=list(DEFAULT_TESTS))
    args = parser.parse_args(argv)
    try:
        catalogue: Catalogue | None = load_catalogue(args.catalogue)
    except CatalogueMissing:
        catalogue = None
        print(
            f"The catalogue {args.catalogue} was not found (it lives in shared/ beside the "
            "repository; pass --catalogue PATH). Listing the ids the tests use, unchecked.",
            file=sys.stderr,
        )
    lines, is_clean = report(catalogue, scan_tests(args.tests))
    print("\n".join(lines))
    return 0 if is_clean else 1


if __name__ == "__main__":
    sys.exit(main())
