"""Case pages: submit a case, list cases, and watch a case's plan as a DAG and a task table."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods
from pydantic import BaseModel

from audit.chain import case_chain
from audit.models import AuditEvent
from planning import rules
from planning.actions import (
    CaseInvalid,
    SubmissionRateLimited,
    check_submission_rate,
    submit_case,
)
from planning.catalogue import data_port, registered_packs
from planning.core.llm.budget import ScopeStatus, format_usd
from planning.display import ValueRow, duration, value_rows
from planning.dot import STATUS_COLOURS, plan_dot
from planning.estimates import LlmSteps, form_llm_steps, llm_steps, rounds_per_step
from planning.forms import INPUT_PREFIX, INPUTS_OF, CaseForm, InputCheck, input_field_name
from planning.models import Case, CaseStatus, PlanNode, Strategy
from planning.planner import (
    DEFAULT_BRANCHING,
    budget_backend,
    expected_llm_calls,
    llm_settings,
    pack_choices,
    planner_model,
)
from planning.promotion.views import node_promotion, promoted_origins
from planning.queries import case_for, plan_nodes, visible_cases
from web.http import HtmxHttpRequest, partial_name, render_partial

CASES_PER_PAGE = 25
# Where a case can be today: every status (a status not listed here is offered as "coming").
STATUSES_TODAY = tuple(CaseStatus)
POLL_INTERVAL = "every 2s"
# Statuses after which nothing more runs: the case page shows its result.
ENDED_STATUSES = (
    CaseStatus.COMPLETED,
    CaseStatus.FAILED,
    CaseStatus.CANCELLED,
    CaseStatus.REJECTED,
)
# Form values a GET may carry into the form (the htmx refresh sends only the planning options
# and the pack inputs; a shared link may carry the rest). Never the CSRF token.
FORM_FIELDS = ("domain", "title", "goal", "description", "strategy", "max_depth", "inputs")


# Submitting a case -------------------------------------------------------------------------


def llm_estimate(form: CaseForm) -> str:
    """Return the sentence that tells the analyst how many LLM calls the plan may take."""
    strategy = str(form["strategy"].value() or "")
    if strategy in form.unavailable:
        label = Strategy(strategy).label
        return f"{label} is not available here: it {form.unavailable[strategy]}."
    low, high = rules.MIN_DEPTH, rules.MAX_DEPTH_LIMIT
    try:
        depth = int(form["max_depth"].value())
    except (TypeError, ValueError):
        depth = 0
    if not low <= depth <= high:
        return f"Choose a depth between {low} and {high} to see the expected LLM calls."
    # The steps an llm agent runs call its model too: counted with the planning calls.
    steps = _llm_steps(form, depth)
    if strategy == Strategy.HYBRID and not form.has_provider:
        return (
            "No LLM calls to plan: this server has no LLM provider, so hybrid plans with the "
            "domain pack's static methods only, and fails where they do not cover the case. "
            + _steps_sentence(steps)
        )
    calls = expected_llm_calls(strategy, depth)
    if calls is None:
        return (
            "No LLM calls to plan: this strategy plans from the domain pack's methods. "
            + _steps_sentence(steps)
        )
    plural = "call" if calls == 1 else "calls"
    text = f"Up to {calls} LLM {plural} (b = {DEFAULT_BRANCHING}, depth {depth}) to plan the case"
    if strategy == Strategy.HYBRID:
        text += ", fewer when static methods cover part of the plan"
    return (
        f"{text}. Each step the plan gives an LLM agent makes up to {rounds_per_step()} more "
        "when it runs."
    )


def _llm_steps(form: CaseForm, depth: int) -> LlmSteps | None:
    # Previewed once per form (the estimate and the budget notes both read it).
    if not hasattr(form, "llm_steps_preview"):
        form.llm_steps_preview = form_llm_steps(form, depth)  # type: ignore[attr-defined]
    steps: LlmSteps | None = form.llm_steps_preview  # type: ignore[attr-defined]
    return steps


def _steps_sentence(steps: LlmSteps | None) -> str:
    if steps is None:
        return "Whether the plan has steps for an LLM agent shows once the inputs are valid."
    if not steps.count:
        return "The plan has no step for an LLM agent: no LLM calls in all."
    return f"The plan has {steps.summary}."


def _llm_steps_note(form: CaseForm) -> list[BudgetNote]:
    """Return the warning that the plan has llm steps this installation cannot run, if it has."""
    steps = getattr(form, "llm_steps_preview", None)
    if steps is None or not steps.cannot_run:
        return []
    return [BudgetNote("llm-steps", steps.warning, is_warning=True)]


# The prompt of a typical planning request, in tokens (system rules, goal, agents, schema): the
# expected cost counts it plus the whole answer bound (CASEHUB_LLM_MAX_TOKENS_PER_CALL) per call.
TYPICAL_PROMPT_TOKENS = 1_500


@dataclass(frozen=True, slots=True)
class BudgetNote:
    """One sentence of the form's estimate about cost and budgets; a warning is shown as one."""

    kind: str
    text: str
    is_warning: bool = False


def _expected_calls(form: CaseForm) -> int | None:
    strategy = str(form["strategy"].value() or "")
    if strategy in form.unavailable or not form.has_provider:
        return None
    try:
        depth = int(form["max_depth"].value())
    except (TypeError, ValueError):
        return None
    if not rules.MIN_DEPTH <= depth <= rules.MAX_DEPTH_LIMIT:
        return None
    return expected_llm_calls(strategy, depth)


def _left_today(today: ScopeStatus) -> str:
    parts = []
    if (calls := today.calls_left) is not None:
        parts.append(f"{calls:,} call{'' if calls == 1 else 's'}")
    if (tokens := today.tokens_left) is not None:
        parts.append(f"{tokens:,} tokens")
    if (cost := today.cost_left_usd) is not None:
        parts.append(format_usd(cost))
    return ", ".join(parts)


def llm_budget_notes(form: CaseForm) -> list[BudgetNote]:
    """Return what the plan's LLM calls may cost, and how that compares with the budgets.

    The cost is an upper estimate: every expected call at a typical prompt plus its whole answer
    bound, at the planner model's price; what a call really costs is settled by the ledger.
    """
    calls = _expected_calls(form)
    if not calls:
        return []
    model = planner_model(form.domain_slug)
    answer = int(settings.CASEHUB_LLM_MAX_TOKENS_PER_CALL)
    tokens = calls * (TYPICAL_PROMPT_TOKENS + answer)
    cost = settings.CASEHUB_LLM_PRICE_TABLE.cost(
        model, calls * TYPICAL_PROMPT_TOKENS, calls * answer
    )
    notes = []
    if cost is None:
        notes.append(
            BudgetNote("cost", f"Cost unknown: the model {model} has no price configured.")
        )
    else:
        notes.append(
            BudgetNote(
                "cost",
                f"Up to about {format_usd(cost)} on {model} (an upper estimate: each call at a "
                f"typical {TYPICAL_PROMPT_TOKENS:,}-token prompt and a full {answer:,}-token "
                "answer).",
            )
        )
    over = []
    if (limit := settings.CASEHUB_LLM_CASE_MAX_CALLS) and calls > limit:
        over.append(f"{limit:,} calls")
    if (limit := settings.CASEHUB_LLM_CASE_MAX_TOKENS) and tokens > limit:
        over.append(f"{limit:,} tokens")
    money = Decimal(settings.CASEHUB_LLM_CASE_MAX_COST_USD or 0)
    if money and (cost is None or cost > money):
        over.append(format_usd(money))
    if over:
        notes.append(
            BudgetNote(
                "case",
                f"This may pass the per-case budget ({', '.join(over)}): planning stops cleanly "
                "where it is reached, with no plan. A smaller depth needs fewer calls.",
                is_warning=True,
            )
        )
    backend = budget_backend()
    today = backend.day_status() if backend is not None else None
    if today is not None and today.limits.is_set:
        short = (
            (today.calls_left is not None and today.calls_left < calls)
            or (today.tokens_left is not None and today.tokens_left < tokens)
            or (today.cost_left_usd is not None and (cost is None or today.cost_left_usd < cost))
        )
        notes.append(
            BudgetNote(
                "day",
                f"Left of today's LLM budget: {_left_today(today)}."
                + (" It may not be enough for this plan." if short else ""),
                is_warning=short,
            )
        )
    return notes


def _packs() -> list[tuple[str, str, type[BaseModel]]]:
    # Registry order, so the first pack (the default domain) does not move with a rename.
    order = list(registered_packs())
    rows = sorted(pack_choices(), key=lambda pair: order.index(pair[0].slug))
    return [(row.slug, row.name, pack.input_schema) for row, pack in rows]


def _case_form(
    packs: list[tuple[str, str, type[BaseModel]]],
    domain: str,
    *,
    data: QueryDict | None = None,
    initial: Mapping[str, Any] | None = None,
) -> CaseForm:
    schema = next((schema for slug, _, schema in packs if slug == domain), None)
    return CaseForm(
        data,
        domains=[(slug, name) for slug, name, _ in packs],
        domain=domain,
        schema=schema,
        suggestions=_input_suggestions(domain) if schema is not None else None,
        check_inputs=_input_check(domain) if data is not None and schema is not None else None,
        has_provider=llm_settings().is_configured,
        initial=dict(initial or {}),
    )


def _input_suggestions(domain: str) -> Mapping[str, Mapping[str, str]]:
    # What the pack's systems hold now (accounts, services, hosts, invoices), read through the
    # same port as the checks, so the form offers what a submission will accept.
    pack = registered_packs()[domain]
    return pack.input_suggestions(data_port(pack))


def _input_check(domain: str) -> InputCheck:
    # The same checks as submission (schema, then the pack's data through its port), so an
    # invalid form shows the data's problems in the same round as the others.
    pack = registered_packs()[domain]
    return lambda inputs: pack.check_inputs(inputs, data_port(pack))


def _typed_initial(values: QueryDict, packs: list[tuple[str, str, type[BaseModel]]]) -> CaseForm:
    """Return an unbound form showing `values` (a refresh: nothing validated, no errors)."""
    slugs = [slug for slug, _, _ in packs]
    domain = values.get("domain", slugs[0] if slugs else "")
    if domain not in ("", *slugs):
        domain = slugs[0] if slugs else ""
    initial: dict[str, Any] = {
        key: values.get(key) for key in values if key in FORM_FIELDS or key.startswith(INPUT_PREFIX)
    }
    initial["domain"] = domain
    form = _case_form(packs, domain, initial=initial)
    # Inputs of this same domain came along: an unchecked box was sent as nothing, so False.
    carried = values.get(INPUTS_OF) == domain
    for name in form.input_names:
        if isinstance(form.fields[name], forms.BooleanField):
            if name in initial:
                form.initial[name] = initial[name] in {"on", "true", "True", "1"}
            elif carried:
                form.initial[name] = False
    return form


def _resubmission(
    request: HtmxHttpRequest, packs: list[tuple[str, str, type[BaseModel]]]
) -> tuple[CaseForm, Case]:
    """Return the form prefilled from a case the user may read, and that case; 404 otherwise."""
    case = case_for(request.user, request.GET.get("from"))  # type: ignore[arg-type]
    initial: dict[str, Any] = {
        "title": case.title,
        "goal": case.goal,
        "description": case.description,
        "strategy": case.strategy,
        "max_depth": case.max_depth,
    }
    # A pack disabled since then: its inputs come back as JSON, with the domain left open.
    domain = case.domain if case.domain in {slug for slug, _, _ in packs} else ""
    if domain:
        initial.update((input_field_name(k), v) for k, v in case.inputs.items())
    else:
        initial["inputs"] = case.inputs or None
    return _case_form(packs, domain, initial=initial), case


@require_http_methods(["GET", "POST"])
def case_new(request: HtmxHttpRequest) -> HttpResponse:
    """Show the case form (htmx refreshes the planning options and the estimate); submit it.

    Raises PermissionDenied unless the user submits cases, and Http404 for a `from` case the
    user may not read.
    """
    rules.require_submitter(request.user)
    template = "planning/case_new.html"
    packs = _packs()
    source: Case | None = None
    status = 200
    retry_after = 0
    if request.method == "GET" and "from" in request.GET:
        form, source = _resubmission(request, packs)
    elif request.method == "GET":
        form = _typed_initial(request.GET, packs)
    elif request.POST.get("action") == "refresh":
        # The no-JavaScript way to show a new domain's inputs: a POST, so nothing of the
        # form (description, CSRF token) ends up in a URL.
        form = _typed_initial(request.POST, packs)
    else:
        form = _case_form(packs, request.POST.get("domain", ""), data=request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                check_submission_rate(request.user, data["strategy"])  # type: ignore[arg-type]
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
            except SubmissionRateLimited as exc:
                form.add_error(None, exc.message)
                retry_after = exc.retry_after
            except CaseInvalid as exc:
                form.add_case_errors(exc.errors)
            else:
                return redirect("planning:case-detail", case_id=case.pk)
        status = 429 if retry_after else 422
    labels = dict(form.fields["domain"].choices)  # type: ignore[attr-defined]
    context = {
        "form": form,
        "estimate": llm_estimate(form),
        "budget_notes": _llm_steps_note(form) + llm_budget_notes(form),
        "domain_label": labels.get(form.domain_slug, form.domain_slug),
        "inputs_of": form.domain_slug,
        "source": source,
        "max_description": rules.DESCRIPTION_MAX_LENGTH,
    }
    response = render_partial(
        request, template, context, partials={"planning-options", "llm-estimate"}, status=status
    )
    if retry_after:
        response["Retry-After"] = str(retry_after)
    return response


# Listing cases -----------------------------------------------------------------------------


@require_GET
def case_list(request: HtmxHttpRequest) -> HttpResponse:
    """List the cases the user may read, newest first, filtered by status, domain and owner.

    Raises PermissionDenied unless the user reads cases.
    """
    rules.require_case_reader(request.user)
    cases = visible_cases(request.user)
    status = request.GET.get("status", "")
    domain = request.GET.get("domain", "")
    sees_all = rules.can_view_all_cases(request.user)
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
        cases = cases.filter(submitter_id=request.user.pk)
    page = Paginator(cases, CASES_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "status": status,
        "domain": domain,
        "mine": mine,
        "sees_all": sees_all,
        "statuses": [
            (value, label, value not in STATUSES_TODAY) for value, label in CaseStatus.choices
        ],
        "domains": [(slug, name) for slug, name, _ in _packs()],
        "query": query.urlencode(),
        "can_submit": rules.can_submit_cases(request.user),
    }
    return render_partial(request, "planning/case_list.html", context, partials={"case-table"})


# One case ----------------------------------------------------------------------------------


def _node_url(case_id: int) -> Callable[[PlanNode], str]:
    # One reverse() for the whole plan: a 500-leaf page would otherwise resolve 500 times.
    marker = 987654321
    pattern = reverse("planning:node-detail", kwargs={"case_id": case_id, "node_id": marker})
    head, tail = pattern.rsplit(str(marker), 1)
    return lambda node: f"{head}{node.pk}{tail}"


def _inputs_shown(case: Case) -> list[ValueRow]:
    """Return the case inputs as rows of values (a list as its items, yes/no for a flag), a
    pack's labelled by its titles; only a nested value reads as JSON."""
    if not case.inputs or not isinstance(case.inputs, dict):
        return value_rows(case.inputs) if case.inputs else []
    pack = registered_packs().get(case.domain) if case.domain else None
    if pack is None:
        return value_rows(case.inputs)  # free-form keys, as the analyst typed them
    props = pack.input_schema.model_json_schema().get("properties", {})
    titles = {
        name.replace("_", " "): props.get(name, {}).get("title")
        or name.replace("_", " ").capitalize()
        for name in case.inputs
    }
    return [
        dataclasses.replace(row, label=titles.get(row.label) or row.label)
        for row in value_rows(case.inputs)
    ]


def _ended_by(case: Case) -> dict[str, str] | None:
    """Return who cancelled or rejected `case` and why, from its audit trail; None otherwise."""
    action = {
        CaseStatus.CANCELLED: "planning.case.cancelled",
        CaseStatus.REJECTED: "planning.case.rejected",
    }.get(CaseStatus(case.status))
    if action is None:
        return None
    event = (
        AuditEvent.objects.filter(chain=case_chain(case.pk), action=action).order_by("-seq").first()
    )
    if event is None:
        return None
    data = event.data if isinstance(event.data, dict) else {}
    return {
        "who": event.actor_label,
        "why": str(data.get("reason_label") or data.get("reason_code") or ""),
        "text": str(data.get("reason") or ""),
    }


def _result(case: Case, leaves: list[PlanNode]) -> dict[str, object] | None:
    """Return what an ended case shows: the goal-level verdict and the last steps' outputs.

    The last steps are those nothing waits for, with the steps they take their inputs from (an
    invoice's hold and the audit report it acted on).
    """
    if case.status not in ENDED_STATUSES:
        return None
    waited_for = {dep for leaf in leaves for dep in leaf.depends_on}
    last = {leaf.key for leaf in leaves if leaf.key not in waited_for}
    shown = last | {dep for leaf in leaves if leaf.key in last for dep in leaf.depends_on}
    verification = case.verification if isinstance(case.verification, dict) else {}
    outputs = [leaf for leaf in leaves if leaf.key in shown and leaf.output is not None]
    return {
        "ended_by": _ended_by(case),
        "verified": "passed" in verification,
        "passed": bool(verification.get("passed")),
        "reasons": [str(r) for r in verification.get("reasons", [])],
        "checks": [str(c) for c in verification.get("checks", [])],
        "findings": sum(_findings(leaf.output) for leaf in outputs),
        "outputs": [(leaf, value_rows(leaf.output)) for leaf in outputs],
    }


def _findings(output: object) -> int:
    """Return how many findings a step's output reports (its `findings` list), 0 without one."""
    findings = output.get("findings") if isinstance(output, dict) else None
    return len(findings) if isinstance(findings, list) else 0


def _case_context(request: HtmxHttpRequest, case: Case) -> dict[str, object]:
    nodes = list(plan_nodes(case))
    leaves = [node for node in nodes if node.is_leaf]
    url_for = _node_url(case.pk)
    for node in nodes:
        node.url = url_for(node)  # type: ignore[attr-defined]
    by_key = {node.key: node for node in nodes}
    parents: dict[int | None, PlanNode] = {node.pk: node for node in nodes if not node.is_leaf}
    now = timezone.now()
    rows = [
        {
            "node": leaf,
            # The root compound is the plan itself: only name the groups below it.
            "parent": parents.get(leaf.parent_id) if leaf.depth > 1 else None,
            "depends_on": [by_key[key] for key in leaf.depends_on if key in by_key],
            "duration": duration(leaf.started_at, leaf.finished_at, now),
        }
        for leaf in leaves
    ]
    counts: dict[str, int] = {}
    for leaf in leaves:
        counts[leaf.status] = counts.get(leaf.status, 0) + 1
    version = case.current_version
    input_rows = _inputs_shown(case)
    can_resubmit = case.status == CaseStatus.PLAN_FAILED and rules.can_submit_cases(request.user)
    return {
        "case": case,
        "version": version,
        "warnings": list(version.warnings) if version else [],
        "rows": rows,
        "leaf_count": len(leaves),
        "dot": plan_dot(nodes, url_for=url_for) if nodes else "",
        "poll": POLL_INTERVAL if case.is_live else "",
        # Only the statuses this plan's steps are in: the legend explains what is on screen.
        "legend": [
            (status, status.replace("_", " "), counts[status])
            for status in STATUS_COLOURS
            if status in counts
        ],
        "input_rows": input_rows,
        "resubmit_url": (f"{reverse('planning:case-new')}?from={case.pk}" if can_resubmit else ""),
        # The steps an llm agent runs: counted with the planning calls, and a warning where
        # this installation cannot run them.
        "llm_steps": llm_steps((leaf.key, leaf.agent) for leaf in leaves) if leaves else None,
        "result": _result(case, leaves),
        # The promoted methods that planned this version (a query only when one did).
        "promoted_origins": promoted_origins(
            {str(n.provenance.get("source", "")) for n in nodes if isinstance(n.provenance, dict)}
        ),
    }


def _node_context(case: Case, node: PlanNode) -> dict[str, object]:
    url_for = _node_url(case.pk)
    node.url = url_for(node)  # type: ignore[attr-defined]
    siblings = {
        row.key: row
        for row in PlanNode.objects.filter(version_id=node.version_id, key__in=node.depends_on)
    }
    dependencies = [(key, siblings.get(key)) for key in node.depends_on]
    for _, dependency in dependencies:
        if dependency is not None:
            dependency.url = url_for(dependency)  # type: ignore[attr-defined]
    return {
        "case": case,
        "node": node,
        "dependencies": dependencies,
        "is_current": node.version_id == case.current_version_id,
        "node_inputs_json": json.dumps(node.inputs, indent=2, ensure_ascii=False, sort_keys=True),
        "node_output_rows": value_rows(node.output) if node.output is not None else [],
        "node_duration": duration(node.started_at, node.finished_at, timezone.now()),
        "close_url": reverse("planning:case-detail", kwargs={"case_id": case.pk}),
    }


@require_GET
def case_detail(request: HtmxHttpRequest, case_id: int) -> HttpResponse:
    """Show a case: its status, inputs, plan warnings, DAG, task table and a step panel.

    Raises Http404 when the case does not exist or is not the user's to read.
    """
    case = case_for(request.user, case_id)
    partials = {"case-live", "node-panel"}
    if partial_name(request, partials) == "node-panel":
        # Closing the step panel: the page's own URL again, without a step.
        response = render_partial(
            request, "planning/case_detail.html", {"case": case}, partials=partials
        )
        response["HX-Push-Url"] = request.path
        return response
    context = _case_context(request, case)
    return render_partial(request, "planning/case_detail.html", context, partials=partials)


@require_GET
def node_detail(request: HtmxHttpRequest, case_id: int, node_id: int) -> HttpResponse:
    """Show one step of a case's plan: the side panel for htmx, else the case page with it open.

    htmx requests get the panel and push the step's URL, so reload and links show the same
    step. Raises Http404 when the case is not the user's to read or has no such node.
    """
    case = case_for(request.user, case_id)
    try:
        node = PlanNode.objects.select_related("parent", "version").get(
            pk=node_id, version__case=case
        )
    except PlanNode.DoesNotExist:
        raise Http404("No such step in this case") from None
    context = {**_node_context(case, node), **node_promotion(request.user, case, node)}
    partials = {"node-panel"}
    if partial_name(request, partials):
        response = render_partial(request, "planning/case_detail.html", context, partials=partials)
        response["HX-Push-Url"] = request.path
        return response
    context = {**_case_context(request, case), **context}
    return render_partial(request, "planning/case_detail.html", context, partials=partials)
