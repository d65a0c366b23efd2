"""Run every ``bench/bench_*.py`` module, merge the figures into ``bench/results.json``, print them.

Each module exposes ``run() -> dict[str, float]`` and may expose ``TARGETS``: a mapping from a
result name to ``("<=", limit)`` or ``(">=", limit)``. Results are merged into the existing file,
so figures from modules that were not run (``python -m bench planning``) are kept. The exit
status is 1 when a module fails or a figure misses its target. ``--minutes`` is passed to the
modules whose ``run`` takes it (the load run: ``python -m bench load --minutes 10``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results.json"

type Target = tuple[str, float]


def _modules(selected: Sequence[str]) -> list[str]:
    names = sorted(path.stem for path in BENCH_DIR.glob("bench_*.py"))
    if selected:
        wanted = {s if s.startswith("bench_") else f"bench_{s}" for s in selected}
        unknown = wanted - set(names)
        if unknown:
            raise SystemExit(f"unknown benchmark module(s): {', '.join(sorted(unknown))}")
        names = [n for n in names if n in wanted]
    return names


def _load_results() -> dict[str, float]:
    if not RESULTS.exists():
        return {}
    try:
        data = json.loads(RESULTS.read_text())
    except json.JSONDecodeError:
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _verdict(value: float, target: Target | None) -> str:
    if target is None:
        return ""
    op, limit = target
    ok = value <= limit if op == "<=" else value >= limit
    return f"{op} {limit:g}  {'ok' if ok else 'MISSED'}"


def _print_table(rows: Sequence[tuple[str, float, Target | None]]) -> None:
    width = max((len(name) for name, _, _ in rows), default=10)
    print(f"{'benchmark':<{width}}  {'value':>12}  target")
    print("-" * (width + 30))
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>12.4g}  {_verdict(value, target)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("modules", nargs="*", help="run only these modules (e.g. planning)")
    parser.add_argument(
        "--minutes", type=float, help="the length of the load run (default: its short form)"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(BENCH_DIR.parent))
    results = _load_results()
    rows: list[tuple[str, float, Target | None]] = []
    failed = False
    for name in _modules(args.modules):
        started = time.perf_counter()
        print(f"running bench.{name} ...", flush=True)
        try:
            module = importlib.import_module(f"bench.{name}")
            takes_minutes = "minutes" in inspect.signature(module.run).parameters
            options = {"minutes": args.minutes} if takes_minutes and args.minutes else {}
            figures: Mapping[str, float] = module.run(**options)
        except Exception:
            traceback.print_exc()
            failed = True
            continue
        targets: Mapping[str, Target] = getattr(module, "TARGETS", {})
        for key, value in figures.items():
            results[key] = float(value)
            target = targets.get(key)
            rows.append((key, float(value), target))
            if target is not None and "MISSED" in _verdict(float(value), target):
                failed = True
        print(f"  done in {time.perf_counter() - started:.1f} s", flush=True)
    RESULTS.write_text(json.dumps(dict(sorted(results.items())), indent=2) + "\n")
    print()
    _print_table(rows)
    print(f"\nresults merged into {RESULTS.relative_to(BENCH_DIR.parent)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
