from django.urls import path

from oversight import views
from oversight.views import gates, versions, whatif

app_name = "oversight"

urlpatterns = [
    path("inbox/", gates.inbox, name="inbox"),
    path("inbox/approve", gates.inbox_approve, name="inbox-approve"),
    path("gates/<int:gate_id>/", gates.gate_detail, name="gate-detail"),
    path("gates/<int:gate_id>/decide", gates.gate_decide, name="gate-decide"),
    path("cases/<int:case_id>/gates/", gates.case_gates, name="case-gates"),
    path("cases/<int:case_id>/versions/", versions.version_history, name="version-history"),
    path("cases/<int:case_id>/versions/diff/", versions.version_diff, name="version-diff"),
    path("cases/<int:case_id>/nodes/<int:node_id>/edit/", versions.plan_edit, name="plan-edit"),
    path(
        "cases/<int:case_id>/nodes/<int:node_id>/add-after/",
        versions.plan_add_step,
        name="plan-add-step",
    ),
    path("policy/versions/<int:version_id>/what-if/", whatif.policy_whatif, name="policy-whatif"),
    path("policy/what-if/<int:whatif_id>/", whatif.whatif_report, name="whatif-report"),
    path("notifications/", gates.notifications, name="notifications"),
    path("notifications/read-all", gates.notifications_read_all, name="notifications-read-all"),
    path(
        "notifications/<int:notification_id>/read",
        gates.notification_read,
        name="notification-read",
    ),
    path("audit/", views.audit_list, name="audit-list"),
    path("audit/cases/<int:case_id>/", views.case_trail, name="case-trail"),
    path("audit/cases/<int:case_id>/export", views.case_trail_export, name="case-trail-export"),
    path("audit/verifier/casehub_verify.py", views.verifier_download, name="verifier-download"),
    path("audit/keys/<str:key_id>.pub", views.public_key_download, name="public-key-download"),
]
