from django.urls import path

from execution import views

app_name = "execution"

urlpatterns = [
    path("cases/<int:case_id>/execution/", views.case_execution, name="case-execution"),
    path("cases/<int:case_id>/cancel", views.case_cancel, name="case-cancel"),
    path("work-items/", views.work_item_list, name="work-item-list"),
    path("work-items/<int:item_id>/", views.work_item_detail, name="work-item"),
    path(
        "work-items/<int:item_id>/complete",
        views.work_item_complete,
        name="work-item-complete",
    ),
    path("execution/", views.execution_control, name="execution-control"),
    path("execution/control", views.execution_control_set, name="execution-control-set"),
]
