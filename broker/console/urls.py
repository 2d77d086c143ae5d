"""The console's URLs, under ``admin/ops/`` (broker/urls.py); every page is staff only."""

from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("overview.json", admin.site.admin_view(views.overview_json), name="ops-overview-json"),
    path("topic/", admin.site.admin_view(views.topic_page), name="ops-topic"),
    path("topic.json", admin.site.admin_view(views.topic_json), name="ops-topic-json"),
    path("sessions/", admin.site.admin_view(views.sessions_page), name="ops-sessions"),
    path("sessions.json", admin.site.admin_view(views.sessions_json), name="ops-sessions-json"),
    path("republish/", admin.site.admin_view(views.republish), name="ops-republish"),
]
