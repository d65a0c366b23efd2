"""The planning core and the packs never import Django."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import planning.core
import planning.packs

ROOT = Path(__file__).resolve().parents[3]


def _modules() -> list[str]:
    names = []
    for package in (planning.core, planning.packs):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            names.append(info.name)
    return names


def test_planning_core_and_packs_import_no_django():
    modules = _modules()
    assert "planning.core.dag" in modules
    assert "planning.packs.invoice" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "leaked = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "assert not leaked, leaked\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
