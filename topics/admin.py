"""Topic screens: the change list and form (with keywords, UAL entries and queue parameters
showing what they inherit), and the whole tree on one page."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from ual.admin import AuditedAdminMixin
from ual.models import UALEntry

from . import paths
from .models import QUEUE_PARAMETERS, Topic, TopicKeyword

# The tree page lists at most this many topics (narrow it with "under").
TREE_LIMIT = 5000


class KeywordInline(admin.TabularInline):
    model = TopicKeyword
    extra = 1
    fields = ("keyword", "position")


class UALEntryInline(admin.TabularInline):
    model = UALEntry
    extra = 0
    fields = ("principal_kind", "account", "group", "right", "effect")
    autocomplete_fields = ("account",)


def inherited_parameters(topic: Topic) -> dict[str, tuple[int | None, str]]:
    """What each queue parameter of ``topic`` would be if it set none itself: the parent's
    effective value and where that comes from (a topic path or "server default")."""
    parent = topic.parent if topic.parent_id else None
    if parent is not None:
        return parent.effective_parameters()
    return {name: (settings.SMQP_QUEUE_DEFAULTS.get(name), "server default")
            for name in QUEUE_PARAMETERS}


def _shown(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


@admin.register(Topic)
class TopicAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("path", "link", "state", "delivery_mode", "account")
    list_filter = ("state", "delivery_mode", ("link", admin.EmptyFieldListFilter))
    search_fields = ("path", "keywords__keyword")
    raw_id_fields = ("parent", "link", "account")
    readonly_fields = ("effective_queue_parameters", "access", "created", "updated")
    inlines = [KeywordInline, UALEntryInline]
    fieldsets = (
        (None, {"fields": ("path", "parent", "link", "account", "state", "delivery_mode")}),
        ("Queue parameters (empty: inherited)", {
            "fields": QUEUE_PARAMETERS,
            "description": "An empty parameter takes its parent's value, up to the server "
                           "defaults at the root; each field says what it inherits now.",
        }),
        ("In effect", {"fields": ("effective_queue_parameters", "access", "created",
                                  "updated")}),
    )

    def get_form(self, request: HttpRequest, obj: Topic | None = None, **kwargs):
        """Each queue parameter's help text tells what an empty field inherits, and from
        where (form classes are built per request, so changing them here is safe)."""
        form = super().get_form(request, obj, **kwargs)
        inherited = inherited_parameters(obj) if obj is not None else inherited_parameters(
            Topic())
        for name in QUEUE_PARAMETERS:
            field = form.base_fields.get(name)
            if field is None:
                continue
            value, source = inherited[name]
            note = f"Empty: inherits {_shown(value)} from {source}."
            field.help_text = f"{field.help_text} {note}".strip() if field.help_text else note
        return form

    @admin.display(description="queue parameters in effect")
    def effective_queue_parameters(self, obj: Topic) -> str:
        if obj.pk is None:
            return "-"
        effective = obj.effective_parameters()
        inherited = inherited_parameters(obj)
        rows = []
        for name in QUEUE_PARAMETERS:
            value, source = effective[name]
            own = getattr(obj, name)
            parent_value, parent_source = inherited[name]
            if own is not None:
                where = "set here"
                note = f"overrides {_shown(parent_value)} from {parent_source}"
            else:
                where = f"inherited from {source}"
                note = ""
            rows.append((name, _shown(value), where, note))
        body = format_html_join(
            "", "<tr data-parameter='{}'><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((name, name, value, where, note) for name, value, where, note in rows))
        return format_html(
            "<table id='queue-parameters'><thead><tr><th>parameter</th><th>in effect</th>"
            "<th>source</th><th></th></tr></thead><tbody>{}</tbody></table>", body)

    @admin.display(description="access")
    def access(self, obj: Topic) -> str:
        if obj.pk is None:
            return "-"
        real = obj.resolved()
        count = real.ual_entries.count()
        entries = reverse("admin:ual_ualentry_changelist") + "?" + urlencode(
            {"topic__id__exact": real.pk})
        rights = reverse("admin:ual_ualentry_effective_rights") + "?" + urlencode(
            {"topic": obj.path})
        grant = reverse("admin:ual_ualentry_bulk_grant") + "?" + urlencode({"topic": real.path})
        virtual = format_html(" (kept on the real topic {})", real.path) if obj.is_virtual \
            else ""
        return format_html(
            '<a href="{}">{} UAL {} here</a>{} · <a href="{}">effective rights of an '
            'account here</a> · <a href="{}">grant a right to many accounts</a>',
            entries, count, "entry" if count == 1 else "entries", virtual, rights, grant)

    # ------------------------------------------------------------------------ the tree page

    def get_urls(self) -> list[URLPattern]:
        return [
            path("tree/", self.admin_site.admin_view(self.tree_view), name="topics_topic_tree"),
            *super().get_urls(),
        ]

    def tree_view(self, request: HttpRequest) -> HttpResponse:
        """Every topic as an indented tree, with its link, state and UAL entry count."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        under = request.GET.get("under", "").strip()
        qs = Topic.objects.select_related("link", "account").annotate(
            entry_count=Count("ual_entries"))
        base_depth = 0
        if under:
            key = paths.path_key(under)
            qs = qs.filter(Q(key=key) | Q(key__startswith=key.rstrip("/") + "/"))
            base_depth = max(len(paths.segments(key)) - 1, 0)
        topics = list(qs[: TREE_LIMIT + 1])
        truncated = len(topics) > TREE_LIMIT
        # Sorted by segments, so children follow their parent whatever the DB's collation.
        topics = sorted(topics[:TREE_LIMIT], key=lambda t: paths.segments(t.key))
        rows = [
            {
                "topic": t,
                "name": paths.segments(t.path)[-1],
                "indent": (t.depth - 1 - base_depth) * 1.5,
                "own_parameters": [(n, getattr(t, n)) for n in QUEUE_PARAMETERS
                                   if getattr(t, n) is not None],
            }
            for t in topics
        ]
        return TemplateResponse(request, "admin/topics/topic_tree.html", {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Topic tree",
            "rows": rows,
            "under": under,
            "truncated": truncated,
            "limit": TREE_LIMIT,
            "entries_url": reverse("admin:ual_ualentry_changelist"),
        })
