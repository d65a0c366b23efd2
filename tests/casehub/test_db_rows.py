"""`web.db.from_row` builds the instance the ORM would of a row a written-out statement read.

The hot path reads its rows with its own statements and turns them into model instances here;
those instances must be the ORM's in every way the callers use: the same values, loaded from the
database (a save updates the row), and the model's init signals honoured where any listens.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import Model, signals

from planning.models import Case, PlanNode, PlanVersion
from tests.cases import planned_invoice_case
from web.db import columns, from_row

pytestmark = pytest.mark.django_db


def _row(model: type[Model], pk: int) -> tuple[Any, ...]:
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        sql = f"SELECT {columns('t', model)} FROM {table} t WHERE t.id = %s"  # noqa: S608
        cursor.execute(sql, [pk])
        row = cursor.fetchone()
    assert row is not None
    return tuple(row)


def _values(instance: Model) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


@pytest.mark.parametrize("model", [Case, PlanVersion, PlanNode])
def test_a_row_becomes_the_instance_the_orm_reads(analyst: Any, model: type[Model]) -> None:
    case = planned_invoice_case(analyst)
    pk = {
        Case: case.pk,
        PlanVersion: case.versions.get().pk,
        PlanNode: PlanNode.objects.filter(version__case=case).order_by("id").last().pk,
    }[model]
    orm = model._default_manager.get(pk=pk)

    built = from_row(model, _row(model, pk))

    assert type(built) is model
    assert _values(built) == _values(orm)
    assert (built._state.adding, built._state.db) == (False, "default")
    assert built == orm


def test_an_instance_from_a_row_saves_as_an_update(analyst: Any) -> None:
    case = planned_invoice_case(analyst)
    built = from_row(Case, _row(Case, case.pk))
    built.title = "Renamed from its row"
    built.save(update_fields=["title"])
    assert Case.objects.get(pk=case.pk).title == "Renamed from its row"
    assert Case.objects.count() == 1


def test_a_model_whose_init_is_listened_to_goes_through_the_orm(analyst: Any) -> None:
    case = planned_invoice_case(analyst)
    seen: list[int] = []

    def heard(sender: type[Model], instance: Model, **kwargs: Any) -> None:
        seen.append(instance.pk)

    signals.post_init.connect(heard, sender=Case)
    try:
        built = from_row(Case, _row(Case, case.pk))
    finally:
        signals.post_init.disconnect(heard, sender=Case)
    assert seen == [case.pk]
    assert _values(built) == _values(Case.objects.get(pk=case.pk))


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match="columns"):
        from_row(Case, (1, 2))
