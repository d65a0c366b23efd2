from django.urls import path

from oversight import views

app_name = "oversight"

urlpatterns = [
    path("audit/", views.audit_list, name="audit-list"),
]
