from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from cadau.apidocs import SchemaView, SwaggerView
from cadau.logins import login_guarded

urlpatterns = [
    # Both HTML logins go through the rate limits and the lockout (cadau/logins.py); the admin's
    # own route is matched first so its form is guarded too.
    path("admin/login/", login_guarded(admin.site.login)),
    path("admin/", admin.site.urls),
    path("accounts/login/", login_guarded(auth_views.LoginView.as_view()), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("chat.api.urls")),
    # An agent's memory: agentmemory's own routes under the agent (chat never imports it).
    path("api/v1/", include("agentmemory.urls")),
    # Behind login unless API_DOCS_PUBLIC (cadau/apidocs.py).
    path("api/schema/", SchemaView.as_view(), name="schema"),
    path("api/docs/", SwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("", include("chat.web.urls")),
]

handler400 = "cadau.handlers.bad_request"
handler404 = "cadau.handlers.not_found"
handler500 = "cadau.handlers.server_error"
