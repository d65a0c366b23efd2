"""The README stays short, every relative link in the docs leads somewhere, and every CASEHUB_*
setting the code reads is documented in docs/configuration.md (plain files: no Django, no DB)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
README_MAX_LINES = 150

# Top-level directories that hold no app code whose settings must be documented.
NOT_APPS = {"tests", "bench", "scripts", ".venv", "var", "static", "templates", "docs"}
SETTING = re.compile(r"\bCASEHUB_[A-Z0-9_]*[A-Z0-9]\b")
# Prefixes the budget module completes with _CALLS, _TOKENS and _COST_USD: not settings themselves.
SETTING_PREFIXES = {"CASEHUB_LLM_CASE_MAX", "CASEHUB_LLM_DAY_MAX"}

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


def markdown_files() -> list[Path]:
    """Return the README, every page under docs/ and the benchmarks' README."""
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]


def prose(text: str) -> str:
    """Return the text without fenced code blocks and inline code, where links are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """Return the anchor GitHub gives a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = (
        ch
        for ch in text
        if ch in " -_" or unicodedata.category(ch)[0] in "LN" or unicodedata.category(ch) == "Mn"
    )
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Return the anchors of a markdown file's headings, numbered as GitHub numbers repeats."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """Return the targets of the links of a markdown file that point inside the repository."""
    targets = [match.group(1) for match in LINK.finditer(prose(path.read_text()))]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def broken_links(path: Path) -> list[str]:
    """Return each relative link of `path` whose file, or heading in a .md file, does not exist."""
    problems = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no such heading")
    return problems


def app_directories() -> list[Path]:
    """Return the top-level directories that are Python packages or Django apps."""
    return sorted(
        path
        for path in ROOT.iterdir()
        if path.is_dir()
        and path.name not in NOT_APPS
        and not path.name.startswith(".")
        and ((path / "apps.py").exists() or (path / "__init__.py").exists())
    )


def settings_read_in_code() -> set[str]:
    """Return every CASEHUB_* name in the Python files of the app directories."""
    names: set[str] = set()
    for directory in app_directories():
        for path in directory.rglob("*.py"):
            names.update(SETTING.findall(path.read_text()))
    return names - SETTING_PREFIXES


def test_the_readme_is_shorter_than_150_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_every_docs_page_starts_with_a_title_and_a_one_line_summary() -> None:
    for path in markdown_files()[1:]:
        lines = path.read_text().splitlines()
        assert lines[0].startswith("# "), f"{path.relative_to(ROOT)} does not start with a title"
        assert lines[1] == "" and lines[2].strip(), f"{path.relative_to(ROOT)} has no summary"
        assert len(HEADING.findall(path.read_text())) > 2, f"{path.relative_to(ROOT)}: no headings"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading(path: Path) -> None:
    assert path.exists()
    assert broken_links(path) == []


def test_the_readme_links_every_docs_page() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    pages = set(markdown_files()[1:])
    assert pages - linked == set()


def test_every_setting_the_code_reads_is_in_the_configuration_page() -> None:
    names = settings_read_in_code()
    assert len(names) > 20, f"found only {sorted(names)}: is the scan looking in the right place?"
    documented = set(SETTING.findall(CONFIGURATION.read_text()))
    assert sorted(names - documented) == []


def test_the_setting_prefixes_left_out_are_completed_by_documented_settings() -> None:
    documented = set(SETTING.findall(CONFIGURATION.read_text()))
    for prefix in SETTING_PREFIXES:
        assert {f"{prefix}_CALLS", f"{prefix}_TOKENS", f"{prefix}_COST_USD"} <= documented


# The checks themselves, on small made-up inputs: each must be able to fail.


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Running locally: `make run`") == "running-locally-make-run"
    assert slug("Logins, sessions and tokens") == "logins-sessions-and-tokens"
    assert (
        slug("A repeated goal (`python -m bench repeat`, part of `make bench`)")
        == "a-repeated-goal-python--m-bench-repeat-part-of-make-bench"
    )
    assert slug("Verifying a bundle offline: `casehub_verify.py`") == (
        "verifying-a-bundle-offline-casehub_verifypy"
    )


def test_a_broken_link_and_a_missing_heading_are_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Real heading\n\n## Real heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#real-heading) [ok too](other.md#real-heading-1) [self](#page)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [web](https://example.org/x)\n"
        "`[code](not-a-link.md)`\n\n```\n[fenced](not-a-link-either.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md: no such file", "other.md#nowhere: no such heading"]


def test_the_scan_finds_a_setting_and_skips_non_app_directories() -> None:
    directories = {path.name for path in app_directories()}
    assert {"casehub", "planning", "oversight"} <= directories
    assert directories.isdisjoint(NOT_APPS)
    assert SETTING.findall('env_int("CASEHUB_NEW_THING_S", 3) f"CASEHUB_LLM_{x}"') == [
        "CASEHUB_NEW_THING_S"
    ]
