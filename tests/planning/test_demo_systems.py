"""The incident estate and the fraud account data in the database: loaded once, the next call
sees an effect, and each effect happens once per idempotency key, after the leaf's safe point."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from planning.catalogue import (
    DatabaseFraudData,
    DatabaseInfrastructure,
    data_port,
    load_demo_systems,
)
from planning.core.catalogue import ToolCall
from planning.models import (
    EstateDatabase,
    EstateFailover,
    EstateHost,
    EstateIsolation,
    EstateNotice,
    FraudAccount,
    FraudAccountFreeze,
    FraudSanctionedParty,
    FraudTransaction,
)
from planning.packs import fraud, incident
from planning.packs.fraud.data import InMemoryFraudData
from planning.packs.incident.infrastructure import InMemoryInfrastructure

pytestmark = pytest.mark.django_db


class Stopped(Exception):
    pass


def _stop() -> None:
    raise Stopped


def _acting(port: DatabaseInfrastructure, key: str) -> DatabaseInfrastructure:
    return port.with_call(ToolCall(idempotency_key=key))


def test_the_demo_systems_are_loaded_once_and_the_packs_read_them_from_the_database() -> None:
    # The test database has them already (tests/conftest.py): loading again creates nothing.
    assert load_demo_systems() == {"invoice": 0, "incident": 0, "fraud": 0}
    assert isinstance(data_port(incident.PACK), DatabaseInfrastructure)
    assert isinstance(data_port(fraud.PACK), DatabaseFraudData)
    memory, database = InMemoryInfrastructure(), DatabaseInfrastructure()
    for service in ("orders-db", "inventory-db", "billing-db"):
        assert database.primary(service) == memory.primary(service)
        assert database.owners(service) == memory.owners(service)
    for host in ("web-1", "web-2", "db-orders-1", "db-orders-2", "db-inventory-2", "nope"):
        assert database.has_host(host) == memory.has_host(host)
        assert database.is_reachable(host) == memory.is_reachable(host)
    assert database.logs("web-2") == memory.logs("web-2")
    assert database.owners("web") == ("oncall@example.com",)
    accounts, in_memory = DatabaseFraudData(), InMemoryFraudData()
    for account in ("ACC-300", "ACC-410", "ACC-999"):
        assert accounts.has_account(account) == in_memory.has_account(account)
        assert accounts.transactions(account) == in_memory.transactions(account)
    assert accounts.sanctioned() == in_memory.sanctioned()


def test_make_runs_demo_seeding_loads_the_estate_and_the_accounts(
    settings: Any, tmp_path: Any
) -> None:
    for model in (EstateHost, EstateDatabase, FraudAccount, FraudTransaction, FraudSanctionedParty):
        model.objects.all().delete()
    settings.DEMO, settings.VAR_DIR = True, tmp_path
    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    assert "Loaded 11 rows of the incident pack's demo systems." in out.getvalue()
    assert "Loaded 9 rows of the fraud pack's demo systems." in out.getvalue()
    assert set(EstateDatabase.objects.values_list("service", flat=True)) == {
        "orders-db",
        "inventory-db",
        "billing-db",
    }
    assert DatabaseFraudData().has_account("ACC-300")


def test_a_fail_over_lasts_for_the_next_step_and_happens_once_per_key() -> None:
    estate = DatabaseInfrastructure()
    assert _acting(estate, "case-1:leaf-fail-over").fail_over("orders-db") == (
        "db-orders-1",
        "db-orders-2",
    )
    # A new port (as the next step gets) sees it.
    assert DatabaseInfrastructure().primary("orders-db") == "db-orders-2"
    assert DatabaseInfrastructure().is_reachable("db-orders-2")
    # The same leaf again (a lost attempt retried): the first fail-over's answer, no fail-back.
    again = _acting(estate, "case-1:leaf-fail-over")
    again.call = ToolCall(idempotency_key="case-1:leaf-fail-over", checkpoint=_stop)
    assert again.fail_over("orders-db") == ("db-orders-1", "db-orders-2")
    assert EstateFailover.objects.count() == 1
    orders = EstateDatabase.objects.get(service="orders-db")
    assert orders.current_primary == "db-orders-2"
    # What the estate says of the service is what is true now, not what the seed foretold.
    assert orders.description == "failed over: primary db-orders-2 up, replica db-orders-1 down"
    # Another leaf fails over again.
    assert _acting(estate, "case-2:leaf-fail-over").fail_over("orders-db") == (
        "db-orders-2",
        "db-orders-1",
    )
    assert EstateFailover.objects.count() == 2


def test_no_effect_happens_when_the_leaf_must_stop_at_its_safe_point() -> None:
    stopped = ToolCall(idempotency_key="case-1:leaf-x", checkpoint=_stop)
    with pytest.raises(Stopped):
        DatabaseInfrastructure(stopped).fail_over("orders-db")
    with pytest.raises(Stopped):
        DatabaseInfrastructure(stopped).isolate(["web-2"])
    with pytest.raises(Stopped):
        DatabaseInfrastructure(stopped).send(["a@example.com"], "hello")
    with pytest.raises(Stopped):
        DatabaseFraudData(stopped).freeze("ACC-300", "findings")
    assert DatabaseInfrastructure().primary("orders-db") == "db-orders-1"
    assert DatabaseInfrastructure().is_reachable("web-2")
    assert not EstateNotice.objects.exists() and not FraudAccountFreeze.objects.exists()


def test_a_failover_of_inventory_db_promotes_a_replica_that_does_not_answer() -> None:
    estate = _acting(DatabaseInfrastructure(), "case-1:leaf-fail-over")
    old, new = estate.fail_over("inventory-db")
    assert (old, new) == ("db-inventory-1", "db-inventory-2")
    assert not estate.is_reachable(new)
    with pytest.raises(LookupError):
        _acting(DatabaseInfrastructure(), "case-2:leaf-fail-over").fail_over("no-such-db")


def test_an_isolation_and_a_notice_happen_once_per_key() -> None:
    estate = DatabaseInfrastructure()
    for _ in range(2):
        assert _acting(estate, "case-1:leaf-isolate").isolate(["web-2", "web-2", "nope"]) == (
            "web-2",
        )
        _acting(estate, "case-1:leaf-notify").send(["a@example.com"], "orders-db is down")
    assert EstateIsolation.objects.count() == 1
    assert not estate.is_reachable("web-2")
    assert EstateHost.objects.get(name="web-2").is_isolated
    notice = EstateNotice.objects.get()
    assert (notice.recipients, notice.message) == (["a@example.com"], "orders-db is down")
    # Without a leaf (no key) every call acts.
    estate.send(["a@example.com"], "one")
    estate.send(["a@example.com"], "two")
    assert EstateNotice.objects.count() == 3


def test_a_freeze_is_on_the_account_once_per_key() -> None:
    data = DatabaseFraudData()
    ids = {
        data.with_call(ToolCall(idempotency_key="case-1:leaf-freeze-account")).freeze(
            "ACC-300", "serious fraud investigation findings"
        )
        for _ in range(3)
    }
    (freeze_id,) = ids
    assert freeze_id.startswith("FRZ-")
    assert DatabaseFraudData().freezes("ACC-300") == (freeze_id,)
    assert DatabaseFraudData().freezes("ACC-410") == ()
    assert fraud.PACK.goal_check is not None
    outputs = {"freeze-account": {"account_id": "ACC-300", "freeze_id": freeze_id}}
    assert list(fraud.PACK.goal_check(outputs, DatabaseFraudData()).problems) == []
    FraudAccountFreeze.objects.all().delete()
    assert list(fraud.PACK.goal_check(outputs, DatabaseFraudData()).problems) == [
        f"ACC-300 is not frozen: freeze {freeze_id} is not on the account"
    ]
