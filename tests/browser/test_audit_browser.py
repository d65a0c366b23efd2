"""The auditor's trail page in a real browser: from the case page to the trail, the banner,
filters through htmx with the URL kept, the export downloaded and verified offline, and the key it
made listed at once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from audit import signing
from audit.chain import append_event, case_chain
from casehub_verify import verify_bundle_file
from tests import personas
from tests.browser.test_case_flow import _log_in, _watch_console
from tests.planning.factories import make_case

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_auditor_opens_a_cases_trail_filters_it_and_exports_it(
    page: Any, settings: Any, tmp_path: Path
) -> None:
    settings.CASEHUB_SIGNING_KEY_DIR = tmp_path / "signing-keys"
    settings.CASEHUB_AUDIT_ANCHOR_DIR = tmp_path / "anchors"
    case = make_case(personas.analyst())
    chain = case_chain(case.pk)
    append_event("planning.case.submitted", actor=case.submitter, chain=chain, data={"n": 1})
    append_event("planning.plan.started", chain=chain, data={"case": case.pk})
    append_event("planning.plan.materialised", chain=chain, data={"case": case.pk})
    auditor = personas.auditor()
    problems = _watch_console(page)
    _log_in(page, auditor.username)

    page.goto(f"/cases/{case.pk}/")
    page.click('[data-link="audit-trail"]')
    page.wait_for_selector('[data-integrity="verified"]')
    assert "Verified: 3 events intact." in page.inner_text("[data-integrity]")
    assert page.locator("li.trail-event").count() == 3

    page.fill("input[name=action]", "planning.plan")
    page.click(".filters button[type=submit]")
    page.wait_for_url(re.compile(r"action=planning\.plan"))
    page.wait_for_function("document.querySelectorAll('li.trail-event').length === 2")
    page.reload()
    assert page.locator("li.trail-event").count() == 2

    with page.expect_download() as download:
        page.click('[data-action="export"]')
    target = tmp_path / "bundle.zip"
    download.value.save_as(target)
    report = verify_bundle_file(str(target), trusted_keys=[signing.current_key().public_key])
    assert report.ok and report.events == 3, report.problems
    # The first export made the signing key: the page lists it, to download, without a reload.
    key = signing.current_key()
    page.wait_for_selector(f'#signing-keys tr[data-key="{key.key_id}"]')
    assert page.locator('[data-note="no-key"]').count() == 0
    assert problems == []
