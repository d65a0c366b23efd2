"""No page names an internal reference: the reliability catalogue ("RELIABILITY R6") and its
scenario ids are the developers' vocabulary, not the user's.

Read as text, without a database: every template, and every string of the apps' code that is
not a docstring (a help text, a message, an error a page shows). Comments and docstrings may
name them; migrations repeat the models' help texts, so the models are what is read.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = (
    "accounts",
    "audit",
    "casehub",
    "execution",
    "observability",
    "oversight",
    "planning",
    "quality",
    "tools",
    "web",
)
# The catalogue, its rules and its scenario ids (A1, E3, O8, R6, S2, W4…). Left out: the F1
# score, a figure the quality pages show, and the demo invoice's A4 paper.
REFERENCE = re.compile(r"RELIABILITY|\b(?!A4 paper)(?:[AELOPQRSW][0-9]{1,2}|F(?!1\b)[0-9]{1,2})\b")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            found.add(id(body[0].value))
    return found


def _code_strings() -> list[str]:
    found = []
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docs = _docstrings(tree)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in docs
                    and REFERENCE.search(node.value)
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:120]!r}")
    return found


def _template_lines() -> list[str]:
    found = []
    for path in (ROOT / "templates").rglob("*.html"):
        text = re.sub(r"{#.*?#}|{% comment %}.*?{% endcomment %}", "", path.read_text(), flags=re.S)
        for number, line in enumerate(text.splitlines(), 1):
            if REFERENCE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return found


def test_the_pattern_finds_the_references_pages_showed() -> None:
    assert REFERENCE.search("Every policy change names a reason code (RELIABILITY R6).")
    assert REFERENCE.search("An approval older than this never executes (R4).")
    assert REFERENCE.search("scenario W4") and REFERENCE.search("the F2 run")
    assert not REFERENCE.search("node F1, edge F1") and not REFERENCE.search("INV-1042 PO-5001")
    assert not REFERENCE.search("Line: A4 paper (box)")


def test_no_template_names_an_internal_reference() -> None:
    assert _template_lines() == []


def test_no_string_a_page_may_show_names_an_internal_reference() -> None:
    assert _code_strings() == []
