from django.urls import path

from oversight import views

app_name = "oversight"

urlpatterns = [
    path("gates/<int:gate_id>/", views.gate_detail, name="gate-detail"),
    path("audit/", views.audit_list, name="audit-list"),
    path("audit/cases/<int:case_id>/", views.case_trail, name="case-trail"),
    path("audit/cases/<int:case_id>/export", views.case_trail_export, name="case-trail-export"),
    path("audit/verifier/casehub_verify.py", views.verifier_download, name="verifier-download"),
    path("audit/keys/<str:key_id>.pub", views.public_key_download, name="public-key-download"),
]
