"""UAL screens: the entries, the read-only audit log, and the console pages
(:mod:`ual.console`) mounted under the entry admin."""

from __future__ import annotations

import json

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from topics.display import breakable_path

from .audit import acting_as, user_name
from .console import bulk_grant_view, effective_rights_view
from .models import UALAuditLog, UALEntry


class AuditedAdminMixin:
    """Names the logged-in user as the actor of every UAL change an admin view makes (the
    add/change form with its inlines, the delete page, and changelist actions)."""

    def changeform_view(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        with acting_as(lambda: user_name(request)):
            return super().changeform_view(request, *args, **kwargs)

    def delete_view(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        with acting_as(lambda: user_name(request)):
            return super().delete_view(request, *args, **kwargs)

    def changelist_view(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        with acting_as(lambda: user_name(request)):
            return super().changelist_view(request, *args, **kwargs)


@admin.action(description="Grant a right on a topic to the selected accounts…")
def grant_right_on_topic(modeladmin: admin.ModelAdmin, request: HttpRequest,
                         queryset: QuerySet) -> HttpResponse:
    """Account changelist action: the bulk-grant form with the selected accounts chosen
    (for ``AccountAdmin.actions``)."""
    ids = ",".join(str(pk) for pk in queryset.values_list("pk", flat=True))
    url = reverse("admin:ual_ualentry_bulk_grant")
    return HttpResponseRedirect(f"{url}?{urlencode({'accounts': ids})}")


@admin.register(UALEntry)
class UALEntryAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("topic_shown", "principal", "right", "effect", "created")
    list_filter = ("right", "effect", "principal_kind")
    list_select_related = ("topic", "account", "group")
    search_fields = ("topic__path", "account__username", "group__name")
    autocomplete_fields = ("account", "topic")
    fieldsets = (
        (None, {"fields": ("topic", "right", "effect")}),
        ("Principal", {
            "fields": ("principal_kind", "account", "group"),
            "description": "An account or a remote server names the account; a group names "
                           "the group; everyone names neither.",
        }),
    )

    @admin.display(description="topic", ordering="topic__path")
    def topic_shown(self, obj: UALEntry) -> str:
        return breakable_path(obj.topic.path)

    @admin.display(description="principal", ordering="principal_kind")
    def principal(self, obj: UALEntry) -> str:
        return obj.principal_label

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("effective-rights/", wrap(self.effective_rights_view),
                 name=f"{prefix}_effective_rights"),
            path("bulk-grant/", wrap(self.bulk_grant_view), name=f"{prefix}_bulk_grant"),
            *super().get_urls(),
        ]

    def effective_rights_view(self, request: HttpRequest) -> HttpResponse:
        return effective_rights_view(self, request)

    def bulk_grant_view(self, request: HttpRequest) -> HttpResponse:
        return bulk_grant_view(self, request)


@admin.register(UALAuditLog)
class UALAuditLogAdmin(admin.ModelAdmin):
    """Read-only for everyone, superusers included: the log is evidence."""

    list_display = ("at", "actor", "action", "summary")
    list_filter = ("action", "actor")
    search_fields = ("summary", "topic", "actor")
    date_hierarchy = "at"
    fields = ("at", "actor", "action", "entry_id", "topic", "summary", "before_pretty",
              "after_pretty")
    readonly_fields = fields

    @admin.display(description="before")
    def before_pretty(self, obj: UALAuditLog) -> str:
        return self._json(obj.before)

    @admin.display(description="after")
    def after_pretty(self, obj: UALAuditLog) -> str:
        return self._json(obj.after)

    @staticmethod
    def _json(value: dict | None) -> str:
        if value is None:
            return "-"
        return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: UALAuditLog | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: UALAuditLog | None = None) -> bool:
        return False
