from django.contrib import admin
from django.utils.html import format_html_join

from ual.models import UALEntry

from .models import QUEUE_PARAMETERS, Topic, TopicKeyword


class KeywordInline(admin.TabularInline):
    model = TopicKeyword
    extra = 1
    fields = ("keyword", "position")


class UALEntryInline(admin.TabularInline):
    model = UALEntry
    extra = 0
    fields = ("principal_kind", "account", "group", "right", "effect")
    autocomplete_fields = ("account",)


@admin.register(Topic)
class TopicAdmin(admin.ModelAdmin):
    list_display = ("path", "link", "state", "delivery_mode", "account")
    list_filter = ("state", "delivery_mode", ("link", admin.EmptyFieldListFilter))
    search_fields = ("path", "keywords__keyword")
    raw_id_fields = ("parent", "link", "account")
    readonly_fields = ("effective_queue_parameters", "created", "updated")
    inlines = [KeywordInline, UALEntryInline]
    fieldsets = (
        (None, {"fields": ("path", "parent", "link", "account", "state", "delivery_mode")}),
        ("Queue parameters (empty: inherited)", {"fields": QUEUE_PARAMETERS}),
        ("In effect", {"fields": ("effective_queue_parameters", "created", "updated")}),
    )

    @admin.display(description="effective queue parameters")
    def effective_queue_parameters(self, obj: Topic):
        if obj.pk is None:
            return "-"
        rows = obj.effective_parameters().items()
        return format_html_join(
            "\n", "<div><b>{}</b>: {} <i>({})</i></div>",
            ((name, "unlimited" if value is None else value, source)
             for name, (value, source) in rows),
        )
