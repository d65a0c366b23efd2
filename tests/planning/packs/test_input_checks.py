"""Case inputs are checked against the pack's data at submission, in the user's words."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from pydantic import ValidationError

from accounts import tokens as api_tokens
from audit.models import AuditEvent
from planning.actions import CaseInvalid, submit_case
from planning.catalogue import load_demo_erp, load_demo_systems
from planning.models import Case, ErpInvoiceDocument, EstateHost, FraudAccount
from planning.packs import PACKS, fraud, incident, invoice
from planning.packs.fraud.data import InMemoryFraudData
from planning.packs.incident.infrastructure import InMemoryInfrastructure
from planning.packs.invoice.erp import InMemoryErp
from planning.packs.invoice.tools import InvoiceFields, SupplierQuery
from tests import personas

INVOICE_SHAPE = "An invoice number looks like INV-1042."


# The packs' checks on their in-memory data (no database) -----------------------------------


def test_an_invoice_the_erp_does_not_hold_is_a_problem_of_its_field() -> None:
    erp = InMemoryErp()
    assert invoice.PACK.check_inputs({"invoice_id": "INV-1042"}, erp) == {}
    assert invoice.PACK.check_inputs({"invoice_id": "INV-9999"}, erp) == {
        "inputs.invoice_id": ["INV-9999 is not in the ERP."]
    }


def test_identifier_errors_read_in_plain_words_wherever_the_models_validate() -> None:
    problems = invoice.PACK.check_inputs({"invoice_id": "1042"}, InMemoryErp())
    assert problems == {"inputs.invoice_id": [INVOICE_SHAPE]}
    with pytest.raises(ValidationError) as exc:
        SupplierQuery.model_validate({"supplier_id": "ACME"})
    assert [e["msg"] for e in exc.value.errors()] == ["A supplier number looks like SUP-1001."]
    with pytest.raises(ValidationError) as exc:
        InvoiceFields.model_validate(
            {
                "invoice_id": "INV-1",
                "supplier_id": "SUP-1001",
                "po_number": "5001",
                "invoice_date": "2026-10-01",
                "currency": "EUR",
                "total": "1",
                "line_items": [],
            }
        )
    assert {e["loc"][0]: e["msg"] for e in exc.value.errors()} == {
        "invoice_id": INVOICE_SHAPE,
        "po_number": "A purchase order number looks like PO-5001.",
    }
    problems = fraud.PACK.check_inputs({"account_id": "300", "amount": "1"}, InMemoryFraudData())
    assert problems == {"inputs.account_id": ["An account number looks like ACC-300."]}


@pytest.mark.parametrize("slug", sorted(PACKS))
def test_the_patterns_stay_in_the_json_schema_for_the_browser_and_the_api_docs(slug: str) -> None:
    schema = PACKS[slug].input_schema.model_json_schema()
    for prop in schema["properties"].values():
        if "pattern" in prop:
            assert prop["examples"]
    if slug == "invoice":
        assert schema["properties"]["invoice_id"]["pattern"] == "^INV-[0-9]{4,}$"


def test_the_data_is_checked_only_for_fields_the_schema_accepts() -> None:
    data = InMemoryFraudData()
    problems = fraud.PACK.check_inputs(
        {"account_id": "ACC-999", "amount": "-5", "prior_flags": "many"}, data
    )
    assert set(problems) == {"inputs.account_id", "inputs.amount", "inputs.prior_flags"}
    assert problems["inputs.account_id"] == ["ACC-999 is not a known account."]
    # A malformed account number gets the shape message, not a lookup as well.
    problems = fraud.PACK.check_inputs({"account_id": "ACC-x", "amount": "5"}, data)
    assert problems == {"inputs.account_id": ["An account number looks like ACC-300."]}
    assert fraud.PACK.check_inputs({"account_id": "ACC-410", "amount": "5"}, data) == {}


def test_without_a_port_only_the_schema_is_checked() -> None:
    assert invoice.PACK.check_inputs({"invoice_id": "INV-9999"}, None) == {}


def test_an_incident_names_a_database_the_estate_runs_and_hosts_it_has() -> None:
    infra = InMemoryInfrastructure()
    problems = incident.PACK.check_inputs(
        {
            "kind": "database-outage",
            "service": "orders-dbx",
            "affected_hosts": ["web-2", "web-9", "db-orders-1", "mainframe"],
        },
        infra,
    )
    assert problems == {
        "inputs.service": ["orders-dbx is not a known database service."],
        "inputs.affected_hosts.1": ["web-9 is not a known host."],
        "inputs.affected_hosts.3": ["mainframe is not a known host."],
    }
    # Other kinds may name any service: the notifications fall back to the on-call list.
    breach = {"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]}
    assert incident.PACK.check_inputs(breach, infra) == {}


def test_each_pack_offers_what_its_systems_hold_read_through_its_port() -> None:
    assert fraud.PACK.input_suggestions(InMemoryFraudData()) == {
        "account_id": {
            "ACC-300": "two large payments to Oceanic Holdings Ltd, a sanctioned company",
            "ACC-410": "ordinary activity: one small payment",
        }
    }
    offered = incident.PACK.input_suggestions(InMemoryInfrastructure())
    assert set(offered["kind"]) == {"database-outage", "security-breach"}
    assert set(offered["service"]) == {"orders-db", "inventory-db", "billing-db"}
    assert {"web-1", "web-2", "db-orders-1"} <= set(offered["affected_hosts"])
    assert set(invoice.PACK.input_suggestions(InMemoryErp())["invoice_id"]) >= {
        "INV-1042",
        "INV-1043",
    }
    assert invoice.PACK.input_suggestions(None) == {}


# Submission reads the database's ERP ----------------------------------------------------------


@pytest.fixture
def erp(db: None) -> None:
    load_demo_erp()


def _submit(user: Any, **fields: Any) -> Case:
    values: dict[str, Any] = {
        "title": "Verify an invoice",
        "goal": "Verify the invoice before it is paid",
        "domain": "invoice",
        "strategy": "static",
        "inputs": {"invoice_id": "INV-1042"},
    }
    values.update(fields)
    return submit_case(submitter=user, **values)


def test_an_unknown_invoice_is_refused_at_submission_and_nothing_is_written(
    erp: None, django_capture_on_commit_callbacks: Any
) -> None:
    analyst = personas.analyst()
    events = AuditEvent.objects.count()
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(CaseInvalid) as exc:
        _submit(analyst, inputs={"invoice_id": "INV-9999"})
    assert exc.value.errors == {"inputs.invoice_id": ["INV-9999 is not in the ERP."]}
    assert not Case.objects.exists()
    assert AuditEvent.objects.count() == events
    assert callbacks == []
    assert _submit(analyst).inputs["invoice_id"] == "INV-1042"


def test_the_check_reads_the_database_not_the_demo_data(erp: None) -> None:
    ErpInvoiceDocument.objects.filter(invoice_id="INV-1044").delete()
    with pytest.raises(CaseInvalid) as exc:
        _submit(personas.analyst(), inputs={"invoice_id": "INV-1044"})
    assert exc.value.errors == {"inputs.invoice_id": ["INV-1044 is not in the ERP."]}


def test_a_malformed_invoice_number_is_explained_not_quoted_as_a_pattern(erp: None) -> None:
    with pytest.raises(CaseInvalid) as exc:
        _submit(personas.analyst(), inputs={"invoice_id": "1042"})
    assert exc.value.errors == {"inputs.invoice_id": [INVOICE_SHAPE]}
    assert "pattern" not in str(exc.value.errors)


def test_every_invalid_field_is_reported_at_once(erp: None) -> None:
    analyst = personas.analyst()
    with pytest.raises(CaseInvalid) as exc:
        _submit(
            analyst,
            title="",
            domain="fraud",
            inputs={"account_id": "ACC-999", "amount": "-5", "surprise": True},
        )
    errors = exc.value.errors
    assert set(errors) == {"title", "inputs.account_id", "inputs.amount", "inputs.surprise"}
    assert errors["inputs.account_id"] == ["ACC-999 is not a known account."]
    with pytest.raises(CaseInvalid) as exc:
        _submit(
            analyst,
            domain="incident",
            inputs={"kind": "database-outage", "service": "orders-dbx", "affected_hosts": ["x"]},
        )
    assert set(exc.value.errors) == {"inputs.service", "inputs.affected_hosts.0"}
    assert not Case.objects.exists()


def test_the_api_answers_an_unknown_invoice_with_a_422_in_the_same_words(erp: None) -> None:
    client = Client(
        headers={"Authorization": f"Bearer {api_tokens.issue_api_token(personas.analyst())}"}
    )
    body = {
        "title": "Check INV-9999",
        "goal": "Verify invoice INV-9999",
        "domain": "invoice",
        "strategy": "static",
        "inputs": {"invoice_id": "INV-9999"},
    }
    response = client.post("/api/cases", json.dumps(body), content_type="application/json")
    assert response.status_code == 422
    assert response.json()["fields"] == {"inputs.invoice_id": ["INV-9999 is not in the ERP."]}
    body["inputs"] = {"invoice_id": "INV-12"}
    response = client.post("/api/cases", json.dumps(body), content_type="application/json")
    assert response.json()["fields"] == {"inputs.invoice_id": [INVOICE_SHAPE]}
    assert not Case.objects.exists()


def test_the_form_shows_the_problem_next_to_the_invoice_field(erp: None) -> None:
    client = Client()
    client.force_login(personas.analyst())
    response = client.post(
        reverse("planning:case-new"),
        {
            "domain": "invoice", "title": "t", "goal": "g", "strategy": "static",
            "max_depth": "2", "input_invoice_id": "INV-9999",
        },
    )  # fmt: skip
    assert response.status_code == 422
    page = response.content.decode()
    field = page.split('data-field="input_invoice_id"', 1)[1].split("data-field=", 1)[0]
    assert "INV-9999 is not in the ERP." in field
    assert not Case.objects.exists()


def test_the_form_reports_every_invalid_field_in_one_round(erp: None) -> None:
    # A missing title, a malformed amount (the schema) and an unknown account (the data):
    # one answer names all three, as docs/planning.md says.
    client = Client()
    client.force_login(personas.analyst())
    response = client.post(
        reverse("planning:case-new"),
        {
            "domain": "fraud", "title": "", "goal": "g", "strategy": "static",
            "max_depth": "2", "input_account_id": "ACC-999", "input_amount": "-5",
        },
    )  # fmt: skip
    assert response.status_code == 422
    page = response.content.decode()

    def field(name: str) -> str:
        return page.split(f'data-field="{name}"', 1)[1].split("data-field=", 1)[0]

    assert "A title is required." in field("title")
    assert "ACC-999 is not a known account." in field("input_account_id")
    assert "At least 0.0." in field("input_amount")
    assert not Case.objects.exists()


@pytest.mark.django_db
def test_the_form_offers_the_accounts_services_hosts_and_invoices_the_database_holds() -> None:
    load_demo_systems()
    # What the systems hold now, not the demo data: an account added, a host gone.
    FraudAccount.objects.create(account_id="ACC-777", description="opened <yesterday>")
    EstateHost.objects.filter(name="web-1").delete()
    client = Client()
    client.force_login(personas.analyst())

    def form(domain: str) -> str:
        page = client.get(reverse("planning:case-new"), {"domain": domain})
        return page.content.decode()

    fraud_form = form("fraud")
    assert 'list="id_input_account_id-options"' in fraud_form
    options = fraud_form.split('<datalist id="id_input_account_id-options">', 1)[1]
    options = options.split("</datalist>", 1)[0]
    assert '<option value="ACC-300">two large payments' in options
    assert '<option value="ACC-777">opened &lt;yesterday&gt;</option>' in options
    incident_form = form("incident")
    services = incident_form.split('<datalist id="id_input_service-options">', 1)[1]
    assert '<option value="orders-db">' in services.split("</datalist>", 1)[0]
    hosts = incident_form.split('id="id_input_affected_hosts_helptext">', 1)[1].split("</div>")[0]
    assert "Known: db-billing-1" in hosts and "web-2." in hosts and "web-1," not in hosts
    invoices = form("invoice").split('<datalist id="id_input_invoice_id-options">', 1)[1]
    assert '<option value="INV-1042"></option>' in invoices.split("</datalist>", 1)[0]
