from django.urls import path

from planning import views

app_name = "planning"

urlpatterns = [
    path("cases/", views.case_list, name="case-list"),
    path("cases/new/", views.case_new, name="case-new"),
    path("cases/<int:case_id>/", views.case_detail, name="case-detail"),
    path("cases/<int:case_id>/nodes/<int:node_id>/", views.node_detail, name="node-detail"),
]
