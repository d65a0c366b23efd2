from django.urls import path

from quality import views

app_name = "quality"

urlpatterns = [
    path("quality/", views.quality, name="quality"),
    path("quality/plans/", views.plan_evaluation, name="plan-evaluation"),
    path("quality/export.csv", views.quality_csv, name="quality-csv"),
    path("cases/<int:case_id>/quality/", views.case_quality_page, name="case-quality"),
]
