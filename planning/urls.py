from django.urls import path

from planning import views
from planning.promotion import views as views_promotion

app_name = "planning"

urlpatterns = [
    path("cases/", views.case_list, name="case-list"),
    path("cases/new/", views.case_new, name="case-new"),
    path("cases/<int:case_id>/", views.case_detail, name="case-detail"),
    path("cases/<int:case_id>/nodes/<int:node_id>/", views.node_detail, name="node-detail"),
    path(
        "cases/<int:case_id>/nodes/<int:node_id>/promote/",
        views_promotion.node_promote,
        name="node-promote",
    ),
    path("methods/", views_promotion.method_list, name="method-list"),
    path("methods/<int:method_id>/", views_promotion.method_detail, name="method-detail"),
    path("methods/<int:method_id>/approve/", views_promotion.method_approve, name="method-approve"),
    path("methods/<int:method_id>/reject/", views_promotion.method_reject, name="method-reject"),
    path("methods/<int:method_id>/retire/", views_promotion.method_retire, name="method-retire"),
]
