"""The auditor's pages: a case's trail with filters and the integrity banner, export, downloads."""

from __future__ import annotations

import io
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from audit import signing
from audit.chain import SYSTEM_CHAIN, append_event, case_chain
from audit.models import AuditEvent
from casehub_verify import verify_bundle
from planning.models import Case
from tests import personas
from tests.audit_triggers import audit_triggers_suspended
from tests.planning.factories import make_case

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def key_dir(settings: Any, tmp_path: Path) -> Path:
    settings.CASEHUB_SIGNING_KEY_DIR = tmp_path / "signing-keys"
    settings.CASEHUB_AUDIT_ANCHOR_DIR = tmp_path / "anchors"
    return settings.CASEHUB_SIGNING_KEY_DIR


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def tamper(sql: str, params: list[Any]) -> None:
    """Run a superuser's raw SQL on the audit table, as in psql, past its append-only triggers."""
    with transaction.atomic(), audit_triggers_suspended(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def trail_url(case: Case) -> str:
    return reverse("oversight:case-trail", args=[case.pk])


@pytest.fixture
def case() -> Case:
    case = make_case(personas.analyst())
    chain = case_chain(case.pk)
    append_event("planning.case.submitted", actor=case.submitter, chain=chain, data={"case": 1})
    append_event("planning.run.started", chain=chain, data={"case": case.pk})
    append_event(
        "planning.run.failed",
        chain=chain,
        data={"case": case.pk, "reason": "the model timed out"},
    )
    append_event(
        "config.agent.changed",
        actor="erp-lookup",
        chain=chain,
        data={"before": {"trust": 1, "model": "a"}, "after": {"trust": 3, "model": "a"}},
    )
    return case


def seqs(html: str) -> list[int]:
    return [int(seq) for seq in re.findall(r'<li class="trail-event" id="seq-(\d+)"', html)]


# Who may see it ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make", [personas.officer, personas.admin, personas.outsider, personas.second_officer]
)
def test_only_auditors_open_a_cases_trail(make: Any, case: Case) -> None:
    client = client_for(make())
    assert client.get(trail_url(case)).status_code == 403
    headers = {"HX-Request": "true", "HX-Target": "trail-events"}
    assert client.get(trail_url(case), headers=headers).status_code == 403
    export = reverse("oversight:case-trail-export", args=[case.pk])
    assert client.post(export).status_code == 403
    assert not AuditEvent.objects.filter(action="oversight.audit.exported").exists()


def test_the_submitting_analyst_cannot_open_their_own_cases_trail(case: Case) -> None:
    client = client_for(case.submitter)
    assert client.get(reverse("planning:case-detail", args=[case.pk])).status_code == 200
    assert client.get(trail_url(case)).status_code == 403
    assert client.post(reverse("oversight:case-trail-export", args=[case.pk])).status_code == 403


def test_visitors_are_sent_to_log_in(case: Case) -> None:
    response = Client().get(trail_url(case))
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_an_auditor_gets_404_for_a_case_that_does_not_exist(auditor: Any) -> None:
    client = client_for(auditor)
    assert client.get("/audit/cases/999999/").status_code == 404
    assert client.post("/audit/cases/999999/export").status_code == 404


def test_only_auditors_and_admins_download_the_verifier_and_keys(case: Case) -> None:
    key = signing.current_key()
    urls = [
        reverse("oversight:verifier-download"),
        reverse("oversight:public-key-download", args=[key.key_id]),
    ]
    for make in (personas.officer, personas.outsider):
        client = client_for(make())
        assert [client.get(url).status_code for url in urls] == [403, 403]
    for make in (personas.auditor, personas.admin):
        client = client_for(make())
        assert [client.get(url).status_code for url in urls] == [200, 200]


# The trail -----------------------------------------------------------------------------------


def test_an_auditor_reads_the_events_in_seq_order_with_their_details(
    auditor: Any, case: Case
) -> None:
    html = client_for(auditor).get(trail_url(case)).content.decode()
    assert seqs(html) == [1, 2, 3, 4]
    events = list(AuditEvent.objects.filter(chain=case_chain(case.pk)).order_by("seq"))
    for event in events:
        assert event.hash in html
        assert f'<code class="hash">{event.prev_hash}</code>' in html
    assert "<strong>Reason:</strong> the model timed out" in html
    # Before and after side by side, the changed field marked.
    assert re.search(
        r'<tr class="changed"><th scope="row">trust</th><td><pre class="json">1</pre>'
        r'</td><td><pre class="json">3</pre>',
        html,
    )
    assert '<tr><th scope="row">model</th>' in html
    assert "&quot;planning.case.submitted&quot;" not in html  # data shown, not the action as data
    assert "&quot;case&quot;: 1" in html


def test_each_event_shows_its_title_beside_its_code(auditor: Any, case: Case) -> None:
    html = client_for(auditor).get(trail_url(case)).content.decode()
    assert (
        '<span class="event-title">Case submitted</span>'
        '<code class="action event-code">planning.case.submitted</code>'
    ) in html
    assert '<span class="event-title">Agent changed</span>' in html
    # A code no longer registered (an older version's) is shown as it is, without a title.
    assert '<span class="seq">#2</span>' in html
    assert re.search(
        r'\)</span></span>\s*<code class="action event-code">planning\.run\.started</code>', html
    )


def test_filters_in_the_url_narrow_the_events(auditor: Any, case: Case) -> None:
    client = client_for(auditor)
    assert seqs(client.get(trail_url(case), {"action": "planning.run"}).content.decode()) == [2, 3]
    assert seqs(client.get(trail_url(case), {"actor": "ERP-lookup"}).content.decode()) == [4]
    assert seqs(client.get(trail_url(case), {"actor": "system"}).content.decode()) == [2, 3]
    today = timezone.localdate()
    tomorrow = (today + timedelta(days=1)).isoformat()
    yesterday = (today - timedelta(days=1)).isoformat()
    in_range = client.get(trail_url(case), {"from": today.isoformat(), "to": today.isoformat()})
    assert seqs(in_range.content.decode()) == [1, 2, 3, 4]
    assert seqs(client.get(trail_url(case), {"from": tomorrow}).content.decode()) == []
    assert seqs(client.get(trail_url(case), {"to": yesterday}).content.decode()) == []
    bad = client.get(trail_url(case), {"from": "yesterday"}).content.decode()
    assert "From is not a date" in bad
    assert seqs(bad) == [1, 2, 3, 4]


def test_the_htmx_filter_gets_only_the_event_list(auditor: Any, case: Case) -> None:
    headers = {"HX-Request": "true", "HX-Target": "trail-events"}
    response = client_for(auditor).get(trail_url(case), {"action": "config."}, headers=headers)
    assert response.content.decode().lstrip().startswith('<div id="trail-events"')
    assert seqs(response.content.decode()) == [4]
    assert "HX-Request" in response["Vary"]


def test_pages_keep_the_filters(auditor: Any) -> None:
    case = make_case(personas.analyst())
    for i in range(60):
        append_event("case.step", actor="erp", chain=case_chain(case.pk), data={"i": i})
    client = client_for(auditor)
    first = client.get(trail_url(case), {"actor": "erp"}).content.decode()
    assert seqs(first) == list(range(1, 51))
    assert 'href="?actor=erp&amp;page=2"' in first
    assert seqs(client.get(trail_url(case), {"actor": "erp", "page": 2}).content.decode()) == list(
        range(51, 61)
    )


def test_hostile_event_data_is_escaped(auditor: Any) -> None:
    case = make_case(personas.analyst())
    hostile = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    append_event(
        "case.step",
        actor=hostile,
        chain=case_chain(case.pk),
        data={"note": hostile, "reason": hostile, "before": {"x": hostile}, "after": {"x": 1}},
    )
    html = client_for(auditor).get(trail_url(case)).content.decode()
    assert "<script>alert" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_page_costs_the_same_queries_for_a_thousand_events(
    auditor: Any, django_assert_num_queries: Any
) -> None:
    from django.test.utils import CaptureQueriesContext

    small, big = make_case(personas.analyst()), make_case(personas.analyst("ben"))
    for i in range(3):
        append_event("case.step", chain=case_chain(small.pk), data={"i": i})
    with transaction.atomic():
        for i in range(1000):
            append_event("case.step", chain=case_chain(big.pk), data={"i": i})
    client = client_for(auditor)
    client.get(trail_url(small))
    with CaptureQueriesContext(connection) as few:
        client.get(trail_url(small))
    baseline = len(few.captured_queries)
    with django_assert_num_queries(baseline):
        response = client.get(trail_url(big))
    assert 'data-integrity="verified"' in response.content.decode()
    assert "Verified: 1000 events intact." in response.content.decode()
    with django_assert_num_queries(baseline):
        client.get(trail_url(big), {"page": 20, "action": "case."})
    assert baseline <= 12


# The integrity banner ------------------------------------------------------------------------


def test_an_intact_trail_shows_verified(auditor: Any, case: Case) -> None:
    html = client_for(auditor).get(trail_url(case)).content.decode()
    assert "Verified: 4 events intact." in html
    assert 'data-integrity="broken"' not in html


def test_a_changed_event_shows_broken_at_its_seq(auditor: Any, case: Case) -> None:
    table = AuditEvent._meta.db_table
    tamper(
        f"UPDATE {table} SET data = %s WHERE chain = %s AND seq = 3",  # noqa: S608
        ['{"case": 1, "reason": "nothing happened"}', case_chain(case.pk)],
    )
    html = client_for(auditor).get(trail_url(case)).content.decode()
    assert 'data-integrity="broken" data-seq="3"' in html
    assert "Broken at seq 3: changed: the hash does not match the event&#x27;s content" in html
    assert 'id="seq-3" data-seq="3" data-broken="true"' in html


def test_a_deleted_middle_event_shows_broken_at_the_next_seq(auditor: Any, case: Case) -> None:
    table = AuditEvent._meta.db_table
    tamper(
        f"DELETE FROM {table} WHERE chain = %s AND seq = 2",  # noqa: S608
        [case_chain(case.pk)],
    )
    html = client_for(auditor).get(trail_url(case)).content.decode()
    assert "Broken at seq 3: missing: seq 2 should come before it" in html


# Export and downloads ------------------------------------------------------------------------


def test_the_export_button_downloads_a_bundle_the_verifier_accepts(
    auditor: Any, case: Case
) -> None:
    client = client_for(auditor)
    html = client.get(trail_url(case)).content.decode()
    export_url = reverse("oversight:case-trail-export", args=[case.pk])
    assert f'action="{export_url}"' in html
    assert client.get(export_url).status_code == 405
    response = client.post(export_url)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert f'filename="casehub-case-{case.pk}-audit.zip"' in response["Content-Disposition"]
    raw = b"".join(response.streaming_content)
    key = signing.current_key()
    report = verify_bundle(io.BytesIO(raw), trusted_keys=[key.public_key])
    assert report.ok, report.problems
    assert report.events == 4
    exported = AuditEvent.objects.get(chain=SYSTEM_CHAIN, action="oversight.audit.exported")
    assert exported.actor_user == auditor
    assert exported.data["scope"] == {"case": case.pk, "chain": case_chain(case.pk)}


def test_the_verifier_download_is_the_files_bytes(auditor: Any) -> None:
    response = client_for(auditor).get(reverse("oversight:verifier-download"))
    assert response.status_code == 200
    assert 'filename="casehub_verify.py"' in response["Content-Disposition"]
    expected = (Path(django_settings.BASE_DIR) / "casehub_verify.py").read_bytes()
    assert b"".join(response.streaming_content) == expected


def test_the_page_shows_the_current_and_retired_keys_for_download(auditor: Any, case: Case) -> None:
    client = client_for(auditor)
    assert 'data-note="no-key"' in client.get(trail_url(case)).content.decode()
    old = signing.current_key()
    _, new = signing.rotate_signing_key()
    html = client.get(trail_url(case)).content.decode()
    for key, state in ((new, "current"), (old, "retired")):
        row = re.search(rf'<tr data-key="{key.key_id}">(.*?)</tr>', html, re.S)
        assert row is not None
        assert key.public_key.hex() in row.group(1)
        assert f"<td>{state}</td>" in row.group(1)
    assert html.index(new.key_id) < html.index(old.key_id)
    response = client.get(reverse("oversight:public-key-download", args=[old.key_id]))
    assert response.content.decode() == f"{old.public_key.hex()}\n"
    assert client.get("/audit/keys/0000000000000000.pub").status_code == 404


def test_the_key_list_shows_the_key_the_first_export_made(auditor: Any, case: Case) -> None:
    client = client_for(auditor)
    html = client.get(trail_url(case)).content.decode()
    region = html.split('<div id="signing-keys"', 1)[1].split(">", 1)[0]
    # Before any export: no key, and the list asks again once the export form is sent.
    assert 'data-note="no-key"' in html
    assert 'hx-trigger="formdata from:.export-form delay:1s"' in region
    assert f'hx-get="{trail_url(case)}?key_wait=1"' in region

    def key_list(wait: int) -> str:
        response = client.get(
            trail_url(case),
            {"key_wait": wait},
            headers={"HX-Request": "true", "HX-Target": "signing-keys"},
        )
        assert response.status_code == 200
        return response.content.decode()

    # Asked before the export has made the key: it asks again a moment later.
    waiting = key_list(1)
    assert "<h1>" not in waiting and 'data-note="no-key"' in waiting
    assert 'hx-trigger="load delay:1s"' in waiting and "key_wait=2" in waiting
    client.post(reverse("oversight:case-trail-export", args=[case.pk]))
    key = signing.current_key()
    shown = key_list(2)
    assert "<h1>" not in shown
    assert f'<tr data-key="{key.key_id}">' in shown and "<td>current</td>" in shown
    assert "hx-get" not in shown.split("<table", 1)[0]


# Links to the trail --------------------------------------------------------------------------


def test_the_audit_list_links_case_chains_to_their_trail(auditor: Any, case: Case) -> None:
    append_event("auth.login.failed", data={"username": "mallory"})
    html = client_for(auditor).get("/audit/").content.decode()
    assert f'<a href="{trail_url(case)}" data-link="case-trail">case:{case.pk}</a>' in html
    assert "<td>system</td>" in html


def test_the_audit_list_shows_titles_and_codes_escaped(auditor: Any, case: Case) -> None:
    append_event("auth.login.failed", data={"username": "mallory"})
    append_event("ci.audit.checked")
    append_event("x.<b>bold</b>")
    html = client_for(auditor).get("/audit/").content.decode()
    assert (
        '<td><span class="event-title">Sign-in failed</span> '
        '<code class="event-code">auth.login.failed</code></td>'
    ) in html
    assert '<td><code class="event-code">ci.audit.checked</code></td>' in html
    assert '<td><code class="event-code">x.&lt;b&gt;bold&lt;/b&gt;</code></td>' in html
    assert '<th scope="col">Event</th>' in html


def test_the_case_page_links_to_its_trail_for_auditors_only(auditor: Any, case: Case) -> None:
    link = f'href="{trail_url(case)}" data-link="audit-trail"'
    detail = reverse("planning:case-detail", args=[case.pk])
    assert link in client_for(auditor).get(detail).content.decode()
    assert link not in client_for(personas.officer()).get(detail).content.decode()
    assert link not in client_for(case.submitter).get(detail).content.decode()


def test_the_banner_names_the_checkpoint_it_compared_against(auditor: Any, case: Case) -> None:
    from audit.checkpoints import write_checkpoints

    client = client_for(auditor)
    assert "no checkpoint of it yet" in client.get(trail_url(case)).content.decode()
    write_checkpoints()
    html = client.get(trail_url(case)).content.decode()
    assert "Verified: 4 events intact." in html
    assert "and against its last checkpoint (seq 4)" in html


def test_a_tail_rolled_back_after_its_checkpoint_shows_broken(auditor: Any, case: Case) -> None:
    from audit.checkpoints import write_checkpoints
    from audit.models import AuditChainHead

    write_checkpoints()
    chain = case_chain(case.pk)
    last = AuditEvent.objects.get(chain=chain, seq=3)
    tamper(
        f"DELETE FROM {AuditEvent._meta.db_table} WHERE chain = %s AND seq = 4",  # noqa: S608
        [chain],
    )
    AuditChainHead.objects.filter(chain=chain).update(seq=3, head_hash=last.hash)
    html = client_for(auditor).get(trail_url(case)).content.decode()
    assert 'data-integrity="broken" data-seq="4"' in html
    assert "Broken at seq 4: rollback: the chain ends at seq 3" in html
