from django.urls import path

from accounts import views

app_name = "accounts"

urlpatterns = [
    path("account/", views.account, name="account"),
    path(
        "account/log-out-everywhere",
        views.account_log_out_everywhere,
        name="account-log-out-everywhere",
    ),
    path(
        "account/tokens/<int:token_id>/revoke",
        views.account_token_revoke,
        name="account-token-revoke",
    ),
    path("oidc/sign-in/", views.oidc_sign_in, name="oidc-sign-in"),
    path("oidc/callback/", views.oidc_callback, name="oidc-callback"),
    path("sign-in-lockouts/", views.lockout_list, name="lockout-list"),
    path("sign-in-lockouts/lift", views.lockout_lift, name="lockout-lift"),
]
