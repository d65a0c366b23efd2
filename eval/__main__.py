"""`python -m eval`: plan the evaluation set with every strategy and write the results.

By default on the deterministic fake model, served on loopback by the tests' fake
OpenAI-compatible server; `--model` with `OPENAI_BASE_URL` (and `OPENAI_API_KEY` when the server
wants one) evaluates a real one. Writes `eval/results/<model>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eval.dataset import GOALS_DIR, load_goals
from eval.fake_model import MODEL_NAME, respond
from eval.report import file_stem, markdown, summarise
from eval.runner import STRATEGIES, run_all
from planning.core.llm.pricing import PriceTable
from planning.core.llm.records import LlmSettings
from tests.fakes.openai_server import FakeOpenAIServer
from web.env import env_float

RESULTS_DIR = Path(__file__).resolve().parent / "results"
FAKE_SERVER = "the fake OpenAI-compatible server of the tests (loopback)"


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__)
    parser.add_argument(
        "--model",
        default="",
        help="a real model on OPENAI_BASE_URL (default: CASEHUB_LLM_MODEL when OPENAI_BASE_URL is "
        f"set, else the fake model {MODEL_NAME!r})",
    )
    parser.add_argument("--goals", nargs="*", default=(), help="only goals whose id starts so")
    parser.add_argument(
        "--strategies",
        nargs="*",
        default=(),
        help=f"only these ({', '.join(s.label for s in STRATEGIES)})",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="the results directory")
    parser.add_argument("--goals-dir", type=Path, default=GOALS_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--server-version", default="", help="recorded with the results")
    parser.add_argument(
        "--note", default="", help="recorded with the results (a subset of goals and why, say)"
    )
    parser.add_argument(
        "--timeout", type=float, default=float(os.environ.get("CASEHUB_LLM_TIMEOUT_S", "60"))
    )
    parser.add_argument(
        "--concurrency", type=int, default=int(os.environ.get("CASEHUB_LLM_CONCURRENCY", "64"))
    )
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def _settings(model: str, base_url: str | None, api_key: str | None, args: Any) -> LlmSettings:
    response_format = os.environ.get("CASEHUB_LLM_RESPONSE_FORMAT", "json_schema")
    return LlmSettings(
        api_key=api_key,
        base_url=base_url,
        model=model,
        timeout_s=args.timeout,
        max_retries=int(os.environ.get("CASEHUB_LLM_MAX_RETRIES", "2")),
        max_concurrency=args.concurrency,
        max_tokens_per_call=int(os.environ.get("CASEHUB_LLM_MAX_TOKENS_PER_CALL", "2048")),
        response_format="json_object" if response_format == "json_object" else "json_schema",
        temperature=env_float("CASEHUB_LLM_TEMPERATURE", low=0.0, high=2.0),
    )


@contextmanager
def _provider(args: argparse.Namespace) -> Iterator[tuple[LlmSettings, str, str]]:
    base_url = os.environ.get("OPENAI_BASE_URL", "")
    model = args.model or (os.environ.get("CASEHUB_LLM_MODEL", "") if base_url else "")
    if model and model != MODEL_NAME:
        if not base_url and not os.environ.get("OPENAI_API_KEY"):
            raise SystemExit("eval: a real model needs OPENAI_BASE_URL (or OPENAI_API_KEY)")
        settings = _settings(model, base_url or None, os.environ.get("OPENAI_API_KEY"), args)
        yield settings, base_url or "api.openai.com", args.server_version
        return
    with FakeOpenAIServer(model=MODEL_NAME, responder=respond) as server:
        settings = _settings(MODEL_NAME, server.base_url, server.api_key, args)
        yield settings, FAKE_SERVER, args.server_version


def main(argv: Sequence[str] | None = None) -> int:
    """Run the evaluation; return the exit status (0, or 2 for an unknown strategy)."""
    args = _arguments(argv)
    specs = [s for s in STRATEGIES if not args.strategies or s.label in args.strategies]
    unknown = set(args.strategies) - {s.label for s in STRATEGIES}
    if unknown:
        print(f"eval: unknown strategies {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    goals = load_goals(args.goals_dir, args.goals)
    prices = PriceTable.parse(os.environ.get("CASEHUB_LLM_PRICES", ""))

    def progress(run: dict[str, Any]) -> None:
        if not args.quiet:
            mark = "valid" if run["valid"] else ("invalid" if run["delivered"] else "failed")
            print(
                f"{run['goal']:<34} {run['strategy']:<8} {mark:<8} "
                f"node F1 {run['node_f1']:.2f} edge F1 {run['edge_f1']:.2f}",
                flush=True,
            )

    with _provider(args) as (settings, server, version):
        runs = run_all(goals, specs, settings, prices, progress)
    results = {
        "model": settings.model,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "server": server,
        "server_version": version or None,
        "note": args.note or None,
        "goals": len(goals),
        "strategies": [s.label for s in specs],
        "summary": summarise(runs, [s.label for s in specs]),
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = file_stem(settings.model)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(results))
    if not args.quiet:
        print(f"eval: wrote {args.out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
