from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "scenarios.py"

CATALOGUE = """\
# What must hold

## Oversight rules (each is a test)
- R1 Separation of duties per action.
- R2 An edit makes a new plan version.

## Catalogue
| id | scenario | must hold |
|---|---|---|
| A1 | the app's role updates audit rows | refused |
| E2 | a poison leaf | dead-lettered |
| E10 | a stopped worker | recovered |
| W3 | every URL for every role — pages, partials | matches the matrix |

| name | other table |
|---|---|
| Z1 | not a scenario | - |
"""


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("casehub_scenarios_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


scenarios = _load_script()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=30
    )


def test_the_catalogue_table_and_the_rules_are_read_in_order_and_nothing_else() -> None:
    catalogue = scenarios.parse_catalogue(CATALOGUE)
    assert catalogue.scenarios == ("A1", "E2", "E10", "W3")
    assert catalogue.rules == ("R1", "R2")


def test_markers_are_found_on_functions_classes_params_and_pytestmark(tmp_path: Path) -> None:
    _write(
        tmp_path / "tests" / "test_a.py",
        """
        import pytest
        from pytest import mark

        pytestmark = [pytest.mark.integration, pytest.mark.scenario("A1")]
        audit = pytest.mark.scenario


        @pytest.mark.scenario("E2", "E10")
        def test_poison() -> None: ...


        class TestMatrix:
            pytestmark = mark.scenario("W3")

            @audit("R1")
            def test_inner(self) -> None: ...


        @pytest.mark.parametrize("x", [pytest.param(1, marks=pytest.mark.scenario("R2")), 2])
        def test_params(x: int) -> None: ...


        @pytest.mark.slow
        def test_without_a_scenario() -> None: ...
        """,
    )
    coverage = scenarios.scan_tests([tmp_path / "tests"], relative_to=tmp_path)
    assert coverage.tests_by_id == {
        "A1": ["tests/test_a.py"],
        "E2": ["tests/test_a.py::test_poison"],
        "E10": ["tests/test_a.py::test_poison"],
        "W3": ["tests/test_a.py::TestMatrix"],
        "R1": ["tests/test_a.py::TestMatrix::test_inner"],
        "R2": ["tests/test_a.py::test_params"],
    }
    assert coverage.unreadable == []


def test_the_report_lists_covered_missing_and_unknown_ids_and_exits_non_zero(
    tmp_path: Path,
) -> None:
    catalogue = _write(tmp_path / "shared" / "RELIABILITY.md", CATALOGUE)
    _write(
        tmp_path / "tests" / "test_b.py",
        """
        import pytest

        @pytest.mark.scenario("E10")
        def test_recovered() -> None: ...

        @pytest.mark.scenario("E10", "R2")
        def test_again() -> None: ...

        @pytest.mark.scenario("Q7")
        def test_from_nowhere() -> None: ...
        """,
    )
    result = _run("--catalogue", str(catalogue), str(tmp_path / "tests"))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "scenarios: 1 of 4 covered; missing: A1 E2 W3"
    assert "rules: 1 of 2 covered; missing: R1" in lines
    assert "unknown: Q7" in lines
    assert any(line.startswith("  E10") and line.endswith("::test_recovered") for line in lines)
    assert any(line.strip().endswith("::test_again") for line in lines)
    assert any(line.startswith("  Q7") and line.endswith("::test_from_nowhere") for line in lines)


def test_a_fully_covered_catalogue_exits_zero(tmp_path: Path) -> None:
    catalogue = _write(tmp_path / "RELIABILITY.md", CATALOGUE)
    _write(
        tmp_path / "tests" / "test_c.py",
        """
        import pytest

        pytestmark = pytest.mark.scenario("A1", "E2", "E10", "W3", "R1", "R2")
        """,
    )
    result = _run("--catalogue", str(catalogue), str(tmp_path / "tests"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "scenarios: 4 of 4 covered"


def test_a_marker_without_literal_ids_is_reported_and_fails(tmp_path: Path) -> None:
    catalogue = _write(tmp_path / "RELIABILITY.md", CATALOGUE)
    _write(
        tmp_path / "tests" / "test_d.py",
        """
        import pytest

        IDS = ("A1",)

        @pytest.mark.scenario(*IDS)
        def test_indirect() -> None: ...
        """,
    )
    result = _run("--catalogue", str(catalogue), str(tmp_path / "tests"))
    assert result.returncode == 1
    assert "unreadable marker:" in result.stdout
    assert "test_d.py::test_indirect (line 6)" in result.stdout


def test_a_missing_catalogue_is_named_and_the_used_ids_still_listed(tmp_path: Path) -> None:
    _write(
        tmp_path / "tests" / "test_e.py",
        """
        import pytest

        @pytest.mark.scenario("E1")
        def test_one() -> None: ...
        """,
    )
    missing = tmp_path / "nowhere" / "RELIABILITY.md"
    result = _run("--catalogue", str(missing), str(tmp_path / "tests"))
    assert result.returncode == 0
    assert str(missing) in result.stderr
    assert "--catalogue PATH" in result.stderr
    assert result.stdout.splitlines()[-1] == (
        "scenarios: 1 ids used in tests; the catalogue was not found"
    )


def test_the_project_s_own_tests_name_only_catalogue_ids() -> None:
    if not scenarios.DEFAULT_CATALOGUE.is_file():
        # CI and every session have shared/ beside the repository; a bare clone may not.
        catalogue_ids: frozenset[str] = frozenset()
    else:
        catalogue_ids = scenarios.load_catalogue(scenarios.DEFAULT_CATALOGUE).ids
    coverage = scenarios.scan_tests(scenarios.DEFAULT_TESTS)
    assert coverage.unreadable == []
    if catalogue_ids:
        assert set(coverage.tests_by_id) <= catalogue_ids
