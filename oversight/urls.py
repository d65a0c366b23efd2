from django.urls import path

from oversight import views
from oversight.views import account, execution, gates, lockouts, quality, versions

app_name = "oversight"

urlpatterns = [
    path("account/", account.account, name="account"),
    path(
        "account/log-out-everywhere",
        account.account_log_out_everywhere,
        name="account-log-out-everywhere",
    ),
    path(
        "account/tokens/<int:token_id>/revoke",
        account.account_token_revoke,
        name="account-token-revoke",
    ),
    path("inbox/", gates.inbox, name="inbox"),
    path("inbox/approve", gates.inbox_approve, name="inbox-approve"),
    path("gates/<int:gate_id>/", gates.gate_detail, name="gate-detail"),
    path("gates/<int:gate_id>/decide", gates.gate_decide, name="gate-decide"),
    path("cases/<int:case_id>/gates/", gates.case_gates, name="case-gates"),
    path("cases/<int:case_id>/versions/", versions.version_history, name="version-history"),
    path("cases/<int:case_id>/versions/diff/", versions.version_diff, name="version-diff"),
    path("cases/<int:case_id>/nodes/<int:node_id>/edit/", versions.plan_edit, name="plan-edit"),
    path("cases/<int:case_id>/execution/", execution.case_execution, name="case-execution"),
    path("cases/<int:case_id>/cancel", execution.case_cancel, name="case-cancel"),
    path("work-items/", execution.work_item_list, name="work-item-list"),
    path("work-items/<int:item_id>/", execution.work_item_detail, name="work-item"),
    path(
        "work-items/<int:item_id>/complete",
        execution.work_item_complete,
        name="work-item-complete",
    ),
    path("execution/", execution.execution_control, name="execution-control"),
    path("execution/control", execution.execution_control_set, name="execution-control-set"),
    path("sign-in-lockouts/", lockouts.lockout_list, name="lockout-list"),
    path("sign-in-lockouts/lift", lockouts.lockout_lift, name="lockout-lift"),
    path("notifications/", gates.notifications, name="notifications"),
    path("notifications/read-all", gates.notifications_read_all, name="notifications-read-all"),
    path(
        "notifications/<int:notification_id>/read",
        gates.notification_read,
        name="notification-read",
    ),
    path("quality/", quality.quality, name="quality"),
    path("quality/export.csv", quality.quality_csv, name="quality-csv"),
    path("cases/<int:case_id>/quality/", quality.case_quality_page, name="case-quality"),
    path("audit/", views.audit_list, name="audit-list"),
    path("audit/cases/<int:case_id>/", views.case_trail, name="case-trail"),
    path("audit/cases/<int:case_id>/export", views.case_trail_export, name="case-trail-export"),
    path("audit/verifier/casehub_verify.py", views.verifier_download, name="verifier-download"),
    path("audit/keys/<str:key_id>.pub", views.public_key_download, name="public-key-download"),
]
