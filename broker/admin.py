from collections import defaultdict

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from broker.domain.values import SmuidSet
from broker.services import ServiceError
from broker.services.removal import remove_messages
from broker.services.selectors import SelectorError, compile_selector
from broker.services.stats import DELIVERY_COUNTS, message_status
from topics.admin import console_snapshot, refusal
from topics.display import breakable_path

from .models import DataSection, Delivery, Message, QQPKey, Subscription, UsageEvent


class DataSectionInline(admin.TabularInline):
    model = DataSection
    extra = 0
    fields = ("position", "content_type", "content_length", "content_encoding", "headers")
    readonly_fields = fields
    can_delete = False


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "topic_shown", "publisher", "cmuid", "name", "priority", "status",
                    "received", "size")
    list_filter = ("state",)
    list_select_related = ("topic", "publisher")
    search_fields = ("=id", "cmuid", "name", "topic__path", "publisher__username")
    date_hierarchy = "received"
    raw_id_fields = ("topic", "publisher", "in_reply_to")
    inlines = [DataSectionInline]
    actions = ["remove_into_trash"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(**DELIVERY_COUNTS)

    @admin.display(description="topic", ordering="topic__path")
    def topic_shown(self, message: Message) -> str:
        return breakable_path(message.topic.path)

    @admin.display(description="state", ordering="state")
    def status(self, message: Message) -> str:
        return message_status(message.state, message.n_deliveries, message.n_acked,
                              message.n_dead)

    @admin.action(description="Remove the selected pending messages into Trash",
                  permissions=["change"])
    def remove_into_trash(self, request: HttpRequest, queryset: QuerySet) -> None:
        """As REMOVE MESSAGE, topic by topic: the way to end a state message (negative
        timeout), which is otherwise kept for good."""
        by_topic: dict[str, list[int]] = defaultdict(list)
        for smuid, path in queryset.filter(state=Message.State.PENDING).values_list(
                "pk", "topic__path"):
            by_topic[path].append(smuid)
        snapshot = console_snapshot(request.user)
        moved = 0
        for path, smuids in sorted(by_topic.items()):
            try:
                moved += len(remove_messages(
                    snapshot, path, SmuidSet(tuple((n, n) for n in sorted(smuids))),
                    include_removing=True))
            except ServiceError as exc:
                self.message_user(request, f"{path}: {refusal(exc)}", messages.ERROR)
        self.message_user(request, f"{moved} message(s) moved into Trash.", messages.SUCCESS)


class SubscriptionForm(forms.ModelForm):
    """A selector entered here is checked as SUB checks it (566 / 567 as form errors)."""

    selector_class = forms.ChoiceField(
        required=False, choices=[("", "none: every message"), ("JMS", "JMS"),
                                 ("RFC-2254", "RFC-2254 (LDAP)")])

    class Meta:
        model = Subscription
        fields = "__all__"

    def clean(self) -> dict:
        data = super().clean()
        cls, text = data.get("selector_class") or "", data.get("selector") or ""
        if cls or text.strip():
            try:
                selector = compile_selector(cls, text)
            except SelectorError as exc:
                raise forms.ValidationError(exc.text) from None
            data["selector_class"], data["selector"] = selector.cls, selector.text
        return data


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    # Selector and lease end: content-based subscriptions and leases (profile §9.2, §9.3).
    form = SubscriptionForm
    list_display = ("account", "resource", "pattern_shown", "selector_shown", "lease_end",
                    "since", "created")
    list_filter = ("resource", "selector_class")
    search_fields = ("account__username", "pattern", "selector")
    raw_id_fields = ("account",)

    @admin.display(description="pattern", ordering="pattern")
    def pattern_shown(self, obj: Subscription) -> str:
        return breakable_path(obj.pattern)

    @admin.display(description="selector", ordering="selector")
    def selector_shown(self, obj: Subscription) -> str:
        if not obj.selector_class:
            return "-"
        text = obj.selector if len(obj.selector) <= 80 else obj.selector[:77] + "..."
        return f"{obj.selector_class} {text}"


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    # holder / next_attempt: a queue-mode lock's session and deadline (profile §9.6).
    list_display = ("message_id", "topic", "account", "state", "attempts", "holder",
                    "next_attempt", "last_attempt", "acked")
    list_filter = ("state",)
    list_select_related = ("message__topic", "account")
    search_fields = ("=message__id", "account__username", "message__topic__path")

    @admin.display(description="message", ordering="message_id")
    def message_id(self, delivery: Delivery) -> int:
        return delivery.message_id

    @admin.display(description="topic", ordering="message__topic__path")
    def topic(self, delivery: Delivery) -> str:
        return breakable_path(delivery.message.topic.path)
    raw_id_fields = ("message", "account")


@admin.register(UsageEvent)
class UsageEventAdmin(admin.ModelAdmin):
    list_display = ("at", "kind", "account", "topic_shown", "smuid", "bytes", "peer")
    list_filter = ("kind",)
    search_fields = ("account", "topic", "peer")
    date_hierarchy = "at"

    @admin.display(description="topic", ordering="topic")
    def topic_shown(self, event: UsageEvent) -> str:
        return breakable_path(event.topic)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in UsageEvent._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(QQPKey)
class QQPKeyAdmin(admin.ModelAdmin):
    """The OpenPGP keys whose QQP signatures publish as their account. Added with
    ``manage.py qqpkey ACCOUNT FILE``, which reads the key and its subkeys' IDs; here they are
    listed and can be removed."""

    list_display = ("key_id", "account", "fingerprint")
    search_fields = ("key_id", "fingerprint", "account__username")
    readonly_fields = ("account", "key_id", "fingerprint", "armored")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


# ----------------------------------------------------------------- federation (profile §9.5)

from django import forms  # noqa: E402

from broker.services import federation as federation_rules  # noqa: E402

from .models import FederatedOrigin, Link  # noqa: E402


class LinkForm(forms.ModelForm):
    class Meta:
        model = Link
        fields = "__all__"
        # Kept as given (the link logs in with it), never shown back: left blank on a
        # change, the one stored stays.
        widgets = {"password": forms.PasswordInput(render_value=False)}

    def clean_password(self) -> str:
        given = self.cleaned_data.get("password", "")
        if not given and self.instance.pk is not None:
            return Link.objects.get(pk=self.instance.pk).password
        return given

    def clean_imports(self) -> str:
        try:
            parsed = federation_rules.parse_imports(self.cleaned_data["imports"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from exc
        if not parsed:
            raise forms.ValidationError("Name at least one topic pattern (/* for all).")
        return ", ".join(str(p) for p in parsed)


@admin.register(Link)
class LinkAdmin(admin.ModelAdmin):
    """Links to peer servers; the supervisor (``runlinks``, in ``runbroker``) writes each
    one's state, counters and last error, and picks a change here up within seconds."""

    form = LinkForm
    list_display = ("name", "peer", "enabled", "state", "backlog", "stored", "dropped",
                    "last_connected", "last_error")
    list_filter = ("state", "enabled")
    search_fields = ("name", "host", "account")
    readonly_fields = ("state", "backlog", "stored", "dropped", "last_change", "last_connected",
                       "last_error", "subscribed")
    raw_id_fields = ("peer_account",)
    fieldsets = (
        (None, {"fields": ("name", "enabled", "imports")}),
        ("Peer", {"fields": ("host", "port", "account", "password", "tls", "tls_ca",
                             "tls_server_name", "peer_account")}),
        ("State", {"fields": ("state", "backlog", "stored", "dropped", "last_change",
                              "last_connected", "last_error", "subscribed")}),
    )

    @admin.display(description="peer")
    def peer(self, link: Link) -> str:
        return f"{link.account}@{link.host}:{link.port}{' (SMQPS)' if link.tls else ''}"

    @admin.display(description="backlog")
    def backlog(self, link: Link) -> str:
        """What this server holds for the peer, not yet stored and ACKed there."""
        found = federation_rules.backlog(link)
        return "-" if found is None else str(found)


@admin.register(FederatedOrigin)
class FederatedOriginAdmin(admin.ModelAdmin):
    list_display = ("origin", "message", "link", "received")
    search_fields = ("=origin", "link")
    raw_id_fields = ("message",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
