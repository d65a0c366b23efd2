"""Case pages: submit a case, list cases, and watch a case's plan as a DAG and a task table."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.middleware import HtmxDetails

from planning.actions import CaseInvalid, submit_case
from planning.dot import STATUS_COLOURS, plan_dot
from planning.forms import CaseForm
from planning.models import Case, CaseStatus, NodeStatus, PlanNode, Strategy
from planning.planner import DEFAULT_BRANCHING, expected_llm_calls, pack_choices
from planning.queries import can_view_all_cases, case_for, plan_nodes, visible_cases

CASES_PER_PAGE = 25
POLL_INTERVAL = "every 2s"


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _partial(request: HtmxHttpRequest, template: str, allowed: set[str]) -> str:
    """Return the template, or one of its partials when htmx targets an allowed region."""
    if request.htmx and request.htmx.target in allowed:
        return f"{template}#{request.htmx.target}"
    return template


def _require_case_reader(request: HtmxHttpRequest) -> None:
    user = request.user
    if not (can_view_all_cases(user) or user.has_perm("oversight.submit_case")):
        raise PermissionDenied("Only analysts, compliance officers and auditors read cases.")


# Submitting a case -------------------------------------------------------------------------


def llm_estimate(strategy: str, max_depth: Any) -> str:
    """Return the sentence that tells the analyst how many LLM calls the plan may take."""
    try:
        depth = int(max_depth)
    except (TypeError, ValueError):
        return "Choose a depth between 1 and 5 to see the expected LLM calls."
    if not 1 <= depth <= 5:
        return "Choose a depth between 1 and 5 to see the expected LLM calls."
    calls = expected_llm_calls(strategy, depth)
    if calls is None:
        return "No LLM calls: this strategy plans from the domain pack's methods."
    plural = "call" if calls == 1 else "calls"
    text = f"Up to {calls} LLM {plural} (b = {DEFAULT_BRANCHING}, depth {depth})"
    if strategy == Strategy.HYBRID:
        text += ", fewer when static methods cover part of the plan"
    return text + "."


def _case_form(data: QueryDict | None, values: QueryDict) -> CaseForm:
    packs = pack_choices()
    domain = values.get("domain", "")
    schema = next((pack.input_schema for row, pack in packs if row.slug == domain), None)
    domains = [(row.slug, row.name) for row, _ in packs]
    if data is not None:
        return CaseForm(data, domains=domains, schema=schema)
    # A GET (also the htmx swaps) keeps what was typed so far, without showing errors.
    initial = {key: values.get(key) for key in values if key != "csrfmiddlewaretoken"}
    for key, value in initial.items():
        if key.startswith("input_") and value == "on":
            initial[key] = True
    return CaseForm(domains=domains, schema=schema, initial=initial)


def _form_context(form: CaseForm) -> dict[str, object]:
    value = form["strategy"].value() or Strategy.STATIC
    depth = form["max_depth"].value()
    domain = form["domain"].value() or ""
    labels = dict(form.fields["domain"].choices)  # type: ignore[attr-defined]
    return {
        "form": form,
        "estimate": llm_estimate(str(value), depth),
        "domain_label": labels.get(domain, domain),
    }


@require_http_methods(["GET", "POST"])
def case_new(request: HtmxHttpRequest) -> HttpResponse:
    """Show the case form (htmx swaps the domain's inputs and the LLM estimate); submit it."""
    if not request.user.has_perm("oversight.submit_case"):
        raise PermissionDenied("Only analysts submit cases.")
    template = "planning/case_new.html"
    if request.method == "GET":
        form = _case_form(None, request.GET)
        return render(
            request, _partial(request, template, {"domain-inputs", "llm-estimate"}),
            _form_context(form),
        )  # fmt: skip
    form = _case_form(request.POST, request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            case = submit_case(
                submitter=request.user,  # type: ignore[arg-type]
                title=data["title"],
                goal=data["goal"],
                description=data["description"],
                inputs=form.inputs(),
                domain=data["domain"],
                strategy=data["strategy"],
                max_depth=data["max_depth"],
            )
        except CaseInvalid as exc:
            form.add_case_errors(exc.errors)
        else:
            return redirect("planning:case-detail", case_id=case.pk)
    return render(request, template, _form_context(form), status=422)


# Listing cases -----------------------------------------------------------------------------


@require_GET
def case_list(request: HtmxHttpRequest) -> HttpResponse:
    """List the cases the user may read, newest first, filtered by status, domain and owner."""
    _require_case_reader(request)
    cases = visible_cases(request.user)
    status = request.GET.get("status", "")
    domain = request.GET.get("domain", "")
    sees_all = can_view_all_cases(request.user)
    mine = sees_all and request.GET.get("mine", "") in {"1", "on", "true"}
    if status in CaseStatus.values:
        cases = cases.filter(status=status)
    else:
        status = ""
    if domain == "none":
        cases = cases.filter(domain="")
    elif domain:
        cases = cases.filter(domain=domain)
    if mine:
        cases = cases.filter(submitter=request.user)
    page = Paginator(cases, CASES_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "status": status,
        "domain": domain,
        "mine": mine,
        "sees_all": sees_all,
        "statuses": CaseStatus.values,
        "domains": [(row.slug, row.name) for row, _ in pack_choices()],
        "query": query.urlencode(),
        "can_submit": request.user.has_perm("oversight.submit_case"),
    }
    return render(request, _partial(request, "planning/case_list.html", {"case-table"}), context)


# One case ----------------------------------------------------------------------------------


def _node_url(case_id: int) -> Any:
    # One reverse() for the whole plan: a 500-leaf page would otherwise resolve 500 times.
    marker = 987654321
    pattern = reverse("planning:node-detail", kwargs={"case_id": case_id, "node_id": marker})
    head, tail = pattern.rsplit(str(marker), 1)
    return lambda node: f"{head}{node.pk}{tail}"


def _case_context(case: Case, selected: int | None = None) -> dict[str, object]:
    nodes = list(plan_nodes(case))
    leaves = [node for node in nodes if node.is_leaf]
    url_for = _node_url(case.pk)
    for node in nodes:
        node.url = url_for(node)  # type: ignore[attr-defined]
    by_key = {node.key: node for node in nodes}
    parents = {node.pk: node for node in nodes if not node.is_leaf}
    rows = [
        {
            "node": leaf,
            # The root compound is the plan itself: only name the groups below it.
            "parent": parents.get(leaf.parent_id) if leaf.depth > 1 else None,
            "depends_on": [by_key[key] for key in leaf.depends_on if key in by_key],
        }
        for leaf in leaves
    ]
    counts: dict[str, int] = {}
    for leaf in leaves:
        counts[leaf.status] = counts.get(leaf.status, 0) + 1
    version = case.current_version
    return {
        "case": case,
        "version": version,
        "warnings": list(version.warnings) if version else [],
        "rows": rows,
        "leaf_count": len(leaves),
        "status_counts": sorted(counts.items()),
        "dot": plan_dot(nodes, url_for=url_for, selected=selected) if nodes else "",
        "poll": POLL_INTERVAL if case.is_live else "",
        "legend": [(s.value, s.label) for s in NodeStatus if s in STATUS_COLOURS],
    }


@require_GET
def case_detail(request: HtmxHttpRequest, case_id: int) -> HttpResponse:
    """Show a case: its status, plan warnings, DAG, task table and a node panel."""
    case = case_for(request.user, case_id)
    template = _partial(request, "planning/case_detail.html", {"case-live", "node-panel"})
    return render(request, template, _case_context(case))


@require_GET
def node_detail(request: HtmxHttpRequest, case_id: int, node_id: int) -> HttpResponse:
    """Show one node of a case's plan: in the page's side panel (htmx) or as its own page."""
    case = case_for(request.user, case_id)
    try:
        node = PlanNode.objects.select_related("parent", "version").get(
            pk=node_id, version__case=case
        )
    except PlanNode.DoesNotExist:
        raise Http404("No such node in this case") from None
    url_for = _node_url(case.pk)
    siblings = {
        row.key: row
        for row in PlanNode.objects.filter(version_id=node.version_id, key__in=node.depends_on)
    }
    dependencies = [(key, siblings.get(key)) for key in node.depends_on]
    for _, dependency in dependencies:
        if dependency is not None:
            dependency.url = url_for(dependency)  # type: ignore[attr-defined]
    context = {
        "case": case,
        "node": node,
        "dependencies": dependencies,
        "is_current": node.version_id == case.current_version_id,
        "inputs_json": json.dumps(node.inputs, indent=2, ensure_ascii=False, sort_keys=True),
        "close_url": reverse("planning:case-detail", kwargs={"case_id": case.pk}),
    }
    template = _partial(request, "planning/node_detail.html", {"node-panel"})
    return render(request, template, context)
