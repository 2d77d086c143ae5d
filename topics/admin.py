"""Topic screens: the change list and form (with keywords, UAL entries and queue parameters
showing what they inherit), and the whole tree on one page."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.options import IS_POPUP_VAR
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Q
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from accounts.models import Account
from broker.services import ServiceError
from broker.services import topics as topic_service
from topics.display import breakable_path
from ual.admin import AuditedAdminMixin
from ual.models import UALEntry
from ual.resolution import AccessSnapshot

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


# ------------------------------------------------------------------ through the topic services

#: Set by the topic services (the path decides the parent, an account topic comes with its
#: account, removal sets the state): shown, not edited, here.
SERVICE_FIELDS = ("parent", "account", "state")
#: No SMQP command sets these: the admin saves them as they are.
ADMIN_FIELDS = ("delivery_mode", *QUEUE_PARAMETERS)


def console_snapshot(user: Account) -> AccessSnapshot:
    """How the admin's changes are decided: Django's model permissions let ``user`` into
    the page; the topic services then decide as for a superuser, with the same checks,
    refusals and notifications as over SMQP."""
    acting = copy.copy(user)
    acting.is_superuser = True
    return AccessSnapshot(acting)


def refusal(exc: ServiceError) -> str:
    return f"Refused, as over SMQP: {exc.code} {exc.text}"


class _Undone(Exception):
    pass


def dry_run(call: Callable[[], object]) -> None:
    """Run ``call`` and undo it: it raises what it would refuse, and leaves nothing behind
    (its notifications wait for a commit, and go with the rollback)."""
    try:
        with transaction.atomic():
            call()
            raise _Undone
    except _Undone:
        pass


def edited_keywords(formset: BaseInlineFormSet) -> list[str]:
    """The keywords the keyword inline holds once saved, in order (position, then as
    listed)."""
    kept = []
    for i, form in enumerate(formset.forms):
        data = getattr(form, "cleaned_data", None) or {}
        word = (data.get("keyword") or "").strip()
        if word and not formset._should_delete_form(form):
            kept.append((data.get("position") or 0, i, word))
    return [word for _, _, word in sorted(kept)]


def removable(topic: Topic) -> bool:
    """Can REMOVE TOPIC take it? Not an account topic (it goes with its account), nor one
    being removed already."""
    return (topic.account_id is None and topic.key != paths.ACCOUNTS_ROOT
            and topic.state == Topic.State.ACTIVE)


def removal_outcome(path: str, pending: int) -> str:
    if pending:
        return (f"“{path}” is being removed, as by REMOVE TOPIC: it takes no more publishes, "
                f"and goes, with the topics below it, once its {pending} pending message(s) "
                f"are delivered or expire.")
    return f"“{path}” was removed, with the topics below it."


class TopicForm(forms.ModelForm):
    """Checks a new topic, or a topic's new path, as the topic services will when it is
    saved (TopicAdmin.save_related): their refusal is a form error."""

    #: The user saving (set per request by TopicAdmin.get_form).
    acting_user: Account | None = None

    # XMPP's name for the delivery mode queue (XEP-0254, XMPP-PROFILE §4): the same setting.
    pubsub_queueing = forms.BooleanField(
        required=False, label="pubsub#queueing",
        help_text="XMPP queueing (XEP-0254): the delivery mode “queue”. Changing it changes "
                  "the delivery mode.")

    # Sent by the page that shows the box: a post without it (an unticked box is not sent)
    # leaves the delivery mode to its own field.
    pubsub_queueing_shown = forms.CharField(widget=forms.HiddenInput, required=False,
                                            initial="1")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["pubsub_queueing"].initial = (
            self.instance.delivery_mode == Topic.DeliveryMode.QUEUE)

    def clean(self) -> dict:
        cleaned = super().clean()
        if cleaned.get("pubsub_queueing_shown") == "1" and "pubsub_queueing" in self.changed_data:
            mode = (Topic.DeliveryMode.QUEUE if cleaned.get("pubsub_queueing")
                    else Topic.DeliveryMode.FANOUT)
            cleaned["delivery_mode"] = self.instance.delivery_mode = mode
        new_path = cleaned.get("path")
        if not new_path or "path" in self._errors:
            return cleaned
        try:
            paths.check_creatable(new_path)
        except paths.InvalidTopicPath as exc:
            raise ValidationError({"path": str(exc)}) from exc
        snapshot = console_snapshot(self.acting_user)
        if self.instance.pk is None:
            link = cleaned.get("link")
            call = functools.partial(topic_service.create_topic, snapshot, new_path, None,
                                     link.path if link is not None else None)
        else:
            old = Topic.objects.filter(pk=self.instance.pk).values_list("path", flat=True)[0]
            if old == new_path:
                return cleaned
            call = functools.partial(topic_service.rename_topic, snapshot, old, new_path)
        try:
            dry_run(call)
        except ServiceError as exc:
            raise ValidationError(refusal(exc)) from exc
        return cleaned


@admin.register(Topic)
class TopicAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("path_shown", "link_shown", "state", "delivery_mode", "account")
    list_filter = ("state", "delivery_mode", ("link", admin.EmptyFieldListFilter))
    search_fields = ("path", "keywords__keyword")
    raw_id_fields = ("parent", "link", "account")
    readonly_fields = ("effective_queue_parameters", "access", "created", "updated")
    inlines = [KeywordInline, UALEntryInline]
    form = TopicForm
    fieldsets = (
        (None, {"fields": ("path", "parent", "link", "account", "state", "delivery_mode",
                           "pubsub_queueing", "pubsub_queueing_shown")}),
        ("Queue parameters (empty: inherited)", {
            "fields": QUEUE_PARAMETERS,
            "description": "An empty parameter takes its parent's value, up to the server "
                           "defaults at the root; each field says what it inherits now.",
        }),
        ("In effect", {"fields": ("effective_queue_parameters", "access", "created",
                                  "updated")}),
    )
    list_select_related = ("link", "account")

    @admin.display(description="path", ordering="path")
    def path_shown(self, topic: Topic) -> str:
        return breakable_path(topic.path)

    @admin.display(description="link", ordering="link__path")
    def link_shown(self, topic: Topic) -> str:
        return breakable_path(topic.link.path if topic.link_id else None)

    def get_form(self, request: HttpRequest, obj: Topic | None = None, **kwargs):
        """Each queue parameter's help text tells what an empty field inherits, and from
        where (form classes are built per request, so changing them here is safe)."""
        form = super().get_form(request, obj, **kwargs)
        form.acting_user = request.user
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

    def get_readonly_fields(self, request: HttpRequest, obj: Topic | None = None):
        fields = [*self.readonly_fields, *SERVICE_FIELDS]
        if obj is not None:
            fields.append("link")  # made with the topic, as by CREATE TOPIC /t > /target
        return fields

    # ------------------------------------------------ saving and removing, as SMQP does

    def save_model(self, request: HttpRequest, obj: Topic, form, change: bool) -> None:
        """Nothing yet: the topic is saved with its keywords, in :meth:`save_related`."""

    def save_related(self, request: HttpRequest, form, formsets, change: bool) -> None:
        """The topic goes through the topic services, as SMQP's commands: CREATE TOPIC (with
        its keywords and link), SET TOPIC NAME (the subtree moves with it), SET TOPIC
        KEYWORDS, each checked and told to TOPIC subscribers alike. The delivery mode and
        queue parameters, which no command sets, are saved as they are; the UAL entries
        inline as usual."""
        keyword_sets = [fs for fs in formsets if fs.model is TopicKeyword]
        for formset in keyword_sets:
            formset.save(commit=False)  # what changed, for the history; saved below
        keywords = edited_keywords(keyword_sets[0]) if keyword_sets else None
        try:
            with transaction.atomic():
                self._save_topic(console_snapshot(request.user), form.instance, keywords,
                                 change)
        except ServiceError as exc:  # refused since the form was checked: nothing is kept
            transaction.set_rollback(True)
            request.topic_refused = exc
            self.message_user(request, refusal(exc), messages.ERROR)
            for formset in formsets:
                if formset.model is not TopicKeyword:
                    formset.save(commit=False)
            return
        form.save_m2m()
        for formset in formsets:
            if formset.model is not TopicKeyword:
                self.save_formset(request, form, formset, change)

    def _save_topic(self, snapshot: AccessSnapshot, topic: Topic, keywords: list[str] | None,
                    change: bool) -> None:
        if not change:
            link = topic.link.path if topic.link_id else None
            made = topic_service.create_topic(snapshot, topic.path, tuple(keywords or ()) or None,
                                              link)
            topic.pk, topic.key, topic.parent, topic.created = (
                made.pk, made.key, made.parent, made.created)
            topic._state.adding = False
        else:
            stored = Topic.objects.get(pk=topic.pk)
            if topic.path != stored.path:
                moved = topic_service.rename_topic(snapshot, stored.path, topic.path)
                topic.key, topic.parent = moved.key, moved.parent
            if keywords is not None and keywords != topic_service.keywords_of(stored):
                topic_service.set_keywords(snapshot, topic.path, tuple(keywords))
        topic.save(update_fields=[*ADMIN_FIELDS, "updated"])

    def response_add(self, request: HttpRequest, obj: Topic,
                     post_url_continue: str | None = None) -> HttpResponse:
        if getattr(request, "topic_refused", None) is not None:
            return HttpResponseRedirect(request.get_full_path())
        return super().response_add(request, obj, post_url_continue)

    def response_change(self, request: HttpRequest, obj: Topic) -> HttpResponse:
        if getattr(request, "topic_refused", None) is not None:
            return HttpResponseRedirect(request.get_full_path())
        return super().response_change(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Topic | None = None) -> bool:
        if obj is not None and not removable(obj):
            return False
        return super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs: Iterable[Topic], request: HttpRequest):
        """What the delete pages show: REMOVE TOPIC's outcome, not a cascade (the messages
        stay until they are delivered or expire)."""
        topics = list(objs)
        described = [f"{t.path}, the topics below it and the virtual topics linking there: "
                     f"they take no publishes from now on, and are deleted once their queues "
                     f"are empty (as by REMOVE TOPIC)" for t in topics if removable(t)]
        protected = [f"{t.path}: " + ("being removed already" if t.state != Topic.State.ACTIVE
                                      else "an account topic, removed with its account")
                     for t in topics if not removable(t)]
        return described, {"topics": len(topics)}, set(), protected

    def delete_model(self, request: HttpRequest, obj: Topic) -> None:
        """As REMOVE TOPIC."""
        try:
            pending = topic_service.remove_topic(console_snapshot(request.user), obj.path)
        except ServiceError as exc:
            transaction.set_rollback(True)
            self.message_user(request, f"{obj.path}: {refusal(exc)}", messages.ERROR)
            return
        self.message_user(request, removal_outcome(obj.path, pending), messages.SUCCESS)

    def delete_queryset(self, request: HttpRequest, queryset) -> None:
        """Each as REMOVE TOPIC (one below another goes with it)."""
        snapshot = console_snapshot(request.user)
        for topic in sorted(queryset, key=lambda t: t.key):
            if not Topic.objects.filter(pk=topic.pk, state=Topic.State.ACTIVE).exists():
                continue  # removed with a topic above it, or a topic it links to
            try:
                pending = topic_service.remove_topic(snapshot, topic.path)
            except ServiceError as exc:
                self.message_user(request, f"{topic.path}: {refusal(exc)}", messages.ERROR)
                continue
            self.message_user(request, removal_outcome(topic.path, pending), messages.SUCCESS)

    def response_delete(self, request: HttpRequest, obj_display: str,
                        obj_id: object) -> HttpResponse:
        """The outcome is told by delete_model: Django's "deleted successfully" would not be
        true of a topic kept until its queue empties."""
        if IS_POPUP_VAR in request.POST:
            return super().response_delete(request, obj_display, obj_id)
        return HttpResponseRedirect(reverse("admin:topics_topic_changelist"))

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
