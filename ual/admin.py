from django.contrib import admin

from .models import UALEntry


@admin.register(UALEntry)
class UALEntryAdmin(admin.ModelAdmin):
    list_display = ("topic", "principal_kind", "account", "group", "right", "effect", "created")
    list_filter = ("right", "effect", "principal_kind")
    search_fields = ("topic__path", "account__username", "group__name")
    autocomplete_fields = ("account", "topic")
