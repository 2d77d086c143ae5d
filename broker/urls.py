from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
]

# The REST API (issue 24): /api/v1/, its OpenAPI schema and docs.
urlpatterns += [path("api/", include("api.urls"))]
