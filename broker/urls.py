from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from broker.console.health import healthz, readyz
from broker.console.metrics import metrics_view

# The admin modules register here, with the pages (settings: SimpleAdminConfig).
admin.autodiscover()

# What the console's pages and emails call the site (templates/admin/base_site.html brands
# the header and the tab).
admin.site.site_header = admin.site.site_title = "SMQP broker"
admin.site.index_title = "Broker administration"

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    # The operators' console (overview, topic and sessions pages) and /metrics.
    path("admin/ops/", include("broker.console.urls")),
    path("metrics", metrics_view, name="metrics"),
    # For load balancers (HAProxy checks /readyz): docs/cluster.md.
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("admin/", admin.site.urls),
]

# The REST API (issue 24): /api/v1/, its OpenAPI schema and docs.
urlpatterns += [path("api/", include("api.urls"))]
