from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from ual.admin import grant_right_on_topic

from .models import Account, LoginSession


@admin.register(Account)
class AccountAdmin(UserAdmin):
    list_display = ("username", "proper_name", "email", "is_remote_server", "is_superuser",
                    "is_active", "last_login")
    list_filter = ("is_remote_server", "is_superuser", "is_active", "groups")
    search_fields = ("username", "proper_name", "email")
    ordering = ("username",)
    actions = [grant_right_on_topic]
    fieldsets = (
        (None, {"fields": ("username", "password")}),
        ("Owner", {"fields": ("proper_name", "email", "postal_address", "phone")}),
        ("SMQP", {"fields": ("is_remote_server",)}),
        ("Permissions", {"fields": ("is_active", "is_staff", "is_superuser", "groups")}),
        ("Dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = (
        (None, {"classes": ("wide",),
                "fields": ("username", "password1", "password2", "is_remote_server")}),
    )


@admin.register(LoginSession)
class LoginSessionAdmin(admin.ModelAdmin):
    list_display = ("guid", "account", "auth_method", "peer_address", "started", "ended")
    list_filter = ("auth_method", ("ended", admin.EmptyFieldListFilter))
    search_fields = ("guid", "account__username", "peer_address")
    date_hierarchy = "started"
    readonly_fields = [f.name for f in LoginSession._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
