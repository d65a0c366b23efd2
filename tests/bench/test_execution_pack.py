"""The execution bench's pack plans the DAGs the bench claims, and only the plan gate opens."""

from __future__ import annotations

import graphlib
from typing import Any

import pytest

from bench.bench_execution import LAYERED, NOOP, bound_s
from bench.execution_pack import PATH, SLUG, layered_dag
from oversight.models import Gate, GateKind
from planning.actions import materialise_plan, submit_case
from planning.catalogue import sync_packs
from planning.models import CaseStatus, PlanNode


def _longest_path(dag: dict[str, tuple[str, ...]]) -> int:
    length: dict[str, int] = {}
    for key in graphlib.TopologicalSorter(dag).static_order():
        length[key] = 1 + max((length[d] for d in dag[key]), default=0)
    return max(length.values())


def test_the_layered_dag_has_200_leaves_a_critical_path_of_10_and_a_bound_of_5_s() -> None:
    dag = layered_dag(LAYERED)
    assert len(dag) == 200
    assert _longest_path(dag) == 10
    assert {len(deps) for key, deps in dag.items() if not key.startswith("l000-")} == {3}
    assert bound_s(LAYERED) == pytest.approx(5.0)


def test_the_no_op_dag_has_1000_leaves_in_50_layers() -> None:
    dag = layered_dag(NOOP)
    assert len(dag) == 1000
    assert _longest_path(dag) == 50
    assert bound_s(NOOP) == 0


@pytest.mark.django_db
def test_a_bench_case_plans_every_leaf_with_its_dependencies_behind_the_plan_gate_alone(
    settings: Any, analyst: Any
) -> None:
    settings.CASEHUB_EXTRA_PACKS = [PATH]
    settings.CASEHUB_PLAN_MAX_LEAVES = 1000
    settings.CASEHUB_PLAN_MAX_FANOUT = 50
    sync_packs()
    case = submit_case(
        submitter=analyst,
        title="Bench DAG",
        goal="Run the bench DAG",
        domain=SLUG,
        strategy="static",
        inputs=LAYERED,
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    leaves = PlanNode.objects.filter(version=case.current_version, kind="leaf")
    stored = {key: set(deps) for key, deps in leaves.values_list("key", "depends_on")}
    assert stored == {key: set(deps) for key, deps in layered_dag(LAYERED).items()}
    assert list(Gate.objects.filter(case=case).values_list("kind", flat=True)) == [GateKind.PLAN]
