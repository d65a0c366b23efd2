"""The policy what-if pages (admins): ask what a pending policy version would have done to the
plans of a period, and read the report while it runs and once it is done."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods

from oversight.actions.policies import PolicyConflict, PolicyDenied, PolicyInvalid
from oversight.actions.whatif import DEFAULT_DAYS, request_whatif
from oversight.forms import WhatIfForm
from oversight.models import PolicyVersion, PolicyWhatIf
from oversight.policy import PolicySettings, loosening
from oversight.queries import may_configure, policy_versions_for, whatifs_for
from oversight.whatif import CHANGE_LABELS, CHANGES, CLASS_LABELS, CLASSES
from planning import rules
from planning.models import Case
from web.http import HtmxHttpRequest, render_partial

# Reports of one version listed on its what-if page.
RECENT_REPORTS = 10


def _require_admin(request: HtmxHttpRequest) -> None:
    if not may_configure(request.user):
        raise PermissionDenied("Only admins run and read policy what-ifs.")


def _settings(values: Any) -> PolicySettings:
    try:
        return PolicySettings.from_data(values)
    except ValueError:
        return PolicySettings()


@require_http_methods(["GET", "POST"])
def policy_whatif(request: HtmxHttpRequest, version_id: int) -> HttpResponse:
    """Show the what-if form of a policy version and its earlier reports; POST starts one.

    Raises PermissionDenied for anyone but an admin (a POST's refusal is audited), Http404 for
    no such version. A bad period answers 422; a version that is not pending 409.
    """
    _require_admin(request)
    try:
        version = policy_versions_for(request.user).get(pk=version_id)
    except PolicyVersion.DoesNotExist:
        raise Http404("No such policy version") from None
    status = 200
    if request.method == "POST":
        form = WhatIfForm(request.POST)
        if form.is_valid():
            start, end = form.period()
            try:
                report = request_whatif(request.user, version, start=start, end=end)
            except PolicyDenied as exc:
                raise PermissionDenied(str(exc)) from exc
            except PolicyInvalid as exc:
                form.add_error(None, exc.message)
                status = 422
            except PolicyConflict as exc:
                form.add_error(None, str(exc))
                status = 409
            else:
                return redirect("oversight:whatif-report", report.pk)
        else:
            status = 422
    else:
        form = WhatIfForm(initial=WhatIfForm.initial_for(DEFAULT_DAYS))
    reports = list(
        whatifs_for(request.user)
        .filter(policy_version=version)
        .defer("cases", "base_values")[:RECENT_REPORTS]
    )
    context = {
        "version": version,
        "form": form,
        "reports": reports,
        "is_pending": version.status == PolicyVersion.Status.PENDING,
        "days": DEFAULT_DAYS,
    }
    return render_partial(request, "oversight/whatif_new.html", context, partials=(), status=status)


@require_GET
def whatif_report(request: HtmxHttpRequest, whatif_id: int) -> HttpResponse:
    """Show a what-if report: its progress while it runs, then its totals and changed cases.

    The `whatif-report` partial is what the page polls until the report is finished. Raises
    PermissionDenied for anyone but an admin, Http404 for no such report.
    """
    _require_admin(request)
    try:
        report = whatifs_for(request.user).get(pk=whatif_id)
    except PolicyWhatIf.DoesNotExist:
        raise Http404("No such what-if report") from None
    context = report_context(request, report)
    return render_partial(
        request, "oversight/whatif_report.html", context, partials={"whatif-report"}
    )


def report_context(request: HtmxHttpRequest, report: PolicyWhatIf) -> dict[str, Any]:
    """Return what the report page (and its partial) shows of a report."""
    summary = report.summary or {}
    changes = summary.get("changes", {})
    before, after = summary.get("before", {}), summary.get("after", {})
    titles = rules.can_view_all_cases(request.user)
    rows = report.cases if report.status == PolicyWhatIf.Status.DONE else []
    shown = (
        dict(Case.objects.filter(pk__in=[r["case"] for r in rows]).values_list("pk", "title"))
        if titles and rows
        else {}
    )
    cases = [
        {
            **row,
            "title": shown.get(row["case"], ""),
            "counts": [(CHANGE_LABELS[k], n) for k, n in row.get("counts", {}).items()],
            "steps": [
                {
                    **step,
                    "change_label": CHANGE_LABELS.get(step["change"], step["change"]),
                    "before_label": CLASS_LABELS.get(step["before"], step["before"]),
                    "after_label": CLASS_LABELS.get(step["after"], step["after"]),
                }
                for step in row.get("steps", [])
            ],
        }
        for row in rows
    ]
    words = loosening(_settings(report.base_values), _settings(report.policy_version.values))
    return {
        "report": report,
        "version": report.policy_version,
        "loosening": words,
        "totals": [(kind, CHANGE_LABELS[kind], int(changes.get(kind, 0))) for kind in CHANGES],
        "classes": [
            (CLASS_LABELS[name], int(before.get(name, 0)), int(after.get(name, 0)))
            for name in CLASSES
        ],
        "cases": cases,
        "titles": titles,
        "more_cases": max(0, int(summary.get("changed_cases", 0)) - len(cases)),
        # Case pages for those who read every case; the case's figures page for admins.
        "case_url": "planning:case-detail" if titles else "quality:case-quality",
    }
