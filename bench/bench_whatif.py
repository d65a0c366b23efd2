"""The policy what-if on PostgreSQL (#24): replay 10,000 plan versions under a pending, looser
policy version beside the active one, end to end (target ≤ 60 s).

The bench owns a PostgreSQL database (``CASEHUB_BENCH_WHATIF_DATABASE_URL``, default
``casehub_bench_whatif``; its name must contain "bench"), dropped and created at the start and
dropped at the end unless ``CASEHUB_BENCH_KEEP_DB=1``. A child process migrates it, plans one
real INV-1042 invoice case through the real actions, then adds ``CASEHUB_BENCH_WHATIF_VERSIONS``
- 1 (9,999) cases in bulk, each with one plan version holding copies of that plan's seven leaves
(their amounts varied, so that a raised amount threshold changes some of them). A second admin's
looser proposal (financial steps no longer gated or signed, the amount threshold raised to 50,000)
is pending; an admin asks for its what-if over the last 30 days (`request_whatif`, the queued
report and its audit event) and the `oversight.run_policy_whatif` task runs it through Celery's
``apply`` in the same process (the task body with Celery's machinery, no broker: a broker's
hand-off costs milliseconds). The figure is the wall-clock from the request to the finished
report, with the versions and steps it replayed and the batches' rate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_audit import _admin, _recreate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/casehub_bench_whatif"
VERSIONS = int(os.environ.get("CASEHUB_BENCH_WHATIF_VERSIONS", "10000"))

TARGETS = {
    "whatif.s": ("<=", 60.0),
}


def _env(url: str, var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CASEHUB_DB_APP_ROLE", "CASEHUB_DEMO")}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="casehub.settings",
        CASEHUB_VAR_DIR=str(var_dir),
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-only-not-a-secret"),
        CELERY_BROKER_URL="memory://",
    )
    return env


def run() -> dict[str, float]:
    """Return the what-if's wall-clock over the plan versions and what it replayed."""
    url = os.environ.get("CASEHUB_BENCH_WHATIF_DATABASE_URL", DEFAULT_URL)
    admin_url, name = _admin(url)
    try:
        _recreate(admin_url, name)
    except Exception as exc:  # no server to measure on
        print(f"  SKIPPED bench_whatif: PostgreSQL unreachable at {admin_url} ({exc}).", flush=True)
        return {}
    try:
        with tempfile.TemporaryDirectory(prefix="casehub-bench-whatif-") as tmp:
            var_dir = Path(tmp)
            out = var_dir / "whatif.json"
            subprocess.run(
                [sys.executable, "-m", "bench.bench_whatif", "measure", str(out)],
                cwd=ROOT,
                env=_env(url, var_dir),
                check=True,
            )
            figures: dict[str, float] = json.loads(out.read_text())
    finally:
        if os.environ.get("CASEHUB_BENCH_KEEP_DB") != "1":
            _recreate(admin_url, name, drop_only=True)
    return figures


# The child process --------------------------------------------------------------------------


def _seed() -> Any:
    """Plan one real case and clone its leaves into VERSIONS - 1 more one-version cases."""
    from django.core.management import call_command
    from django.db import connection

    from accounts import roles
    from planning.actions import materialise_plan, submit_case
    from planning.catalogue import load_demo_erp, sync_packs
    from planning.models import Case, PlanNode, PlanVersion
    from tests import personas

    call_command("migrate", verbosity=0, interactive=False)
    roles.sync_roles()
    sync_packs()
    load_demo_erp()
    analyst = personas.analyst("bench-analyst")
    real = submit_case(
        submitter=analyst,
        title="Verify INV-1042",
        goal="Verify invoice INV-1042",
        domain="invoice",
        strategy="static",
        inputs={"invoice_id": "INV-1042"},
    )
    materialise_plan(real.pk)
    real.refresh_from_db()
    leaves = list(PlanNode.objects.filter(version=real.current_version, kind=PlanNode.Kind.LEAF))
    batch = 1000
    for start in range(0, VERSIONS - 1, batch):
        count = min(batch, VERSIONS - 1 - start)
        cases = Case.objects.bulk_create(
            Case(
                title=f"Bench case {start + i}",
                goal="Verify an invoice",
                domain="invoice",
                strategy="static",
                submitter=analyst,
                status="awaiting_approval",
            )
            for i in range(count)
        )
        versions = PlanVersion.objects.bulk_create(
            PlanVersion(
                case=c, number=1, strategy="static", content_hash=f"{c.pk:064x}", leaf_count=7
            )
            for c in cases
        )
        nodes = []
        for index, version in enumerate(versions):
            # Amounts from 1,000 to 99,000: a threshold raised to 50,000 ungates half of them.
            amount = 1000 * (1 + (start + index) % 99)
            for leaf in leaves:
                inputs = dict(leaf.inputs) if isinstance(leaf.inputs, dict) else {}
                if leaf.tool == "place_payment_hold":
                    inputs["amount"] = amount
                nodes.append(
                    PlanNode(
                        version=version,
                        key=leaf.key,
                        position=leaf.position,
                        depth=leaf.depth,
                        kind=leaf.kind,
                        name=leaf.name,
                        agent=leaf.agent,
                        task=leaf.task,
                        tool=leaf.tool,
                        inputs=inputs,
                        depends_on=leaf.depends_on,
                        risk=leaf.risk,
                        provenance=leaf.provenance,
                        content_hash=leaf.content_hash,
                    )
                )
        PlanNode.objects.bulk_create(nodes, batch_size=2000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return real


def _measure(out: Path) -> None:
    import django

    django.setup()
    import time

    from django.db import connection

    from oversight.actions.policies import propose_policy
    from oversight.actions.whatif import request_whatif
    from oversight.models import Gate, PolicyVersion, PolicyWhatIf
    from oversight.tasks import run_policy_whatif
    from planning.models import PlanNode, PlanVersion
    from tests import personas

    started = time.perf_counter()
    _seed()
    seed_s = time.perf_counter() - started
    looser = {
        "gated_risks": ["write", "external", "destructive"],
        "signature_risks": ["external", "destructive"],
        "amount_threshold": "50000",
    }
    pending = propose_policy(personas.admin("bench-alice"), looser, "threshold-review", "bench")
    assert pending.status == PolicyVersion.Status.PENDING
    admin = personas.admin("bench-adam")
    gates = Gate.objects.count()
    started = time.perf_counter()
    report = request_whatif(admin, pending)
    result = run_policy_whatif.apply(args=[report.pk]).get()
    wall = time.perf_counter() - started
    done = PolicyWhatIf.objects.get(pk=report.pk)
    if result["status"] != "done" or Gate.objects.count() != gates:
        raise RuntimeError(f"the what-if did not finish cleanly: {result}")
    summary = done.summary
    figures = {
        "whatif.s": wall,
        "whatif.versions": float(done.done),
        "whatif.steps": float(summary["steps"]),
        "whatif.versions_per_s": done.done / wall,
        "whatif.changed_steps": float(summary["steps"] - summary["changes"]["unchanged"]),
        "whatif.changed_cases": float(summary["changed_cases"]),
        "whatif.seed_s": seed_s,
        "whatif.plan_versions_in_db": float(PlanVersion.objects.count()),
        "whatif.leaves_in_db": float(PlanNode.objects.filter(kind="leaf").count()),
    }
    print(f"  {connection.vendor}: {json.dumps(figures)}", flush=True)
    out.write_text(json.dumps(figures))


if __name__ == "__main__":
    if sys.argv[1:2] == ["measure"]:
        _measure(Path(sys.argv[2]))
    else:
        raise SystemExit("usage: python -m bench.bench_whatif measure OUT.json")
