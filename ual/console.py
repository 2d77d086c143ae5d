"""The administrator's UAL console: the pages the Django admin lacks.

* :func:`effective_rights_view` — pick an account and a topic; every right allowed or denied,
  with the entry and the level that decided it, and the walk up the tree that led there.
* :func:`bulk_grant_view` — one right, allowed or denied, on one topic, for many accounts.

Both are mounted by :class:`ual.admin.UALEntryAdmin` (``get_urls``) and reached from the admin
index and the UAL entry list. The topic tree lives with the topics (:mod:`topics.admin`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django import forms
from django.contrib import messages
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from accounts.models import Account
from topics import paths
from topics.models import Topic

from .audit import acting_as
from .grants import grant_to_many
from .models import Effect, Right, UALEntry
from .resolution import AccessSnapshot, Decision, level_keys

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

# At most this many names are offered as suggestions in the form fields.
SUGGESTIONS = 500


def depth_of(key: str) -> int:
    """``/a/b/c`` → 3."""
    return len(paths.segments(key))


def find_topic(path: str) -> Topic | None:
    try:
        key = paths.path_key(paths.validate_path(path.strip()))
    except paths.InvalidTopicPath:
        return None
    return Topic.objects.select_related("link").filter(key=key).first()


def find_account(name: str) -> Account | None:
    return Account.objects.filter(username_key=name.strip().casefold()).first()


# ---------------------------------------------------------------------------- explanations


@dataclass
class LevelRow:
    """One level of the walk from the topic up to the first-level topic."""

    key: str
    depth: int
    topic: Topic | None
    # right -> [(entry, decides)] for the entries at this level that concern the account
    cells: dict[str, list[tuple[UALEntry, bool]]] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.topic.path if self.topic is not None else self.key

    def cell_list(self) -> list[list[tuple[UALEntry, bool]]]:
        return [self.cells.get(right, []) for right in Right.values]


@dataclass
class RightRow:
    """The verdict on one right and why."""

    right: str
    label: str
    decision: Decision
    explanation: str
    entry: UALEntry | None
    level: LevelRow | None


@dataclass
class Explanation:
    account: Account
    topic: Topic
    real: Topic
    rights: list[RightRow]
    levels: list[LevelRow]
    groups: list[str]


def _entry_label(entry: UALEntry) -> str:
    return f"{entry.effect} to {entry.principal_label}"


def _level_text(row: LevelRow) -> str:
    return f"{row.path} (depth {row.depth})"


def _explain_one(account: Account, real: Topic, right: str, decision: Decision,
                 entries: dict[int, UALEntry], levels: list[LevelRow],
                 snapshot: AccessSnapshot) -> tuple[str, UALEntry | None, LevelRow | None]:
    name = account.get_username()
    if not account.is_active:
        return f"{name} is disabled: a disabled account may do nothing.", None, None
    if snapshot.superuser:
        return (f"{name} is a superuser: superusers may do everything; no entry is "
                "consulted."), None, None
    if decision.level is None:
        if decision.allowed:
            return (f"{real.path} is {name}'s own account topic: an account may always "
                    "subscribe to its own account topic, whatever the entries say."), None, None
        return (f"No entry on {real.path} or any level above it concerns {name} for "
                f"{right}: the root default is deny."), None, None
    at = next(row for row in levels if row.key == decision.level)
    entry = entries.get(decision.entry_id or 0)
    nearer = [row for row in levels if row.depth > at.depth]
    verb = "Allowed" if decision.allowed else "Denied"
    label = f"#{entry.pk} ({_entry_label(entry)})" if entry else f"#{decision.entry_id}"
    text = f"{verb} by entry {label} at {_level_text(at)}."
    if nearer:
        listed = ", ".join(_level_text(row) for row in nearer)
        text += (f" No entry at {listed} concerns {name} for {right}, so the nearest level "
                 "that has one decides.")
    else:
        text += " The entry is on the topic itself, the nearest level there is."
    others = [e for e, _ in at.cells.get(right, []) if e.pk != decision.entry_id]
    if not decision.allowed and any(e.effect == Effect.ALLOW for e in others):
        allows = ", ".join(_entry_label(e) for e in others if e.effect == Effect.ALLOW)
        text += f" At that level a deny beats an allow ({allows})."
    farther = [
        e for row in levels if row.depth < at.depth
        for e, _ in row.cells.get(right, [])
    ]
    if farther:
        overridden = ", ".join(
            f"{_entry_label(e)} at {e.topic.path}" for e in farther)
        text += f" Farther up, overridden: {overridden}."
    return text, entry, at


def explain(account: Account, topic: Topic) -> Explanation:
    """Every right of ``account`` on ``topic``, decided from a fresh snapshot (the page shows
    the database as it is, not this process's cache), with the entries met on the way up."""
    snapshot = AccessSnapshot(account)
    real = topic.resolved()
    keys = level_keys(real.key)
    topics = {t.key: t for t in Topic.objects.filter(key__in=keys)}
    ids = {pk for key in keys for right in Right.values
           for _, pk, _ in snapshot.matching(key, right)}
    entries = {e.pk: e for e in UALEntry.objects.filter(pk__in=ids).select_related(
        "topic", "account", "group")}
    decisions = {right: snapshot.decide(topic, right) for right in Right.values}
    levels = []
    for key in keys:
        row = LevelRow(key=key, depth=depth_of(key), topic=topics.get(key))
        for right in Right.values:
            found = [entries[pk] for _, pk, _ in snapshot.matching(key, right) if pk in entries]
            if found:
                decider = decisions[right].entry_id
                row.cells[right] = [(e, e.pk == decider) for e in found]
        levels.append(row)
    rights = []
    for right, label in Right.choices:
        decision = decisions[right]
        text, entry, level = _explain_one(account, real, right, decision, entries, levels,
                                          snapshot)
        rights.append(RightRow(right, label, decision, text, entry, level))
    groups = list(account.groups.order_by("name").values_list("name", flat=True))
    return Explanation(account, topic, real, rights, levels, groups)


class EffectiveRightsForm(forms.Form):
    account = forms.CharField(max_length=64, widget=forms.TextInput(
        attrs={"list": "ual-accounts", "autocomplete": "off", "placeholder": "account name"}))
    topic = forms.CharField(max_length=1024, widget=forms.TextInput(
        attrs={"list": "ual-topics", "autocomplete": "off", "placeholder": "/stocks/ibm",
               "size": 50}))

    def clean_account(self) -> Account:
        found = find_account(self.cleaned_data["account"])
        if found is None:
            raise forms.ValidationError("No account by that name.")
        return found

    def clean_topic(self) -> Topic:
        found = find_topic(self.cleaned_data["topic"])
        if found is None:
            raise forms.ValidationError("No topic at that path.")
        return found


def _page(model_admin: ModelAdmin, request: HttpRequest, title: str, template: str,
          **context) -> TemplateResponse:
    return TemplateResponse(request, template, {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": title,
        **context,
    })


def effective_rights_view(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET ``?account=<name>&topic=<path>``: the effective rights page."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    form = EffectiveRightsForm(request.GET or None)
    result = explain(form.cleaned_data["account"], form.cleaned_data["topic"]) \
        if form.is_valid() else None
    return _page(
        model_admin, request, "Effective rights", "admin/ual/effective_rights.html",
        form=form, result=result, right_labels=[label for _, label in Right.choices],
        account_names=Account.objects.order_by("username").values_list(
            "username", flat=True)[:SUGGESTIONS],
        topic_paths=Topic.objects.order_by("key").values_list("path", flat=True)[:SUGGESTIONS],
        entry_url_name=f"admin:{UALEntry._meta.app_label}_{UALEntry._meta.model_name}_change",
    )


# -------------------------------------------------------------------------------- bulk grant


class BulkGrantForm(forms.Form):
    topic = forms.CharField(max_length=1024, help_text="A virtual topic's entries are kept on "
                            "the real topic it stands for.",
                            widget=forms.TextInput(attrs={"size": 50, "list": "ual-topics"}))
    right = forms.ChoiceField(choices=Right.choices)
    effect = forms.ChoiceField(choices=Effect.choices, initial=Effect.ALLOW,
                               widget=forms.RadioSelect)
    accounts = forms.ModelMultipleChoiceField(
        queryset=Account.objects.order_by("username"),
        widget=FilteredSelectMultiple("accounts", is_stacked=False),
        help_text="Remote-server accounts get a remote-server entry, the others an account "
                  "entry. An existing entry for the same account and right is changed.")

    def clean_topic(self) -> Topic:
        found = find_topic(self.cleaned_data["topic"])
        if found is None:
            raise forms.ValidationError("No topic at that path.")
        return found.resolved()


def bulk_grant_view(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """One right on one topic to many accounts. ``?accounts=1,2,3`` preselects accounts."""
    if not (model_admin.has_add_permission(request)
            and model_admin.has_change_permission(request)):
        raise PermissionDenied
    if request.method == "POST":
        form = BulkGrantForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            topic: Topic = data["topic"]
            with acting_as(request.user.get_username()):
                result = grant_to_many(topic, data["right"], data["effect"],
                                       list(data["accounts"]))
            verb = "Allowed" if data["effect"] == Effect.ALLOW else "Denied"
            parts = [f"{label}: {', '.join(names)}" for label, names in (
                ("new entries", result.created), ("changed", result.changed),
                ("already so", result.unchanged)) if names]
            messages.success(request, f"{verb} {data['right']} on {topic.path}. "
                             + "; ".join(parts) + ".")
            changelist = reverse(
                f"admin:{UALEntry._meta.app_label}_{UALEntry._meta.model_name}_changelist")
            query = urlencode({"topic__id__exact": topic.pk, "right__exact": data["right"]})
            return HttpResponseRedirect(f"{changelist}?{query}")
    else:
        initial: dict = {}
        if ids := request.GET.get("accounts"):
            initial["accounts"] = [int(i) for i in ids.split(",") if i.strip().isdigit()]
        if path := request.GET.get("topic"):
            initial["topic"] = path
        form = BulkGrantForm(initial=initial)
    return _page(
        model_admin, request, "Grant a right to many accounts", "admin/ual/bulk_grant.html",
        form=form, media=model_admin.media + form.media,
        topic_paths=Topic.objects.order_by("key").values_list("path", flat=True)[:SUGGESTIONS],
    )
