"""Request and response bodies of the REST API (what the OpenAPI schema documents)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

from rest_framework import serializers

from broker.domain import message as codec
from broker.domain.errors import ProtocolError
from broker.domain.values import (
    parse_bool,
    parse_datetime,
    parse_int,
    parse_timeout,
    validate_keyword,
)
from broker.services import pull as pull_service
from topics.models import QUEUE_PARAMETERS, Topic
from ual.models import Effect, PrincipalKind, Right

# Header names as the SMQP codec takes them (a token), values without control characters:
# they go out again on the SMQP wire, one line each.
HEADER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,63}")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MIME_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/"
                       r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}"
                       r"(\s*;\s*[A-Za-z0-9_.-]+=(\"[^\"\x00-\x1f]*\"|[A-Za-z0-9_.-]+))*")
#: Header names a publish may not set: the server writes them (or they belong to sections).
RESERVED = {"smuid", "cmuid", "topic", "content-type", "content-length", "content-encoding"}


class Body(serializers.Serializer):
    """A request body: a field it does not name is refused (400, each unknown field named:
    "Unknown field."), not silently dropped, and so is one the server sets (read-only)."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            writable = {name for name, f in self.fields.items() if not f.read_only}
            unknown = sorted(str(k) for k in data if k not in writable)
            if unknown:
                raise serializers.ValidationError(
                    {name[:100]: ["Unknown field."] for name in unknown[:50]})
        return super().to_internal_value(data)


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem details."""

    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    smqp_code = serializers.IntegerField(help_text="The SMQP reply code of the same refusal.")
    errors = serializers.JSONField(required=False, help_text="Per-field errors.")
    column = serializers.IntegerField(
        required=False, help_text="An incorrect selector (smqp_code 567): where, 1-based.")


# ------------------------------------------------------------------------------- tokens


class TokenRequestSerializer(Body):
    username = serializers.CharField(max_length=64)
    password = serializers.CharField(max_length=1024, trim_whitespace=False)
    name = serializers.CharField(max_length=100)
    days = serializers.IntegerField(min_value=1, max_value=3650, required=False,
                                    help_text="Days until it expires.")


class TokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    created = serializers.DateTimeField()
    expires = serializers.DateTimeField()
    revoked = serializers.DateTimeField(allow_null=True)
    last_used = serializers.DateTimeField(allow_null=True)


class NewTokenSerializer(TokenSerializer):
    token = serializers.CharField(help_text="Shown once: only its digest is kept.")


# ------------------------------------------------------------------------------- topics


class ParametersSerializer(Body):
    delivery_mode = serializers.ChoiceField(choices=Topic.DeliveryMode.values, required=False)
    expiry_timeout = serializers.IntegerField(min_value=-1, max_value=2**31 - 1,
                                              required=False, allow_null=True)
    retry_timeout = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False,
                                             allow_null=True)
    max_retries = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False,
                                           allow_null=True)
    max_message_count = serializers.IntegerField(min_value=0, max_value=2**31 - 1,
                                                 required=False, allow_null=True)
    max_message_size = serializers.IntegerField(min_value=0, max_value=2**62, required=False,
                                                allow_null=True)
    max_queue_bytes = serializers.IntegerField(min_value=0, max_value=2**62, required=False,
                                               allow_null=True)


def _keyword(value: str) -> None:
    """A keyword as SMQP takes it (they go out on its wire: GET TOPIC KEYWORDS, NOTIFY)."""
    try:
        validate_keyword(value)
    except (ProtocolError, ValueError) as exc:
        raise serializers.ValidationError(
            "Not a keyword (none of / \\ , ( ), no control character, no outer space).") \
            from exc


def Keyword() -> serializers.CharField:
    return serializers.CharField(max_length=200, validators=[_keyword])


class TopLevelDeliveryMode(Body):
    """``delivery_mode`` may be given where a topic shows it (the top level) as well as in
    ``parameters``: it is honoured in either place, and refused when both disagree."""

    delivery_mode = serializers.ChoiceField(
        choices=Topic.DeliveryMode.values, required=False,
        help_text="As parameters.delivery_mode (either place; both must agree).")

    def validate(self, attrs: dict) -> dict:
        mode = attrs.pop("delivery_mode", None)
        if mode is not None:
            params = dict(attrs.get("parameters") or {})
            if params.get("delivery_mode", mode) != mode:
                raise serializers.ValidationError({"delivery_mode": [
                    "Differs from parameters.delivery_mode (give one, or the same)."]})
            params["delivery_mode"] = mode
            attrs["parameters"] = params
        return attrs


class TopicCreateSerializer(TopLevelDeliveryMode):
    path = serializers.CharField(max_length=1024, help_text="/a/b")
    keywords = serializers.ListField(child=Keyword(), required=False, max_length=100)
    link = serializers.CharField(max_length=1024, required=False,
                                 help_text="Makes a virtual topic standing for this one.")
    parameters = ParametersSerializer(required=False)


class TopicPatchSerializer(TopLevelDeliveryMode):
    path = serializers.CharField(max_length=1024, required=False, help_text="Rename to.")
    keywords = serializers.ListField(child=Keyword(), required=False, max_length=100)
    parameters = ParametersSerializer(required=False)


class EffectiveSerializer(serializers.Serializer):
    expiry_timeout = serializers.IntegerField(allow_null=True)
    retry_timeout = serializers.IntegerField(allow_null=True)
    max_retries = serializers.IntegerField(allow_null=True)
    max_message_count = serializers.IntegerField(allow_null=True)
    max_message_size = serializers.IntegerField(allow_null=True)
    max_queue_bytes = serializers.IntegerField(allow_null=True)


class TopicSerializer(serializers.Serializer):
    path = serializers.CharField()
    link = serializers.CharField(allow_null=True)
    keywords = serializers.ListField(child=serializers.CharField())
    delivery_mode = serializers.CharField()
    parameters = EffectiveSerializer(help_text="In effect (set here or inherited).")


class RemovedTopicSerializer(serializers.Serializer):
    pending = serializers.IntegerField(help_text="Messages still pending (the topic goes "
                                                 "when they are gone).")


# ------------------------------------------------------------------------------ messages


class SectionSerializer(Body):
    content_type = serializers.CharField(max_length=255, default="text/plain")
    text = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False,
                                 max_length=64 * 1024 * 1024)
    base64 = serializers.CharField(required=False, allow_blank=True,
                                   max_length=96 * 1024 * 1024)

    def validate_content_type(self, value: str) -> str:
        if not MIME_TYPE.fullmatch(value):
            raise serializers.ValidationError("Not a MIME type.")
        return value

    def validate(self, attrs: dict) -> dict:
        if ("text" in attrs) == ("base64" in attrs):
            raise serializers.ValidationError("Give exactly one of text and base64.")
        if "base64" in attrs:
            try:
                attrs["body"] = base64.b64decode(attrs.pop("base64"), validate=True)
            except (binascii.Error, ValueError) as exc:
                raise serializers.ValidationError({"base64": "Not base64."}) from exc
        else:
            try:
                attrs["body"] = attrs.pop("text").encode()
            except UnicodeEncodeError as exc:
                raise serializers.ValidationError({"text": "Not encodable text."}) from exc
        return attrs


#: Headers the broker reads, each with the parser the SMQP door uses and the rule its
#: refusal names (a publish with ``Priority: "0"`` gets "invalid number: ...").
HEADER_RULES = {
    "priority": (lambda t: parse_int(t, minimum=1),
                 "Invalid number: a whole number from 1 (1 is the highest priority)."),
    "sequence": (lambda t: parse_int(t, minimum=1), "Invalid number: a whole number from 1."),
    "depth": (lambda t: parse_int(t, minimum=-1), "Invalid number: a whole number from -1."),
    "timeout": (parse_timeout, "Invalid timeout: HH:MM:SS or DD:HH:MM:SS, or -1 (never)."),
    "created": (parse_datetime,
                "Invalid date-time: ISO 8601 (2026-01-02T03:04:05Z) or D01022026T030405Z."),
    "receipt": (parse_bool, "Invalid boolean: YES or NO."),
    "reply": (parse_bool, "Invalid boolean: YES or NO."),
}


class PublishSerializer(Body):
    headers = serializers.DictField(
        child=serializers.CharField(max_length=1000, allow_blank=True), required=False,
        help_text="Name, Priority, Timeout, Receipt, X-... (profile §8).")
    sections = SectionSerializer(many=True, required=False)

    def validate_headers(self, value: dict) -> dict:
        if len(value) > 100:
            raise serializers.ValidationError("At most 100 headers.")
        for name, text in value.items():
            if not HEADER_NAME.fullmatch(name) or name.casefold() in RESERVED:
                raise serializers.ValidationError(f"Header name not allowed: {name[:64]!r}.")
            if CONTROL.search(text):
                raise serializers.ValidationError(f"Control character in {name}.")
        errors = {}
        for name, text in value.items():
            check = HEADER_RULES.get(codec.canonical_name(name).casefold())
            if check is not None:
                parse, rule = check
                try:
                    parse(text)
                except (ProtocolError, ValueError):
                    errors[name] = [rule]
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def validate_sections(self, value: list) -> list:
        if len(value) > 100:
            raise serializers.ValidationError("At most 100 sections.")
        return value

    def message(self) -> codec.Message:
        return self.to_message(self.validated_data)

    @staticmethod
    def to_message(data: dict) -> codec.Message:
        """The message of one validated publish (a batch's items are validated as a list)."""
        return codec.Message(
            headers=[(codec.canonical_name(k), v) for k, v in data.get("headers", {}).items()],
            sections=[codec.DataSection(headers=[("Content-Type", s["content_type"])],
                                        body=s["body"]) for s in data.get("sections", [])])


class PublishedSerializer(serializers.Serializer):
    smuid = serializers.IntegerField()
    topic = serializers.CharField()
    cmuid = serializers.CharField()


class SectionOutSerializer(serializers.Serializer):
    content_type = serializers.CharField(allow_null=True)
    size = serializers.IntegerField()
    text = serializers.CharField(required=False, help_text="For text/* in UTF-8.")
    base64 = serializers.CharField(required=False, help_text="Otherwise.")


class MessageSerializer(serializers.Serializer):
    smuid = serializers.IntegerField()
    topic = serializers.CharField()
    cmuid = serializers.CharField()
    headers = serializers.DictField(child=serializers.CharField())
    sections = SectionOutSerializer(many=True)


class MessageQuerySerializer(serializers.Serializer):
    since = serializers.IntegerField(required=False, min_value=0, max_value=2**62,
                                     help_text="Only messages with a greater smuid.")
    state = serializers.ChoiceField(choices=["pending", "trash"], default="pending")


# -------------------------------------------------------------------- subscriptions, pull


class SelectorSerializer(Body):
    """A message selector as a JSON object, ``{"class": "JMS", "text": "Priority > 3"}``:
    the profile's ``SELECTOR <class> <text>`` without a wire syntax to split. The class and
    text are checked by the same compiler as SMQP's (566 / 567 as problem details)."""

    text = serializers.CharField(max_length=65536, trim_whitespace=False,
                                 help_text="JMS 1.1 selector or RFC 4515 filter text.")

    def get_fields(self) -> dict:
        # "class" is a Python keyword, so it cannot be declared as an attribute.
        return {"class": serializers.CharField(
            max_length=64, help_text="JMS, RFC-2254 or LDAP (case-insensitive)."),
            **super().get_fields()}

    def validate_text(self, value: str) -> str:
        # A stored selector goes out again in SMQP lines (NOTIFY SUBSCRIPTION), and no
        # database takes NUL: no control characters but tab.
        if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", value):
            raise serializers.ValidationError("No control characters (tab is allowed).")
        return value


class SubscriptionCreateSerializer(Body):
    resource = serializers.ChoiceField(choices=["MESSAGE", "TOPIC", "SUBSCRIBERS", "SERVER"],
                                       default="MESSAGE")
    pattern = serializers.CharField(max_length=1024, required=False,
                                    help_text="/a/b, or /a/* for every topic below /a.")
    since = serializers.DateTimeField(required=False, allow_null=True)
    selector = SelectorSerializer(
        required=False, allow_null=True,
        help_text="MESSAGE only: only messages the selector is TRUE for (profile §9.2).")
    lease_seconds = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=2**31 - 1,
        help_text="MESSAGE only: the subscription ends this many seconds from now "
                  "(subscribing again with the same pattern and selector renews it).")


class SubscriptionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    resource = serializers.CharField()
    pattern = serializers.CharField()
    since = serializers.DateTimeField(allow_null=True)
    created = serializers.DateTimeField()
    selector = SelectorSerializer(allow_null=True)
    lease_end = serializers.DateTimeField(allow_null=True,
                                          help_text="When a leased subscription ends.")


class NewSubscriptionSerializer(SubscriptionSerializer):
    topics = serializers.ListField(child=serializers.CharField(),
                                   help_text="Topics it covers now.")


class PullRequestSerializer(Body):
    max = serializers.IntegerField(min_value=1, max_value=100, default=10)
    wait_seconds = serializers.FloatField(min_value=0, max_value=20, default=0)


class PulledSerializer(MessageSerializer):
    receipt = serializers.CharField()
    deadline = serializers.DateTimeField(help_text="ACK before this, or the lock ends.")
    attempts = serializers.IntegerField()


class PullSerializer(serializers.Serializer):
    messages = PulledSerializer(many=True)


class ReceiptsRequestSerializer(Body):
    receipts = serializers.ListField(
        child=serializers.CharField(max_length=200, allow_blank=True, trim_whitespace=False),
        min_length=1, max_length=pull_service.RECEIPTS_MAX,
        help_text="Receipts of pulled messages, each answered on its own.")


class ReceiptOutcomeSerializer(serializers.Serializer):
    receipt = serializers.CharField()
    outcome = serializers.ChoiceField(
        choices=[o.value for o in pull_service.Outcome],
        help_text="consumed (ack) or released (nack); expired: the lock is not held (any "
                  "more), nothing changed; unknown: no such message for this account.")
    status = serializers.IntegerField(
        help_text="What a single ack / nack of the receipt answers: 204, 409 or 404.")


class ReceiptsResultSerializer(serializers.Serializer):
    results = ReceiptOutcomeSerializer(many=True, help_text="One per receipt, in order.")


# ----------------------------------------------------------------------------------- UAL


class EntrySerializer(Body):
    id = serializers.IntegerField(read_only=True)
    topic = serializers.CharField(max_length=1024)
    principal_kind = serializers.ChoiceField(choices=PrincipalKind.values)
    account = serializers.CharField(max_length=64, required=False, allow_null=True)
    group = serializers.CharField(max_length=150, required=False, allow_null=True)
    right = serializers.ChoiceField(choices=Right.values)
    effect = serializers.ChoiceField(choices=Effect.values, default=Effect.ALLOW)


class EntryQuerySerializer(serializers.Serializer):
    topic = serializers.CharField(max_length=1024, required=False)
    account = serializers.CharField(max_length=64, required=False)


class ExplainQuerySerializer(serializers.Serializer):
    account = serializers.CharField(max_length=64)
    topic = serializers.CharField(max_length=1024)
    right = serializers.ChoiceField(choices=Right.values, required=False)


class LevelSerializer(serializers.Serializer):
    path = serializers.CharField()
    depth = serializers.IntegerField()
    entries = serializers.DictField(child=serializers.ListField(child=serializers.DictField()))


class RightDecisionSerializer(serializers.Serializer):
    right = serializers.CharField()
    allowed = serializers.BooleanField()
    explanation = serializers.CharField()
    entry = serializers.IntegerField(allow_null=True)
    level = serializers.CharField(allow_null=True)


class ExplainSerializer(serializers.Serializer):
    account = serializers.CharField()
    topic = serializers.CharField()
    real_topic = serializers.CharField()
    groups = serializers.ListField(child=serializers.CharField())
    rights = RightDecisionSerializer(many=True)
    levels = LevelSerializer(many=True)


# ------------------------------------------------------------------------------ accounts


class AccountSerializer(serializers.Serializer):
    username = serializers.CharField()
    email = serializers.CharField(allow_blank=True)
    proper_name = serializers.CharField(allow_blank=True)
    is_active = serializers.BooleanField()
    is_superuser = serializers.BooleanField()
    is_remote_server = serializers.BooleanField()
    topic = serializers.CharField()


class AccountCreateSerializer(Body):
    username = serializers.CharField(max_length=64)
    password = serializers.CharField(max_length=1024, trim_whitespace=False)
    email = serializers.CharField(max_length=254, required=False, default="", allow_blank=True)
    proper_name = serializers.CharField(max_length=200, required=False, default="",
                                        allow_blank=True)
    superuser = serializers.BooleanField(default=False)
    remote_server = serializers.BooleanField(default=False)


def effective_parameters(topic) -> dict:
    """What the topic's parameters are in effect (a tree node or a model row)."""
    from broker.services.deliveries import effective

    values = effective(topic)
    return {name: values.get(name) for name in QUEUE_PARAMETERS}



# --------------------------------------------------------------------------------- stats
# What broker.services.stats.snapshot() returns (documented in its docstring); the view
# returns that dict as is, these describe it for the schema.


class RateSeriesSerializer(serializers.Serializer):
    start = serializers.DateTimeField(help_text="Start of the first (oldest) bucket.")
    step_seconds = serializers.IntegerField()
    publish = serializers.ListField(child=serializers.IntegerField(),
                                    help_text="Messages committed per bucket; the last "
                                              "bucket is the current, partial one.")
    deliver = serializers.ListField(child=serializers.IntegerField(),
                                    help_text="Messages delivered (NOTIFY MESSAGE or pulled).")
    ack = serializers.ListField(child=serializers.IntegerField(),
                                help_text="ACKs committed.")


class RatesSerializer(serializers.Serializer):
    minutes = RateSeriesSerializer(help_text="Per minute, the last 60 minutes.")
    hours = RateSeriesSerializer(help_text="Per hour, the last 24 hours.")


class MessageTotalsSerializer(serializers.Serializer):
    publish = serializers.IntegerField()
    deliver = serializers.IntegerField()
    ack = serializers.IntegerField()


class TopicDepthSerializer(serializers.Serializer):
    path = serializers.CharField()
    messages = serializers.IntegerField(help_text="Stored, pending state.")
    pending = serializers.IntegerField(help_text="Deliveries waiting.")
    locked = serializers.IntegerField(help_text="Deliveries locked to a session or a pull.")
    dead = serializers.IntegerField(help_text="Deliveries whose retries are spent.")


class SessionsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    by_door = serializers.DictField(child=serializers.IntegerField(),
                                    help_text="Live sessions per door (smqp, qqp, ...).")


class DeadLetterSerializer(serializers.Serializer):
    smuid = serializers.IntegerField()
    topic = serializers.CharField()
    account = serializers.CharField()
    attempts = serializers.IntegerField()
    at = serializers.DateTimeField(allow_null=True)
    message_state = serializers.CharField()
    republishable = serializers.BooleanField(help_text="In Trash: REPUBLISH can bring it back.")


class GroupCommitsSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    failures = serializers.IntegerField()
    size_sum = serializers.IntegerField()
    seconds_sum = serializers.FloatField()
    mean_size = serializers.FloatField(allow_null=True)
    mean_seconds = serializers.FloatField(allow_null=True)
    size_buckets = serializers.DictField(child=serializers.IntegerField(),
                                         help_text="Cumulative counts per upper bound (le).")
    seconds_buckets = serializers.DictField(child=serializers.IntegerField(),
                                            help_text="Cumulative counts per upper bound.")


class GroupCommitKindsSerializer(serializers.Serializer):
    publish = GroupCommitsSerializer()
    ack = GroupCommitsSerializer()


class StorageProcessSerializer(serializers.Serializer):
    name = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)
    alive = serializers.BooleanField()
    waiting = serializers.IntegerField()
    starts = serializers.IntegerField()


class ListenerSerializer(serializers.Serializer):
    origin = serializers.CharField()
    host = serializers.CharField()
    pid = serializers.IntegerField()
    command = serializers.CharField(allow_blank=True)
    started = serializers.FloatField(help_text="Epoch seconds.")
    at = serializers.FloatField(help_text="Epoch seconds of this record.")
    sessions = serializers.IntegerField()
    journal_backlog = serializers.IntegerField()
    publish_queue = serializers.IntegerField()
    storage_processes = StorageProcessSerializer(many=True)


class StatsSerializer(serializers.Serializer):
    generated = serializers.DateTimeField()
    rates = RatesSerializer()
    totals = MessageTotalsSerializer(help_text="Since the counters' Redis was empty.")
    topics = TopicDepthSerializer(many=True, help_text="The deepest topics first (50 at most).")
    sessions = SessionsSerializer()
    dead_letters = DeadLetterSerializer(many=True, help_text="The latest 20.")
    group_commits = GroupCommitKindsSerializer()
    listeners = ListenerSerializer(many=True, help_text="Listeners that reported lately.")
    links = serializers.ListField(child=serializers.DictField(), allow_null=True,
                                  help_text="Federation links, as /api/v1/links/ shows them.")
    counters_unavailable = serializers.CharField(
        allow_null=True, help_text="Why the counters could not be read (then rates, totals "
                                   "and group commits are 0, listeners empty).")
# ----------------------------------------------------------------------- federation links


class LinkSerializer(serializers.Serializer):
    """A federation link (profile §9.5) as the API shows it: never its password."""

    name = serializers.CharField(help_text="One topic segment: the peer's messages are "
                                           "stored below /<name>/.")
    host = serializers.CharField()
    port = serializers.IntegerField()
    tls = serializers.BooleanField(help_text="Connect over SMQPS.")
    tls_ca = serializers.CharField(allow_blank=True)
    tls_server_name = serializers.CharField(allow_blank=True)
    account = serializers.CharField(help_text="The account the peer gave this server.")
    password_set = serializers.BooleanField(help_text="Whether a password is stored (it is "
                                                      "never shown).")
    imports = serializers.ListField(child=serializers.CharField())
    peer_account = serializers.CharField(allow_null=True)
    enabled = serializers.BooleanField()
    state = serializers.ChoiceField(choices=["idle", "connecting", "up", "down", "disabled"])
    up = serializers.BooleanField()
    last_error = serializers.CharField(allow_null=True)
    last_change = serializers.DateTimeField(allow_null=True)
    last_connected = serializers.DateTimeField(allow_null=True)
    stored = serializers.IntegerField(help_text="Messages received over the link and stored.")
    dropped = serializers.IntegerField(help_text="Messages received and dropped (loop, "
                                                 "duplicate, Depth spent, not imported).")
    subscribed = serializers.ListField(child=serializers.CharField(),
                                       help_text="What the link subscribes to on the peer.")
    backlog = serializers.IntegerField(allow_null=True, help_text="Messages this server holds "
                                       "for the peer's account (null: no peer account).")


class LinkChangeSerializer(Body):
    """What PATCH may change; a field not given keeps its value (the password too)."""

    host = serializers.CharField(max_length=255, required=False)
    port = serializers.IntegerField(min_value=1, max_value=65535, required=False)
    tls = serializers.BooleanField(required=False)
    tls_ca = serializers.CharField(max_length=1024, required=False, allow_blank=True)
    tls_server_name = serializers.CharField(max_length=255, required=False, allow_blank=True)
    account = serializers.CharField(max_length=150, required=False)
    password = serializers.CharField(max_length=255, required=False, allow_blank=True,
                                     trim_whitespace=False, write_only=True)
    imports = serializers.ListField(child=serializers.CharField(max_length=1024),
                                    required=False, max_length=100,
                                    help_text="Topic patterns of the peer (/news/*); none: "
                                              "/* (every topic).")
    peer_account = serializers.CharField(max_length=64, required=False, allow_null=True,
                                         allow_blank=True,
                                         help_text="The account the peer logs in with here.")
    enabled = serializers.BooleanField(required=False)


class LinkCreateSerializer(LinkChangeSerializer):
    name = serializers.CharField(max_length=64)
    host = serializers.CharField(max_length=255)
    account = serializers.CharField(max_length=150)


# ----------------------------------------------------------------------- usage reports


class ReportTableSerializer(serializers.Serializer):
    title = serializers.CharField()
    headers = serializers.ListField(child=serializers.CharField())
    rows = serializers.ListField(child=serializers.ListField(child=serializers.JSONField()),
                                 help_text="One list per row, in the order of `headers`.")


class ReportSummarySerializer(serializers.Serializer):
    day = serializers.DateField(help_text="The UTC day the report counts.")
    state = serializers.CharField(help_text="running, done or failed.")
    trigger = serializers.CharField(help_text="beat, runreport, ...")
    started = serializers.DateTimeField(allow_null=True)
    finished = serializers.DateTimeField(allow_null=True)
    events = serializers.IntegerField(help_text="Usage events the job read.")
    sessions_peak = serializers.IntegerField()
    subscribers_peak = serializers.IntegerField()
    totals = serializers.DictField(child=serializers.IntegerField(),
                                   help_text="The day's totals: published, delivered, acked, "
                                             "expired, dead, republished, bytes_in, bytes_out.")
    error = serializers.CharField(allow_blank=True)
    partial = serializers.BooleanField(
        help_text="The day was not over: the report counts the events until `until` and "
                  "leaves out the hours after it; the nightly run replaces it.")
    until = serializers.DateTimeField(allow_null=True, help_text="The end of what it counts.")


class ReportSerializer(ReportSummarySerializer):
    tables = serializers.DictField(
        child=ReportTableSerializer(),
        help_text="hourly, doors, top-topics, top-accounts, latency, dead-letters, subtrees, "
                  "topics, accounts: the tables of the admin's report page.")


# -------------------------------------------------------------------- operators' tools


class IndexSerializer(serializers.Serializer):
    version = serializers.CharField()
    resources = serializers.DictField(child=serializers.CharField(),
                                      help_text="Name → URL of each resource list.")
    schema = serializers.CharField(help_text="The OpenAPI 3 schema.")
    docs = serializers.CharField(help_text="Its interactive documentation.")


class OpsSessionSerializer(serializers.Serializer):
    """A live session, as RabbitMQ's connections list shows one."""

    guid = serializers.CharField(allow_null=True)
    account = serializers.CharField()
    door = serializers.CharField(help_text="smqp, xmpp, qqp, ...")
    auth_method = serializers.CharField()
    peer = serializers.CharField(allow_blank=True, help_text="The client's address.")
    server_context = serializers.CharField(allow_blank=True)
    started = serializers.DateTimeField(help_text="Login time.")
    messages_in = serializers.IntegerField(help_text="Messages it published (committed).")
    messages_out = serializers.IntegerField(help_text="Messages sent to it.")
    unacked = serializers.IntegerField(help_text="Sent, ACK awaited (its listener's count, "
                                                 "about once a second).")
    locked = serializers.IntegerField(help_text="Queue-mode messages it holds locked.")
    rate_in = serializers.FloatField(help_text="Published per second, last minute.")
    rate_out = serializers.FloatField(help_text="Sent per second, last minute.")
    counters_unavailable = serializers.CharField(
        allow_null=True, help_text="Why the counters could not be read (then they are 0).")


ACCOUNT_NAME = re.compile(r"[^\W\d_]\w{0,63}")


def _account_name(value: str) -> None:
    # Checked here, not as a schema "pattern": JSON Schema's \w is ASCII only, an account
    # name's is Unicode (Account.username_validator).
    if not ACCOUNT_NAME.fullmatch(value):
        raise serializers.ValidationError(
            "Not an account name (a letter, then letters, digits and _).")


def AccountName(**kwargs) -> serializers.CharField:
    return serializers.CharField(max_length=64, validators=[_account_name], **kwargs)


class SessionQuerySerializer(serializers.Serializer):
    account = AccountName(required=False, help_text="Only this account's sessions.")
    door = serializers.CharField(required=False, max_length=16,
                                 help_text="Only this door's (smqp, xmpp, qqp).")


class ConsumerSubscriptionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    pattern = serializers.CharField()
    selector = SelectorSerializer(allow_null=True)
    lease_end = serializers.DateTimeField(allow_null=True)


class ConsumerSerializer(serializers.Serializer):
    account = serializers.CharField()
    subscriptions = ConsumerSubscriptionSerializer(many=True)
    sessions = serializers.ListField(child=serializers.CharField(allow_null=True),
                                     help_text="Guids of its live sessions.")
    backlog = serializers.IntegerField(help_text="Deliveries waiting for it.")
    locked = serializers.IntegerField(help_text="Queue mode: locked to its sessions.")
    dead = serializers.IntegerField(help_text="Retries spent.")
    lag_seconds = serializers.FloatField(
        help_text="How long the oldest message waiting for it (or locked) has waited.")


class ConsumersSerializer(serializers.Serializer):
    topic = serializers.CharField(help_text="The real topic.")
    asked = serializers.CharField(help_text="The topic as named (a virtual one, maybe).")
    delivery_mode = serializers.CharField()
    messages = serializers.IntegerField(help_text="Messages pending on the topic.")
    oldest_seconds = serializers.FloatField(help_text="Age of the oldest pending message.")
    consumers = ConsumerSerializer(many=True)


class PurgedSerializer(serializers.Serializer):
    topic = serializers.CharField()
    purged = serializers.IntegerField(help_text="Messages moved to the topic's Trash.")


class PeekQuerySerializer(serializers.Serializer):
    count = serializers.IntegerField(required=False, min_value=1, max_value=100, default=10,
                                     help_text="Messages at most.")
    after = serializers.IntegerField(required=False, min_value=0, max_value=2**62, default=0,
                                     help_text="Only messages with a greater smuid.")
    state = serializers.ChoiceField(choices=["pending", "trash"], default="pending")


class PeekedSerializer(MessageSerializer):
    received = serializers.DateTimeField()
    size = serializers.IntegerField()
    deliveries = serializers.DictField(child=serializers.IntegerField(),
                                       help_text="Its deliveries by state (pending, "
                                                 "notified, acked, dead).")


class PeekSerializer(serializers.Serializer):
    messages = PeekedSerializer(many=True)


class AccountChangeSerializer(Body):
    """What PATCH may change; a field not given keeps its value."""

    email = serializers.EmailField(max_length=254, required=False, allow_blank=True)
    proper_name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    postal_address = serializers.CharField(max_length=1000, required=False, allow_blank=True)
    phone = serializers.CharField(max_length=64, required=False, allow_blank=True)
    is_active = serializers.BooleanField(required=False)
    is_staff = serializers.BooleanField(required=False)
    is_superuser = serializers.BooleanField(required=False)
    is_remote_server = serializers.BooleanField(required=False)

    def validate(self, attrs: dict) -> dict:
        for name in ("proper_name", "postal_address", "phone"):
            text = attrs.get(name, "")
            if name == "postal_address":  # lines of an address
                text = text.replace("\n", "")
            if CONTROL.search(text):
                raise serializers.ValidationError({name: ["No control characters."]})
        return attrs


class PasswordResetSerializer(Body):
    password = serializers.CharField(max_length=1024, trim_whitespace=False,
                                     help_text="The new password (the validators apply).")


class DefinitionTopicSerializer(Body):
    path = serializers.CharField(max_length=1024)
    delivery_mode = serializers.ChoiceField(choices=Topic.DeliveryMode.values,
                                            required=False)
    parameters = serializers.DictField(
        child=serializers.IntegerField(allow_null=True, min_value=-1, max_value=2**62),
        required=False, help_text="Set on the topic itself (not inherited).")
    keywords = serializers.ListField(child=Keyword(), required=False, max_length=100)
    link = serializers.CharField(max_length=1024, required=False, allow_null=True)

    def validate_parameters(self, value: dict) -> dict:
        unknown = sorted(set(value) - set(QUEUE_PARAMETERS))
        if unknown:
            raise serializers.ValidationError(
                {name[:100]: ["Unknown parameter."] for name in unknown[:20]})
        return value


class DefinitionAccountSerializer(Body):
    username = AccountName()
    email = serializers.EmailField(max_length=254, required=False, allow_blank=True)
    proper_name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    is_active = serializers.BooleanField(required=False)
    is_staff = serializers.BooleanField(required=False)
    is_superuser = serializers.BooleanField(required=False)
    is_remote_server = serializers.BooleanField(required=False)
    groups = serializers.ListField(child=serializers.CharField(max_length=150),
                                   required=False, max_length=100)


class DefinitionEntrySerializer(Body):
    topic = serializers.CharField(max_length=1024)
    principal_kind = serializers.ChoiceField(choices=PrincipalKind.values)
    account = serializers.CharField(max_length=64, required=False, allow_null=True)
    group = serializers.CharField(max_length=150, required=False, allow_null=True)
    right = serializers.ChoiceField(choices=Right.values)
    effect = serializers.ChoiceField(choices=Effect.values, default=Effect.ALLOW)


class DefinitionLinkSerializer(LinkChangeSerializer):
    name = serializers.CharField(max_length=64)
    host = serializers.CharField(max_length=255)
    account = serializers.CharField(max_length=150)


class DefinitionsSerializer(Body):
    """The broker's definitions (``GET /api/v1/definitions``): no secrets."""

    smqp_definitions = serializers.IntegerField(min_value=1, max_value=1,
                                                help_text="The document's format: 1.")
    exported = serializers.DateTimeField(required=False)
    groups = serializers.ListField(child=serializers.CharField(max_length=150),
                                   required=False, max_length=10000)
    accounts = DefinitionAccountSerializer(many=True, required=False)
    topics = DefinitionTopicSerializer(many=True, required=False)
    ual_entries = DefinitionEntrySerializer(many=True, required=False)
    links = DefinitionLinkSerializer(many=True, required=False)


class ImportCountsSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    changed = serializers.IntegerField()
    unchanged = serializers.IntegerField()


class ImportResultSerializer(serializers.Serializer):
    groups = ImportCountsSerializer()
    accounts = ImportCountsSerializer()
    topics = ImportCountsSerializer()
    ual_entries = ImportCountsSerializer()
    links = ImportCountsSerializer()
