"""The authorization matrix (RELIABILITY W3): who gets what from every route, as data.

One line per route of the URLconf (pages and partials, the admin, and each method of the API):
its key as `tests.routes.all_routes` names it, then what each persona gets from the methods the
route accepts, in the column order of PERSONAS:

    ok     the request passes authorization: 2xx, a redirect elsewhere than the login page, or a
           refusal of what was sent rather than of who sent it (400, 409, 422, 429)
    403    refused for who asked
    404    not found for who asked (another user's object looks like no object at all)
    401    sent to sign in: a redirect to the login page (the admin's, in the admin), or 401 in
           the API

    405    the method is refused (only where the walk cannot tell a route's methods: the admin)

A method the route is known not to accept must answer 405, derived rather than written (an
anonymous caller of a page is sent to sign in first). Options after the cells:

    hx=<id>          the partial asked for with `HX-Target` when requested with `HX-Request`
    q=<query>        the query string, `{name}` standing for a URL argument: q=case={case_id}
    post=<p>:<cell>  POST's cell for persona p where it differs from GET's: post=admin:403
    audit=<action>   a GET that writes this audit event on purpose (a read that is audited)

The body each mutating route is sent (empty unless named) is in BODIES of the test module.

Adding a route is adding its line: `tests/casehub/test_authz_matrix.py` fails for a route with
no line and prints the line it observed; check every cell against what the role may do before
pasting it here.
"""

# ruff: noqa: E501  (the table is one route a line, aligned, whatever its length)

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CELLS", "MATRIX", "PERSONAS", "Row", "format_row"]

# The personas of tests/casehub/test_authz_matrix.py, in column order: anonymous, the analyst
# who submitted the case, a second analyst, an officer, a supervisor, an auditor, an admin and
# a signed-up user with no role.
PERSONAS = (
    "anonymous",
    "analyst",
    "analyst2",
    "officer",
    "supervisor",
    "auditor",
    "admin",
    "outsider",
)
CELLS = frozenset({"ok", "401", "403", "404", "405"})
HTTP_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
KEY_WIDTH = 50
CELL_WIDTH = 5

TABLE = """
# route key                                       anon ana  ana2 off  sup  aud  adm  out
# Pages and partials
home                                              401  ok   ok   ok   ok   ok   ok   ok
accounts:account                                 401  ok   ok   ok   ok   ok   ok   ok
accounts:account-log-out-everywhere              401  ok   ok   ok   ok   ok   ok   ok
accounts:account-token-revoke                    401  ok   404  404  404  404  404  404
oversight:inbox                                   401  ok   ok   ok   ok   ok   ok   ok hx=inbox-table
oversight:inbox-approve                           401  403  404  ok   403  403  404  404
oversight:gate-detail                             401  ok   404  ok   ok   ok   404  404
oversight:gate-decide                             401  403  404  ok   403  403  404  404
oversight:case-gates                              401  ok   404  ok   ok   ok   404  404 hx=case-gates
oversight:version-history                         401  ok   404  ok   ok   ok   404  404
oversight:version-diff                            401  ok   404  ok   ok   ok   404  404
oversight:plan-edit                               401  403  404  ok   ok   403  404  404
oversight:plan-add-step                           401  403  404  ok   ok   403  404  404
oversight:policy-whatif                           401  403  403  403  403  403  ok   403
oversight:whatif-report                           401  403  403  403  403  403  ok   403 hx=whatif-report
oversight:notifications                           401  ok   ok   ok   ok   ok   ok   ok
oversight:notifications-read-all                  401  ok   ok   ok   ok   ok   ok   ok
oversight:notification-read                       401  404  404  ok   404  404  404  404
quality:quality                                   401  403  403  ok   ok   403  ok   403
quality:quality-csv                               401  403  403  ok   ok   403  ok   403 q=table=cases
quality:case-quality                              401  403  403  ok   ok   403  ok   403
quality:plan-evaluation                           401  403  403  ok   ok   403  ok   403
oversight:audit-list                              401  403  403  403  403  ok   403  403 hx=audit-table
oversight:case-trail                              401  403  403  403  403  ok   403  403 hx=trail-events
oversight:case-trail-export                       401  403  403  403  403  ok   403  403
oversight:verifier-download                       401  403  403  403  403  ok   ok   403
oversight:public-key-download                     401  403  403  403  403  ok   ok   403
planning:case-list                                401  ok   ok   ok   ok   ok   403  403 hx=case-table
planning:case-new                                 401  ok   ok   403  403  403  403  403 hx=planning-options
planning:case-detail                              401  ok   404  ok   ok   ok   404  404 hx=case-live
planning:node-detail                              401  ok   404  ok   ok   ok   404  404 hx=node-panel
planning:node-promote                             401  403  403  ok   ok   403  ok   403
planning:method-list                              401  403  403  ok   ok   ok   ok   403
planning:method-detail                            401  403  403  ok   ok   ok   ok   403
planning:method-approve                           401  403  403  ok   ok   403  ok   403
planning:method-reject                            401  403  403  ok   ok   403  ok   403
planning:method-retire                            401  403  403  ok   ok   403  ok   403
favicon                                           ok   ok   ok   ok   ok   ok   ok   ok
health                                            ok   ok   ok   ok   ok   ok   ok   ok
# /metrics is allowed by client address (loopback here) and token, not by role
metrics                                           ok   ok   ok   ok   ok   ok   ok   ok
login                                             ok   ok   ok   ok   ok   ok   ok   ok
logout                                            401  ok   ok   ok   ok   ok   ok   ok
# Execution: a case's run, cancelling it, work items, the global stop
execution:case-execution                          401  ok   404  ok   ok   ok   404  404
execution:case-cancel                             401  ok   404  ok   ok   403  404  404
execution:work-item-list                          401  ok   ok   ok   ok   ok   ok   ok
execution:work-item                               401  404  ok   404  404  404  404  404
execution:work-item-complete                      401  404  ok   404  404  404  404  404
execution:execution-control                       401  403  403  403  403  403  ok   403
execution:execution-control-set                   401  403  403  403  403  403  ok   403
accounts:lockout-list                            401  403  403  403  403  403  ok   403
accounts:lockout-lift                            401  403  403  403  403  403  ok   403
# Sign-in through the identity provider: 404 while no provider is configured (as here)
accounts:oidc-sign-in                             404  404  404  404  404  404  404  404
accounts:oidc-callback                            404  404  404  404  404  404  404  404
# The admin (staff only; list actions are checked by the A8 walk)
admin:index                                       401  401  401  401  401  401  ok   401
admin:login                                       ok   ok   ok   ok   ok   ok   ok   ok
admin:logout                                      401  ok   ok   ok   ok   ok   405  ok post=admin:ok
admin:password_change                             401  401  401  401  401  401  ok   401
admin:password_change_done                        401  401  401  401  401  401  ok   401 post=admin:405
admin:autocomplete                                401  401  401  401  401  401  403  401 post=admin:405
admin:jsi18n                                      401  401  401  401  401  401  ok   401 post=admin:405
admin:view_on_site                                401  401  401  401  401  401  404  401
admin:planning_agent_changelist                   401  401  401  401  401  401  ok   401
admin:planning_agent_add                          401  401  401  401  401  401  ok   401
admin:planning_agent_history                      401  401  401  401  401  401  ok   401
admin:planning_agent_delete                       401  401  401  401  401  401  403  401
admin:planning_agent_change                       401  401  401  401  401  401  ok   401
admin/planning/agent/<path:object_id>/            401  401  401  401  401  401  ok   401
admin:planning_tool_changelist                    401  401  401  401  401  401  ok   401
admin:planning_tool_add                           401  401  401  401  401  401  403  401
admin:planning_tool_history                       401  401  401  401  401  401  ok   401
admin:planning_tool_delete                        401  401  401  401  401  401  403  401
admin:planning_tool_change                        401  401  401  401  401  401  ok   401
admin/planning/tool/<path:object_id>/             401  401  401  401  401  401  ok   401
admin:planning_domainpack_changelist              401  401  401  401  401  401  ok   401
admin:planning_domainpack_add                     401  401  401  401  401  401  403  401
admin:planning_domainpack_history                 401  401  401  401  401  401  ok   401
admin:planning_domainpack_delete                  401  401  401  401  401  401  403  401
admin:planning_domainpack_change                  401  401  401  401  401  401  ok   401
admin/planning/domainpack/<path:object_id>/       401  401  401  401  401  401  ok   401
admin:execution_workerheartbeat_changelist        401  401  401  401  401  401  ok   401
admin:execution_workerheartbeat_add               401  401  401  401  401  401  403  401
admin:execution_workerheartbeat_history           401  401  401  401  401  401  ok   401
admin:execution_workerheartbeat_delete            401  401  401  401  401  401  403  401
admin:execution_workerheartbeat_change            401  401  401  401  401  401  ok   401 post=admin:403
admin/execution/workerheartbeat/<path:object_id>/ 401  401  401  401  401  401  ok   401
admin:oversight_policyversion_changelist          401  401  401  401  401  401  ok   401
admin:oversight_policyversion_add                 401  401  401  401  401  401  ok   401
admin:oversight_policyversion_history             401  401  401  401  401  401  ok   401
admin:oversight_policyversion_delete              401  401  401  401  401  401  403  401
admin:oversight_policyversion_change              401  401  401  401  401  401  ok   401 post=admin:403
admin/oversight/policyversion/<path:object_id>/   401  401  401  401  401  401  ok   401
admin:oversight_reasoncode_changelist             401  401  401  401  401  401  ok   401
admin:oversight_reasoncode_add                    401  401  401  401  401  401  ok   401
admin:oversight_reasoncode_history                401  401  401  401  401  401  ok   401
admin:oversight_reasoncode_delete                 401  401  401  401  401  401  403  401
admin:oversight_reasoncode_change                 401  401  401  401  401  401  ok   401
admin/oversight/reasoncode/<path:object_id>/      401  401  401  401  401  401  ok   401
admin:auth_user_password_change                   401  401  401  401  401  401  ok   401
admin:auth_user_changelist                        401  401  401  401  401  401  ok   401
admin:auth_user_add                               401  401  401  401  401  401  ok   401
admin:auth_user_history                           401  401  401  401  401  401  ok   401
admin:auth_user_delete                            401  401  401  401  401  401  403  401
admin:auth_user_change                            401  401  401  401  401  401  ok   401
admin/auth/user/<path:object_id>/                 401  401  401  401  401  401  ok   401
admin:auth_group_changelist                       401  401  401  401  401  401  ok   401
admin:auth_group_add                              401  401  401  401  401  401  403  401
admin:auth_group_history                          401  401  401  401  401  401  ok   401
admin:auth_group_delete                           401  401  401  401  401  401  403  401
admin:auth_group_change                           401  401  401  401  401  401  ok   401 post=admin:403
admin/auth/group/<path:object_id>/                401  401  401  401  401  401  ok   401
admin:accounts_passwordresetrequest_changelist   401  401  401  401  401  401  ok   401
admin:accounts_passwordresetrequest_add          401  401  401  401  401  401  403  401
admin:accounts_passwordresetrequest_history      401  401  401  401  401  401  ok   401
admin:accounts_passwordresetrequest_delete       401  401  401  401  401  401  403  401
admin:accounts_passwordresetrequest_change       401  401  401  401  401  401  ok   401 post=admin:403
admin/accounts/passwordresetrequest/<path:object_id>/ 401  401  401  401  401  401  ok   401
admin:accounts_rolegrantrequest_changelist       401  401  401  401  401  401  ok   401
admin:accounts_rolegrantrequest_add              401  401  401  401  401  401  403  401
admin:accounts_rolegrantrequest_history          401  401  401  401  401  401  ok   401
admin:accounts_rolegrantrequest_delete           401  401  401  401  401  401  403  401
admin:accounts_rolegrantrequest_change           401  401  401  401  401  401  ok   401 post=admin:403
admin/accounts/rolegrantrequest/<path:object_id>/ 401  401  401  401  401  401  ok   401
admin:accounts_oidcgroupmapping_changelist        401  401  401  401  401  401  ok   401
admin:accounts_oidcgroupmapping_add               401  401  401  401  401  401  ok   401
admin:accounts_oidcgroupmapping_history           401  401  401  401  401  401  ok   401
admin:accounts_oidcgroupmapping_delete            401  401  401  401  401  401  403  401
admin:accounts_oidcgroupmapping_change            401  401  401  401  401  401  ok   401 post=admin:403
admin/accounts/oidcgroupmapping/<path:object_id>/ 401  401  401  401  401  401  ok   401
admin:accounts_oidcmappingrequest_changelist      401  401  401  401  401  401  ok   401
admin:accounts_oidcmappingrequest_add             401  401  401  401  401  401  403  401
admin:accounts_oidcmappingrequest_history         401  401  401  401  401  401  ok   401
admin:accounts_oidcmappingrequest_delete          401  401  401  401  401  401  403  401
admin:accounts_oidcmappingrequest_change          401  401  401  401  401  401  ok   401 post=admin:403
admin/accounts/oidcmappingrequest/<path:object_id>/ 401  401  401  401  401  401  ok   401
admin:execution_trustscore_changelist             401  401  401  401  401  401  ok   401
admin:execution_trustscore_add                    401  401  401  401  401  401  403  401
admin:execution_trustscore_history                401  401  401  401  401  401  ok   401
admin:execution_trustscore_delete                 401  401  401  401  401  401  403  401
admin:execution_trustscore_change                 401  401  401  401  401  401  ok   401
admin/execution/trustscore/<path:object_id>/      401  401  401  401  401  401  ok   401
admin:app_list                                    401  401  401  401  401  401  ok   401
admin/(?P<url>.*)$                                401  401  401  401  401  401  404  401
# The API (bearer tokens)
DELETE /api/auth/token                            401  ok   ok   ok   ok   ok   ok   ok
POST /api/auth/token                              ok   ok   ok   ok   ok   ok   ok   ok
GET /api/auth/tokens                              401  ok   ok   ok   ok   ok   ok   ok
DELETE /api/auth/tokens/<token_id>                401  ok   404  404  404  404  404  404
GET /api/agents                                   401  ok   ok   ok   ok   ok   ok   403
GET /api/cases                                    401  ok   ok   ok   ok   ok   ok   ok
POST /api/cases                                   401  ok   ok   403  403  403  403  403
GET /api/cases/<int:case_id>                      401  ok   404  ok   ok   ok   404  404
GET /api/cases/<int:case_id>/audit                401  ok   404  ok   ok   ok   404  404
GET /api/audit/export                             401  403  403  403  403  ok   403  403  q=case={case_id} audit=oversight.audit.exported
GET /api/audit/verify                             401  403  403  403  403  ok   403  403  q=case={case_id}
GET /api/audit/keys                               401  403  403  403  403  ok   ok   403
GET /api/cases/<int:case_id>/plan                 401  ok   404  ok   ok   ok   404  404
GET /api/cases/<int:case_id>/plan/diff            401  ok   404  ok   ok   ok   404  404
POST /api/cases/<int:case_id>/plan/edits          401  403  404  ok   ok   403  404  404
GET /api/gates                                    401  ok   ok   ok   ok   ok   ok   ok
GET /api/gates/<int:gate_id>                      401  ok   404  ok   404  ok   404  404
POST /api/gates/<int:gate_id>/decision            401  403  404  ok   403  403  404  404
GET /api/reason-codes                             401  ok   ok   ok   ok   ok   ok   ok
DELETE /api/<anypath:rest>                        404  404  404  404  404  404  404  404
GET /api/<anypath:rest>                           404  404  404  404  404  404  404  404
PATCH /api/<anypath:rest>                         404  404  404  404  404  404  404  404
POST /api/<anypath:rest>                          404  404  404  404  404  404  404  404
PUT /api/<anypath:rest>                           404  404  404  404  404  404  404  404
api:openapi-json                                  401  ok   ok   ok   ok   ok   ok   ok
api:openapi-view                                  401  ok   ok   ok   ok   ok   ok   ok
api:api-root                                      404  404  404  404  404  404  404  404
# Execution in the API. Admins may cancel any case here (execution.api.cancel), not on its page.
POST /api/cases/<int:case_id>/cancel              401  ok   404  ok   ok   403  ok   404
GET /api/control                                  401  ok   ok   ok   ok   ok   ok   403
POST /api/control/stop                            401  403  403  403  403  403  ok   403
POST /api/control/resume                          401  403  403  403  403  403  ok   403
GET /api/work-items                               401  ok   ok   ok   ok   ok   ok   ok
GET /api/work-items/<int:item_id>                 401  404  ok   404  404  404  404  404
POST /api/work-items/<int:item_id>/complete       401  404  ok   404  404  404  404  404
"""


@dataclass(frozen=True, slots=True)
class Row:
    """One route's line: the outcome for each persona, the partial to ask for, POST's cells."""

    key: str
    cells: tuple[str, ...]
    hx_target: str = ""
    post: tuple[str, ...] | None = None
    query: str = ""
    audited_read: str = ""

    def expected(self, method: str) -> tuple[str, ...]:
        """Return the cells for an accepted method (POST may have its own)."""
        if method == "POST" and self.post is not None:
            return self.post
        return self.cells


def _cells(words: list[str], line: str) -> tuple[str, ...]:
    if len(words) != len(PERSONAS) or not set(words) <= CELLS:
        raise ValueError(f"authz matrix: want {len(PERSONAS)} of {sorted(CELLS)} in {line!r}")
    return tuple(words)


def _parse(table: str) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for line in table.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, *rest = line.split()
        if key in HTTP_METHODS:  # an API key: "POST /api/cases"
            key, rest = f"{key} {rest[0]}", rest[1:]
        options = [word for word in rest if "=" in word]
        cells = _cells([word for word in rest if "=" not in word], line)
        values = dict(option.split("=", 1) for option in options)
        unknown = set(values) - {"hx", "post", "q", "audit"}
        if unknown or key in rows:
            raise ValueError(f"authz matrix: unknown option or repeated key in {line!r}")
        post = None
        if "post" in values:
            changed = dict(pair.split(":", 1) for pair in values["post"].split(","))
            if not set(changed) <= set(PERSONAS):
                raise ValueError(f"authz matrix: unknown persona in {line!r}")
            merged = [changed.get(p, cell) for p, cell in zip(PERSONAS, cells, strict=True)]
            post = _cells(merged, line)
        rows[key] = Row(
            key, cells, values.get("hx", ""), post, values.get("q", ""), values.get("audit", "")
        )
    return rows


def format_row(row: Row) -> str:
    """Return the line of the table that says `row` (what a failing test asks you to paste)."""
    line = row.key.ljust(KEY_WIDTH - 1) + " " + "".join(c.ljust(CELL_WIDTH) for c in row.cells)
    options = []
    if row.hx_target:
        options.append(f"hx={row.hx_target}")
    if row.query:
        options.append(f"q={row.query}")
    if row.post is not None and row.post != row.cells:
        changed = [
            f"{persona}:{post}"
            for persona, cell, post in zip(PERSONAS, row.cells, row.post, strict=True)
            if post != cell
        ]
        options.append("post=" + ",".join(changed))
    if row.audited_read:
        options.append(f"audit={row.audited_read}")
    return (line + " ".join(options)).rstrip()


MATRIX: dict[str, Row] = _parse(TABLE)
