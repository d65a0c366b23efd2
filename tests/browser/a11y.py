"""Accessibility checks for the browser tests: axe-core at WCAG 2.2 AA, and the 390 px layout.

axe-core (MPL-2.0) is vendored under vendor/axe-core/ with its licence. It is evaluated through
the DevTools protocol, which the page's CSP does not govern, so the app's policy stays in force
while the page is checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

AXE_PATH = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
WCAG_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]
PHONE = {"width": 390, "height": 844}

RUN_AXE = """
async (tags) => {
  const result = await axe.run(document, {runOnly: {type: "tag", values: tags}});
  return result.violations.map((v) => ({
    id: v.id,
    impact: v.impact,
    help: v.help,
    targets: v.nodes.map((n) => n.target.join(" ")),
  }));
}
"""


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """Run axe-core on the page as it is now and return its WCAG 2.2 AA violations."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE_PATH.read_text() + "\n;void 0")
    violations: list[dict[str, Any]] = page.evaluate(RUN_AXE, WCAG_AA)
    return violations


def describe(violations: list[dict[str, Any]]) -> str:
    """One line per violation: its rule, impact, help and the elements it names."""
    return "\n".join(
        f"{v['id']} ({v['impact']}): {v['help']} at {', '.join(v['targets'][:6])}"
        + (f" and {len(v['targets']) - 6} more" if len(v["targets"]) > 6 else "")
        for v in violations
    )


def assert_accessible(page: Any, name: str) -> None:
    """Fail listing every axe-core violation of the page at WCAG 2.2 AA."""
    violations = axe_violations(page)
    assert not violations, f"{name} ({page.url}):\n{describe(violations)}"


def page_overflow(page: Any) -> int:
    """Return how many CSS pixels the page is wider than the viewport (0 when it fits)."""
    width: int = page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"
    )
    return max(width, 0)


def wider_than_page(page: Any) -> list[str]:
    """Name the elements whose right edge passes the viewport (to say what overflows)."""
    found: list[str] = page.evaluate(
        """() => {
          const limit = document.documentElement.clientWidth;
          const out = [];
          for (const el of document.querySelectorAll("body *")) {
            const box = el.getBoundingClientRect();
            if (box.right > limit + 1 && box.width > 0) {
              let scrolled = false;
              for (let p = el.parentElement; p; p = p.parentElement) {
                const s = getComputedStyle(p);
                if (["auto", "scroll", "hidden"].includes(s.overflowX) && p !== document.body
                    && p !== document.documentElement) { scrolled = true; break; }
              }
              const classes = typeof el.className === "string" && el.className.trim()
                ? "." + el.className.trim().split(/\\s+/).join(".") : "";
              if (!scrolled) out.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
                + classes + " right=" + Math.round(box.right));
            }
          }
          return out.slice(0, 12);
        }"""
    )
    return found


def assert_fits_phone(page: Any, name: str) -> None:
    """Fail when the page scrolls sideways at the phone width; save a screenshot to look at."""
    shot(page, f"phone-{name}")
    overflow = page_overflow(page)
    assert overflow == 0, f"{name} is {overflow} px too wide at 390 px: {wider_than_page(page)}"


def shot(page: Any, name: str) -> Path:
    """Save a full-page screenshot under the var dir's screens/ and return its path."""
    out = Path(settings.VAR_DIR) / "screens"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
