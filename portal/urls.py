from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, register_converter
from django.views import defaults
from rest_framework.routers import SimpleRouter

from billing.urls import api_urlpatterns as billing_api
from clusters.urls import api_urlpatterns as clusters_api
from identity import views as identity_views
from identity.urls import api_urlpatterns as identity_api
from jobs import views as jobs_views
from jobs.urls import api_urlpatterns as jobs_api
from monitoring import api as monitoring_api
from monitoring import views as monitoring_views
from monitoring.urls import api_urlpatterns as monitoring_api_urls
from portal.core import accounts, converters, errors, token_pages
from portal.core import api as core_api
from portal.core import views as core_views
from reports.urls import api_urlpatterns as reports_api
from reports.urls import pages as reports_pages
from tenants import views as tenants_views
from tenants.urls import api_urlpatterns as tenants_api
from webhooks import views as webhooks_views
from webhooks.urls import api_urlpatterns as webhooks_api

router = SimpleRouter()
router.register("auth/tokens", core_api.TokenViewSet, basename="token")

api_v1 = [
    path("auth/token/", core_api.TokenCreate.as_view(), name="token-create"),
    path("schema/", core_api.SchemaView.as_view(), name="schema"),
    path("docs/", core_api.DocsView.as_view(url_name="schema"), name="docs"),
    *router.urls,
    *tenants_api,
    *clusters_api,
    *billing_api,
    *jobs_api,
    *reports_api,
    *monitoring_api_urls,
    *identity_api,
    *webhooks_api,
]

register_converter(converters.IdConverter, "id")
register_converter(converters.SlugConverter, "tslug")
register_converter(converters.UsernameConverter, "username")
register_converter(converters.Base64IdConverter, "uidb64")
register_converter(converters.ResetTokenConverter, "reset_token")
register_converter(converters.WebhookActionConverter, "webhook_action")

# The researcher portal's pages: everything of a tenant lives under /t/<slug>/.
pages = [
    path("t/", tenants_views.tenant_switch, name="tenant-switch"),
    path("t/<tslug:slug>/", jobs_views.dashboard, name="dashboard"),
    path("t/<tslug:slug>/jobs/", jobs_views.job_list, name="job-list"),
    path("t/<tslug:slug>/jobs/rows/", jobs_views.job_rows, name="job-rows"),
    path("t/<tslug:slug>/jobs/new/", jobs_views.job_new, name="job-new"),
    path("t/<tslug:slug>/jobs/new/check/", jobs_views.job_check, name="job-check"),
    path("t/<tslug:slug>/jobs/<id:job_id>/", jobs_views.job_detail, name="job-detail"),
    path("t/<tslug:slug>/jobs/<id:job_id>/live/", jobs_views.job_live, name="job-live"),
    path("t/<tslug:slug>/jobs/<id:job_id>/log/", jobs_views.job_log, name="job-log"),
    path("t/<tslug:slug>/jobs/<id:job_id>/cancel/", jobs_views.job_cancel, name="job-cancel"),
    path("t/<tslug:slug>/quota/", tenants_views.quota, name="quota"),
    path("t/<tslug:slug>/budget/", jobs_views.budget, name="budget"),
    path("t/<tslug:slug>/quota/advise/", tenants_views.quota_advise, name="quota-advise"),
    path(
        "t/<tslug:slug>/quota/<id:request_id>/withdraw/", tenants_views.quota_withdraw, name="quota-withdraw"
    ),
    path("t/<tslug:slug>/clusters/", tenants_views.clusters, name="clusters"),
    path("t/<tslug:slug>/webhooks/", webhooks_views.webhooks, name="webhooks"),
    path(
        "t/<tslug:slug>/webhooks/<id:endpoint_id>/<webhook_action:action>/",
        webhooks_views.endpoint_action,
        name="webhook-action",
    ),
    path(
        "t/<tslug:slug>/webhooks/<id:endpoint_id>/deliveries/<id:delivery_id>/redeliver/",
        webhooks_views.redeliver,
        name="webhook-redeliver",
    ),
    path("t/<tslug:slug>/team/", tenants_views.team, name="team"),
    path("t/<tslug:slug>/team/add/", tenants_views.member_add, name="member-add"),
    path("t/<tslug:slug>/team/<username:username>/role/", tenants_views.member_role, name="member-role"),
    path(
        "t/<tslug:slug>/team/<username:username>/remove/", tenants_views.member_remove, name="member-remove"
    ),
    *reports_pages,
]

urlpatterns = [
    path("healthz", core_views.healthz, name="healthz"),
    path("readyz", core_views.readyz, name="readyz"),
    path("metrics", monitoring_views.metrics, name="metrics"),
    path("hooks/alertmanager", monitoring_api.AlertmanagerReceiver.as_view(), name="alertmanager-hook"),
    path("api/v1/", include(api_v1)),
    path("admin/", admin.site.urls),
    path("accounts/login/", identity_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", identity_views.LogoutView.as_view(), name="logout"),
    path("accounts/oidc/login/", identity_views.OidcLoginView.as_view(), name="oidc-login"),
    path("accounts/oidc/callback/", identity_views.OidcCallbackView.as_view(), name="oidc-callback"),
    # The mail leaves the request (portal.core.accounts): the answer is the same, and as quick,
    # for an address with an account and one without.
    path("accounts/password_reset/", accounts.PasswordResetView.as_view(), name="password_reset"),
    path(
        "accounts/password_reset/done/",
        auth_views.PasswordResetDoneView.as_view(),
        name="password_reset_done",
    ),
    path(
        "accounts/reset/<uidb64:uidb64>/<reset_token:token>/",
        accounts.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path(
        "accounts/reset/done/", auth_views.PasswordResetCompleteView.as_view(), name="password_reset_complete"
    ),
    path("account/tokens/", token_pages.tokens, name="tokens"),
    path("account/notifications/", webhooks_views.notifications, name="notifications"),
    path("account/tokens/new/", token_pages.token_new, name="token-new"),
    path("account/tokens/<id:token_id>/revoke/", token_pages.token_delete, name="token-delete"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("", tenants_views.home, name="home"),
    *pages,
]

admin.site.site_header = "GPU portal administration"


def handler404(request, exception):
    if request.path.startswith("/api/"):
        return errors.api_not_found(request, exception)
    return defaults.page_not_found(request, exception)


def handler500(request):
    if request.path.startswith("/api/"):
        return errors.api_server_error(request)
    return defaults.server_error(request)


if settings.DEBUG:
    urlpatterns.append(path("api-auth/", include("rest_framework.urls")))
