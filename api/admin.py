"""API tokens in the admin: made here (the token is shown once, in the message after the
save), listed with their account, expiry and last use, revoked by an action."""

from __future__ import annotations

from django.contrib import admin, messages
from django.utils import timezone

from .models import ApiToken
from .tokens import create_token, revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "account", "key_id", "created", "expires", "revoked", "last_used")
    list_filter = ("revoked",)
    search_fields = ("name", "account__username", "key_id")
    readonly_fields = ("key_id", "created", "revoked", "last_used")
    autocomplete_fields = ("account",)
    actions = ["revoke_tokens"]

    def get_fields(self, request, obj=None):
        return ("account", "name", "expires") if obj is None else (
            "account", "name", "key_id", "created", "expires", "revoked", "last_used")

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else ("account", "key_id", "created", "revoked", "last_used")

    def save_model(self, request, obj: ApiToken, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        days = max(1, (obj.expires - timezone.now()).days) if obj.expires else None
        token, text = create_token(obj.account, obj.name, days)
        if obj.expires:
            ApiToken.objects.filter(pk=token.pk).update(expires=obj.expires)
        obj.pk = token.pk
        self.message_user(request, f"Token for {obj.account}: {text} (shown once; copy it "
                                   "now)", messages.WARNING)

    @admin.action(description="Revoke the selected tokens")
    def revoke_tokens(self, request, queryset) -> None:
        for token in queryset:
            revoke(token)
        self.message_user(request, f"{queryset.count()} token(s) revoked.")
