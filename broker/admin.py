from django.contrib import admin

from .models import DataSection, Delivery, Message, Subscription, UsageEvent


class DataSectionInline(admin.TabularInline):
    model = DataSection
    extra = 0
    fields = ("position", "content_type", "content_length", "content_encoding", "headers")
    readonly_fields = fields
    can_delete = False


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "topic", "publisher", "cmuid", "name", "priority", "state", "received",
                    "size")
    list_filter = ("state",)
    search_fields = ("=id", "cmuid", "name", "topic__path", "publisher__username")
    date_hierarchy = "received"
    raw_id_fields = ("topic", "publisher", "in_reply_to")
    inlines = [DataSectionInline]


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ("account", "resource", "pattern", "since", "created")
    list_filter = ("resource",)
    search_fields = ("account__username", "pattern")
    raw_id_fields = ("account",)


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("message", "account", "state", "attempts", "last_attempt", "acked")
    list_filter = ("state",)
    search_fields = ("=message__id", "account__username")
    raw_id_fields = ("message", "account")


@admin.register(UsageEvent)
class UsageEventAdmin(admin.ModelAdmin):
    list_display = ("at", "kind", "account", "topic", "smuid", "bytes", "peer")
    list_filter = ("kind",)
    search_fields = ("account", "topic", "peer")
    date_hierarchy = "at"

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in UsageEvent._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
