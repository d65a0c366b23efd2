"""Top-level URL configuration."""

from django.contrib import admin
from django.urls import include, path

from accounts import views as accounts_views
from casehub import views
from casehub.api import api
from observability.views import metrics_view
from oversight import views as oversight_views

urlpatterns = [
    path("", oversight_views.home, name="home"),
    path("", include("accounts.urls")),
    path("", include("oversight.urls")),
    path("", include("execution.urls")),
    path("", include("quality.urls")),
    path("", include("planning.urls")),
    path("health", views.health, name="health"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("metrics", metrics_view, name="metrics"),
    path("login/", accounts_views.SignInView.as_view(), name="login"),
    path("logout/", accounts_views.SignOutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
]

# Error pages in the site's layout (a notice in the page's error region for htmx requests).
handler403 = "oversight.views.permission_denied"
handler404 = "oversight.views.page_not_found"
# A malformed or oversized request, and an unexpected error: generic, with an error id to quote.
handler400 = "oversight.views.bad_request"
handler500 = "oversight.views.server_error"
