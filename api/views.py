"""The REST door: every view checks its input, calls the broker's services (the same ones
the SMQP door calls; the rules live there once) and turns their answers and refusals into
JSON and problem details (:mod:`.problems`)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import uuid
from datetime import date

from django.conf import settings
from django.db import IntegrityError, transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import permissions, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import Account
from broker.domain import message as codec
from broker.domain.errors import ProtocolError
from broker.domain.values import SmuidSet, parse_topic_pattern, validate_topic
from broker.models import Link, Subscription, selector_key
from broker.services import accounts as account_service
from broker.services import auth as auth_service
from broker.services import bad_request, federation, not_found, operations, ual_entries
from broker.services import publish as publish_service
from broker.services import pull as pull_service
from broker.services import read as read_service
from broker.services import stats as stats_service
from broker.services import subscriptions as subscription_service
from broker.services import topics as topic_service
from broker.services.prepare import PublishRequest
from broker.services.publish import Published
from broker.services.selectors import compile_selector
from broker.store import opsmetrics
from spark_jobs import tables as report_tables
from spark_jobs.models import UsageReport
from topics.tree import Node
from ual.resolution import AccessSnapshot, snapshot_for

from . import loopdispatch, pagination
from . import serializers as s
from .authentication import Throttled, peer_of
from .models import ApiToken, IdempotencyKey
from .problems import from_service, problem
from .tokens import create_token, revoke

PATH_PARAM = OpenApiParameter("path", OpenApiTypes.STR, OpenApiParameter.PATH,
                              description="Topic path without the leading slash: stocks/ibm")


def snapshot(request: Request) -> AccessSnapshot:
    return snapshot_for(request.user)


def topic_path(raw: str) -> str:
    """The topic a URL names (``stocks/ibm`` → ``/stocks/ibm``); a name no topic can have is
    a topic that does not exist (404, as over SMQP)."""
    path = "/" + raw.strip("/")
    try:
        return validate_topic(path)
    except (ProtocolError, ValueError):
        raise not_found("topic") from None


def new_topic_path(raw: str, field: str = "path") -> str:
    path = raw if raw.startswith("/") else "/" + raw
    try:
        return validate_topic(path)
    except (ProtocolError, ValueError):
        raise ValidationError({field: ["Not a topic path (/a/b: letters, digits, _)."]}) \
            from None


def valid(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def topic_data(topic) -> dict:
    """A topic (a tree node or a row) as the API shows it."""
    if isinstance(topic, Node):
        keywords = list(topic.keywords)
        link = topic.link.path if topic.link is not None else None
    else:
        keywords = topic_service.keywords_of(topic)
        link = topic.link.path if topic.link_id else None
    real = topic.resolved()
    return {"path": topic.path, "link": link, "keywords": keywords,
            "delivery_mode": real.delivery_mode,
            "parameters": s.effective_parameters(real)}


def section_data(section: codec.DataSection) -> dict:
    content_type = section.content_type
    out: dict = {"content_type": content_type, "size": len(section.body)}
    if (content_type or "").lower().startswith("text/"):
        try:
            out["text"] = section.body.decode()
            return out
        except UnicodeDecodeError:
            pass
    out["base64"] = base64.b64encode(section.body).decode()
    return out


def message_data(smuid: int, topic: str, cmuid: str, msg: codec.Message) -> dict:
    return {"smuid": smuid, "topic": topic, "cmuid": cmuid,
            "headers": {name: value for name, value in msg.headers},
            "sections": [section_data(sec) for sec in msg.sections]}


class Staff(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and (user.is_staff or user.is_superuser))


class StaffWith(Staff):
    """Staff, with the model permissions the view names for the method
    (``required_perms``: method → permission names; a superuser has them all), as the
    operators' console asks for the same actions."""

    def has_permission(self, request, view) -> bool:
        if not super().has_permission(request, view):
            return False
        method = "GET" if request.method in ("HEAD", "OPTIONS") else request.method
        return request.user.has_perms(getattr(view, "required_perms", {}).get(method, ()))


class Superuser(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.is_superuser)


# ---------------------------------------------------------------------------------- tokens


def token_data(token: ApiToken) -> dict:
    return {"id": token.pk, "name": token.name, "created": token.created,
            "expires": token.expires, "revoked": token.revoked, "last_used": token.last_used}


class TokensView(APIView):
    def get_permissions(self):
        if self.request.method == "POST":
            return [permissions.AllowAny()]
        return super().get_permissions()

    def get_authenticators(self):
        if self.request is not None and self.request.method == "POST":
            return []  # the password is the credential here
        return super().get_authenticators()

    @extend_schema(operation_id="tokens_list",
                   parameters=[pagination.PageQuery],
                   responses=pagination.paged(s.TokenSerializer))
    def get(self, request: Request) -> Response:
        """The caller's own tokens (never their secrets)."""
        after, limit = pagination.params(request, int)
        rows = ApiToken.objects.filter(account=request.user).order_by("pk")
        if after is not None:
            rows = rows.filter(pk__gt=after)
        return pagination.page_of(request, rows, limit, token_data,
                                  lambda last: last.pk)

    @extend_schema(request=s.TokenRequestSerializer, responses={201: s.NewTokenSerializer},
                   auth=[])
    def post(self, request: Request) -> Response:
        """A new token, with the account's password. Failed attempts are throttled as
        failed SMQP logins are."""
        data = valid(s.TokenRequestSerializer, request.data)
        peer = peer_of(request)
        throttle = auth_service.admit_attempt_blocking(peer, data["username"])
        if throttle.refused:
            raise Throttled()
        try:
            account = auth_service.check_clear_password(data["username"], data["password"])
        except Exception:  # undecided (the database away): given back, not a failure
            auth_service.record_undecided(peer, data["username"])
            raise
        if account is None:
            auth_service.record_failure(peer, data["username"])
            if throttle.delay > 0:
                raise Throttled(wait=int(throttle.delay + 0.999))
            return problem(401, "Unauthorized (wrong account name or password)", 530)
        auth_service.record_success(peer, account.username)
        token, text = create_token(account, data["name"], data.get("days"))
        return Response({**token_data(token), "token": text}, status=status.HTTP_201_CREATED)


class TokenView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        """Revoke one of the caller's tokens."""
        token = ApiToken.objects.filter(pk=pk, account=request.user).first()
        if token is None:
            raise not_found("token")
        revoke(token)
        return Response(status=status.HTTP_204_NO_CONTENT)


# ---------------------------------------------------------------------------------- topics


class TopicQuerySerializer(s.serializers.Serializer):
    under = s.serializers.CharField(required=False, max_length=1024,
                                    help_text="Only topics below this one.")
    q = s.serializers.CharField(required=False, max_length=200,
                                help_text="A substring of one of its keywords.")


def _apply_changes(snap: AccessSnapshot, path: str, data: dict) -> str:
    """Rename, keywords, parameters of one topic (one transaction, the caller's)."""
    if "keywords" in data:
        topic_service.set_keywords(snap, path, tuple(data["keywords"]))
    if data.get("parameters"):
        topic_service.set_parameters(snap, path, dict(data["parameters"]))
    if "path" in data:
        new = new_topic_path(data["path"])
        topic_service.rename_topic(snap, path, new)
        path = new
    return path


class TopicsView(APIView):
    @extend_schema(operation_id="topics_list",
                   parameters=[TopicQuerySerializer, pagination.PageQuery],
                   responses=pagination.paged(s.TopicSerializer))
    def get(self, request: Request) -> Response:
        """Topics the account may see, in path order (FIND TOPIC's rules)."""
        query = valid(TopicQuerySerializer, request.query_params)
        after, limit = pagination.params(request, str)
        under = topic_path(query["under"]) if query.get("under") else "/"
        pattern = parse_topic_pattern(under.rstrip("/") + "/*")
        keywords = (query["q"],) if query.get("q") else None
        found = [t for t, _ in topic_service.find_topics(snapshot(request), pattern, keywords)]
        found.sort(key=lambda t: t.key)
        if after is not None:
            found = [t for t in found if t.key > after]
        more = len(found) > limit
        found = found[:limit]
        return pagination.page(request, [topic_data(t) for t in found],
                               found[-1].key if more else None)

    @extend_schema(request=s.TopicCreateSerializer, responses={201: s.TopicSerializer})
    def post(self, request: Request) -> Response:
        """CREATE TOPIC (profile §7), with keywords, a virtual link and queue parameters."""
        data = valid(s.TopicCreateSerializer, request.data)
        path = new_topic_path(data["path"])
        link = new_topic_path(data["link"], "link") if data.get("link") else None
        snap = snapshot(request)
        with transaction.atomic():
            topic = topic_service.create_topic(snap, path, tuple(data.get("keywords") or ()),
                                               link)
            if data.get("parameters"):
                topic = topic_service.set_parameters(snap, path, dict(data["parameters"]))
            body = topic_data(topic)
        return Response(body, status=status.HTTP_201_CREATED)


class TopicView(APIView):
    @extend_schema(parameters=[PATH_PARAM], responses=s.TopicSerializer)
    def get(self, request: Request, path: str) -> Response:
        return Response(topic_data(topic_service.visible_node(snapshot(request),
                                                              topic_path(path))))

    @extend_schema(parameters=[PATH_PARAM], request=s.TopicPatchSerializer,
                   responses=s.TopicSerializer)
    def patch(self, request: Request, path: str) -> Response:
        """Rename (SET TOPIC NAME), keywords (SET TOPIC KEYWORD), queue parameters (the
        modify right)."""
        data = valid(s.TopicPatchSerializer, request.data)
        snap = snapshot(request)
        with transaction.atomic():
            new = _apply_changes(snap, topic_path(path), data)
            body = topic_data(topic_service.get_visible(snap, new))
        return Response(body)

    @extend_schema(parameters=[PATH_PARAM],
                   responses={204: None, 202: s.RemovedTopicSerializer})
    def delete(self, request: Request, path: str) -> Response:
        """REMOVE TOPIC: gone at once for new publishes; deleted once its queue is empty
        (202 while messages are pending)."""
        pending = topic_service.remove_topic(snapshot(request), topic_path(path))
        if pending:
            return Response({"pending": pending}, status=status.HTTP_202_ACCEPTED)
        return Response(status=status.HTTP_204_NO_CONTENT)


# -------------------------------------------------------------------------------- messages

IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
ACCOUNT_NAME = re.compile(r"[^\W\d_]\w{0,63}")


class TopicMessagesView(APIView):
    @extend_schema(operation_id="topic_messages_list",
                   parameters=[PATH_PARAM, s.MessageQuerySerializer, pagination.PageQuery],
                   responses=pagination.paged(s.MessageSerializer))
    def get(self, request: Request, path: str) -> Response:
        """Messages stored on the topic (or in its Trash), in smuid order (GET MESSAGE)."""
        query = valid(s.MessageQuerySerializer, request.query_params)
        after, limit = pagination.params(request, int)
        after = max(after or 0, query.get("since") or 0)
        target = topic_path(path) + ("/Trash" if query["state"] == "trash" else "")
        found = read_service.get_messages(snapshot(request), target, SmuidSet(all=True),
                                          after=after)
        more = len(found) > limit
        found = found[:limit]
        # A page the service cut short (its byte budget) has a next page as well.
        more = more or len(found) == limit
        return pagination.page(request, [message_data(m, t, c, msg) for t, m, c, msg in found],
                               found[-1][1] if more and found else None)

    @extend_schema(
        parameters=[PATH_PARAM, OpenApiParameter(
            "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER,
            description="A retry with the same key gets the first result.")],
        request=PolymorphicProxySerializer(
            "PublishOneOrMany", [s.PublishSerializer, s.PublishSerializer(many=True)], None,
            many=False),
        responses={201: PolymorphicProxySerializer(
            "PublishedOneOrMany", [s.PublishedSerializer, s.PublishedSerializer(many=True)],
            None, many=False)})
    def post(self, request: Request, path: str) -> Response:
        """PUB MESSAGE: 201 with the smuid once the message is committed; subscribers on
        every door are woken as for an SMQP publish. A list of messages is one batch: all
        of it is committed in one transaction, in list order, or none of it (the first
        refusal answers for the batch), and the 201 lists each one's smuid."""
        many = isinstance(request.data, list)
        if many and not 1 <= len(request.data) <= settings.SMQP_API_PUBLISH_BATCH_MAX:
            raise ValidationError({"non_field_errors": [
                f"A batch holds 1 to {settings.SMQP_API_PUBLISH_BATCH_MAX} messages."]})
        serializer = s.PublishSerializer(data=request.data, many=many)
        serializer.is_valid(raise_exception=True)
        target = topic_path(path)
        account = request.user
        key = request.headers.get("Idempotency-Key")
        if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
            raise ValidationError({"Idempotency-Key": ["1 to 255 printable ASCII characters."]})
        fingerprint = hashlib.sha256(json.dumps(
            [target, request.data], sort_keys=True, default=str).encode()).hexdigest()
        messages = ([s.PublishSerializer.to_message(item) for item in serializer.validated_data]
                    if many else [serializer.message()])
        # A key names the batch: its messages' Cmuids are the key and their place in it.
        cmuids = ([f"{key}/{i}" for i in range(len(messages))] if many and key is not None
                  else [key] if key is not None
                  else [uuid.uuid4().hex for _ in messages])
        requests = [PublishRequest(account_id=account.pk, guid="rest", kind="MESSAGE",
                                   topic=target, cmuid=cmuid, message=message,
                                   peer=peer_of(request), door="rest")
                    for cmuid, message in zip(cmuids, messages, strict=True)]
        loop = getattr(request, "loop_dispatcher", None)
        if loop is not None and key is None and not many:
            # The dispatcher's group commit, which counts it and tells the subscribers. A
            # batch stays one transaction of its own (all or nothing), and a key is
            # committed with its messages.
            published = loop.publish(requests[0])
            return Response(published_body(published, account, requests[0]),
                            status=status.HTTP_201_CREATED)
        with transaction.atomic():
            if key is not None:
                first = IdempotencyKey.objects.filter(account=account, key=key).first()
                if first is not None:
                    if first.fingerprint != fingerprint:
                        return problem(422, "Idempotency-Key used for another request", 409)
                    reply = Response(first.response, status=first.status)
                    reply["Idempotent-Replayed"] = "true"
                    return reply
            results = publish_service.publish_all(requests)
            bodies = [published_body(r, account, req)
                      for r, req in zip(results, requests, strict=True)]
            body: dict | list = bodies if many else bodies[0]
            if key is not None:
                try:
                    with transaction.atomic():
                        IdempotencyKey.objects.create(account=account, key=key,
                                                      fingerprint=fingerprint, status=201,
                                                      response=body)
                except IntegrityError:
                    # The same key committed meanwhile by a concurrent request: this one
                    # publishes nothing (its transaction rolls back); the client retries.
                    transaction.set_rollback(True)
                    return problem(409, "A request with this Idempotency-Key is in progress",
                                   409)
        # Committed: counted as the listeners count their publishes (console rates,
        # /metrics); a replayed Idempotency-Key returned above and published nothing.
        count(request, "publish", len(results))
        return Response(body, status=status.HTTP_201_CREATED)


def published_body(published: Published, account: Account, request: PublishRequest) -> dict:
    return {"smuid": published.smuid, "topic": published.topic_path,
            "cmuid": f"{account.username}/rest/{request.cmuid}"}


class TopicMessageView(APIView):
    @extend_schema(parameters=[PATH_PARAM], responses=s.MessageSerializer)
    def get(self, request: Request, path: str, smuid: str) -> Response:
        target = topic_path(path)
        number = int(smuid)
        if number < 1:
            raise not_found("message")
        found = read_service.get_messages(snapshot(request), target,
                                          SmuidSet(ranges=((number, number),)))
        if not found:
            raise not_found("message")
        t, m, c, msg = found[0]
        return Response(message_data(m, t, c, msg))


class RepublishView(APIView):
    @extend_schema(request=None, responses={201: s.PublishedSerializer})
    def post(self, request: Request, smuid: int) -> Response:
        """REPUBLISH MESSAGE from its topic's Trash."""
        published = publish_service.republish_message(snapshot(request), smuid)
        return Response({"smuid": published.smuid, "topic": published.topic_path,
                         "cmuid": ""}, status=status.HTTP_201_CREATED)


# --------------------------------------------------------------------------- subscriptions


def subscription_data(sub: Subscription) -> dict:
    selector = {"class": sub.selector_class, "text": sub.selector} if sub.selector_class \
        else None
    return {"id": sub.pk, "resource": sub.resource, "pattern": sub.pattern, "since": sub.since,
            "created": sub.created, "selector": selector, "lease_end": sub.lease_end}


class SubscriptionsView(APIView):
    @extend_schema(operation_id="subscriptions_list",
                   parameters=[pagination.PageQuery],
                   responses=pagination.paged(s.SubscriptionSerializer))
    def get(self, request: Request) -> Response:
        after, limit = pagination.params(request, int)
        rows = Subscription.objects.filter(account=request.user).order_by("pk")
        if after is not None:
            rows = rows.filter(pk__gt=after)
        return pagination.page_of(request, rows, limit, subscription_data,
                                  lambda last: last.pk)

    @extend_schema(request=s.SubscriptionCreateSerializer,
                   responses={201: s.NewSubscriptionSerializer})
    def post(self, request: Request) -> Response:
        """SUBSCRIBE: messages still held on the topics become the account's to pull.
        MESSAGE subscriptions may have a ``selector`` (only the messages it is TRUE for;
        566 / 567 when refused) and ``lease_seconds`` (it ends then, and is renewed by
        subscribing again with the same pattern and selector)."""
        data = valid(s.SubscriptionCreateSerializer, request.data)
        resource = data["resource"]
        pattern = None
        if resource != "SERVER":
            if not data.get("pattern"):
                raise ValidationError({"pattern": ["This field is required."]})
            try:
                pattern = parse_topic_pattern(data["pattern"])
            except (ProtocolError, ValueError):
                raise ValidationError({"pattern": ["Not a topic or /topic/* pattern."]}) \
                    from None
        given = data.get("selector")
        selector = (given["class"], given["text"]) if given else None
        snap = snapshot(request)
        # One transaction: the row is read back before a lease sweep elsewhere can end it.
        with transaction.atomic():
            topics = subscription_service.subscribe(snap, resource, pattern,
                                                    data.get("since"),
                                                    data.get("lease_seconds"), selector)
            stored = str(pattern) if pattern is not None else \
                subscription_service.SERVER_TIMEOUT_PATTERN
            # The row is keyed by the selector as the service stored it (canonical class,
            # text trimmed): compile_selector is cached, so nothing is parsed again.
            key = ""
            if selector is not None:
                compiled = compile_selector(*selector)
                key = selector_key(compiled.cls, compiled.text)
            sub = Subscription.objects.get(account=request.user, resource=resource,
                                           pattern_key=stored.casefold(), selector_key=key)
        return Response({**subscription_data(sub), "topics": topics},
                        status=status.HTTP_201_CREATED)


class SubscriptionView(APIView):
    @extend_schema(responses=s.SubscriptionSerializer)
    def get(self, request: Request, pk: int) -> Response:
        return Response(subscription_data(
            pull_service.subscription_of(snapshot(request), pk)))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        """UNSUBSCRIBE."""
        subscription_service.unsubscribe_one(snapshot(request), pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


class PullView(APIView):
    """Runs on the threads of long polls (``long_poll`` in :mod:`api.urls`, served so by
    :mod:`broker.http`): a long poll here holds only its own thread, and waits for the
    dispatcher's wake-up (:mod:`api.loopdispatch`)."""

    @extend_schema(request=s.PullRequestSerializer, responses=s.PullSerializer)
    def post(self, request: Request, pk: int) -> Response:
        """Up to ``max`` messages, each locked to the caller until its ``deadline`` with a
        ``receipt`` to ACK or NACK; waits up to ``wait_seconds`` for the first."""
        data = valid(s.PullRequestSerializer, request.data)
        snap = snapshot(request)
        sub = pull_service.subscription_of(snap, pk)  # 404 before any wait
        deadline = time.monotonic() + min(data["wait_seconds"],
                                          settings.SMQP_API_PULL_MAX_WAIT)
        got = pull_service.pull(snap, sub, data["max"])
        if not got and deadline > time.monotonic():
            loop = getattr(request, "loop_dispatcher", None)
            watching = loop.watching if loop is not None else loopdispatch.no_wakeups
            # Only now waits with the dispatcher (a hop to its loop), and looks again once
            # watching: a commit after the first look is not missed.
            with watching(snap.account.pk) as woken:
                while True:
                    woken.clear()  # before the look: a commit after it sets it again
                    got = pull_service.pull(snap, sub, data["max"])
                    remaining = deadline - time.monotonic()
                    if got or remaining <= 0:
                        break
                    # Woken by a commit for the account; the store is also looked at now
                    # and then for what no commit announces (a lock that ran out).
                    woken.wait(min(settings.SMQP_API_PULL_POLL_SECONDS, remaining))
        # Handed out (each lock committed): the REST form of a NOTIFY MESSAGE, counted as
        # "deliver" with the listeners' ones.
        count(request, "deliver", len(got))
        return Response({"messages": [
            {**message_data(p.smuid, p.topic, p.cmuid, p.message), "receipt": p.receipt,
             "deadline": p.deadline, "attempts": p.attempts} for p in got]})


def count(request: Request, kind: str, n: int = 1) -> None:
    """Count ``n`` of a rate kind: with the dispatcher's own counts when the view runs beside
    one (under :mod:`broker.http`), else at once."""
    if n > 0:
        loop = getattr(request, "loop_dispatcher", None)
        if loop is not None:
            loop.count(kind, n)
        else:
            opsmetrics.count_now(kind, n)


RECEIPT_PARAM = OpenApiParameter("receipt", OpenApiTypes.STR, OpenApiParameter.PATH)


class AckView(APIView):
    @extend_schema(parameters=[RECEIPT_PARAM], request=None, responses={204: None})
    def post(self, request: Request, receipt: str) -> Response:
        """Consume the message (once, whatever door asks); 409 if the lock has ended."""
        pull_service.ack(snapshot(request), receipt)
        count(request, "ack")  # committed (a refused ACK raised above)
        return Response(status=status.HTTP_204_NO_CONTENT)


class NackView(APIView):
    @extend_schema(parameters=[RECEIPT_PARAM], request=None, responses={204: None})
    def post(self, request: Request, receipt: str) -> Response:
        """Let the message go at once to the next subscriber (queue) or back to this
        account (fan-out); 409 if the lock has ended."""
        pull_service.nack(snapshot(request), receipt)
        return Response(status=status.HTTP_204_NO_CONTENT)


def outcomes_data(receipts: list[str], outcomes: list[pull_service.Outcome]) -> dict:
    return {"results": [{"receipt": r, "outcome": o.value, "status": o.status}
                        for r, o in zip(receipts, outcomes, strict=True)]}


class AcksView(APIView):
    @extend_schema(operation_id="receipts_ack_many", request=s.ReceiptsRequestSerializer,
                   responses=s.ReceiptsResultSerializer)
    def post(self, request: Request) -> Response:
        """Consume the messages of several receipts in one transaction, each as its own ack
        would (once, only while its lock holds); answered per receipt, in order, once
        committed."""
        receipts = valid(s.ReceiptsRequestSerializer, request.data)["receipts"]
        outcomes, _ = pull_service.ack_many(snapshot(request), receipts)
        count(request, "ack", outcomes.count(pull_service.Outcome.CONSUMED))
        return Response(outcomes_data(receipts, outcomes))


class NacksView(APIView):
    @extend_schema(operation_id="receipts_nack_many", request=s.ReceiptsRequestSerializer,
                   responses=s.ReceiptsResultSerializer)
    def post(self, request: Request) -> Response:
        """Let the messages of several receipts go at once, each as its own nack would;
        answered per receipt, in order."""
        receipts = valid(s.ReceiptsRequestSerializer, request.data)["receipts"]
        outcomes, _ = pull_service.nack_many(snapshot(request), receipts)
        return Response(outcomes_data(receipts, outcomes))


# ------------------------------------------------------------------------------------- UAL


class EntriesView(APIView):
    @extend_schema(operation_id="ual_entries_list",
                   parameters=[s.EntryQuerySerializer, pagination.PageQuery],
                   responses=pagination.paged(s.EntrySerializer))
    def get(self, request: Request) -> Response:
        """Entries on topics the caller may manage (all, for staff)."""
        query = valid(s.EntryQuerySerializer, request.query_params)
        after, limit = pagination.params(request, int)
        topic = topic_path(query["topic"]) if query.get("topic") else None
        items, more = ual_entries.entries(snapshot(request), topic=topic,
                                          account=query.get("account"), after=after,
                                          limit=limit)
        return pagination.page(request, [ual_entries.entry_data(e) for e in items],
                               items[-1].pk if more and items else None)

    @extend_schema(request=s.EntrySerializer, responses={201: s.EntrySerializer})
    def post(self, request: Request) -> Response:
        data = valid(s.EntrySerializer, request.data)
        entry = ual_entries.create(snapshot(request), topic_path(data["topic"]),
                                   data["principal_kind"], data.get("account"),
                                   data.get("group"), data["right"], data["effect"])
        return Response(ual_entries.entry_data(entry), status=status.HTTP_201_CREATED)


class EntryView(APIView):
    @extend_schema(responses=s.EntrySerializer)
    def get(self, request: Request, pk: int) -> Response:
        return Response(ual_entries.entry_data(ual_entries.get(snapshot(request), pk)))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        ual_entries.delete(snapshot(request), pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ExplainView(APIView):
    @extend_schema(parameters=[s.ExplainQuerySerializer], responses=s.ExplainSerializer)
    def get(self, request: Request) -> Response:
        """The decision on each right and why, level by level: what the admin's
        effective-rights page shows."""
        query = valid(s.ExplainQuerySerializer, request.query_params)
        return Response(ual_entries.explain(snapshot(request), query["account"],
                                            topic_path(query["topic"]), query.get("right")))


# -------------------------------------------------------------------------------- accounts


def account_data(account: Account) -> dict:
    return {"username": account.username, "email": account.email,
            "proper_name": account.proper_name, "is_active": account.is_active,
            "is_superuser": account.is_superuser, "is_remote_server": account.is_remote_server,
            "topic": account.account_topic_path}


class AccountsView(APIView):
    permission_classes = [StaffWith]
    required_perms = {"POST": ["accounts.add_account"]}

    @extend_schema(operation_id="accounts_list",
                   parameters=[pagination.PageQuery],
                   responses=pagination.paged(s.AccountSerializer))
    def get(self, request: Request) -> Response:
        after, limit = pagination.params(request, str)
        rows = Account.objects.order_by("username_key")
        if after is not None:
            rows = rows.filter(username_key__gt=after)
        return pagination.page_of(request, rows, limit, account_data,
                                  lambda last: last.username_key)

    @extend_schema(request=s.AccountCreateSerializer, responses={201: s.AccountSerializer})
    def post(self, request: Request) -> Response:
        data = valid(s.AccountCreateSerializer, request.data)
        account = account_service.create_account(
            data["username"], data["password"], email=data["email"],
            proper_name=data["proper_name"], superuser=data["superuser"],
            remote_server=data["remote_server"])
        return Response(account_data(account), status=status.HTTP_201_CREATED)


def account_named(name: str) -> Account:
    # A name no account can have (NUL, say, which no database takes) is not looked up.
    if not ACCOUNT_NAME.fullmatch(name):
        raise not_found("account")
    return operations.find_account(name)


class AccountView(APIView):
    permission_classes = [StaffWith]
    required_perms = {"PATCH": ["accounts.change_account"],
                      "DELETE": ["accounts.delete_account"]}

    @extend_schema(responses=s.AccountSerializer)
    def get(self, request: Request, name: str) -> Response:
        return Response(account_data(account_named(name)))

    @extend_schema(request=s.AccountChangeSerializer, responses=s.AccountSerializer)
    def patch(self, request: Request, name: str) -> Response:
        """Change details and flags (``is_active: false`` also closes its sessions); a field
        not given keeps its value. Not one's own is_active, is_staff, is_superuser (409)."""
        data = valid(s.AccountChangeSerializer, request.data)
        account = operations.change_account(request.user, account_named(name).username,
                                            dict(data))
        return Response(account_data(account))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, name: str) -> Response:
        """Delete the account, its subscriptions, deliveries, tokens and UAL entries; its
        live sessions are closed. Not one's own (409)."""
        operations.delete_account(request.user, account_named(name).username)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AccountPasswordView(APIView):
    permission_classes = [StaffWith]
    required_perms = {"POST": ["accounts.change_account"]}

    @extend_schema(request=s.PasswordResetSerializer, responses={204: None})
    def post(self, request: Request, name: str) -> Response:
        """Reset the account's password (the password validators apply); SMQP's CLEAR and
        SCRAM-SHA-256 logins take the new one at once."""
        data = valid(s.PasswordResetSerializer, request.data)
        operations.reset_password(request.user, account_named(name).username,
                                  data["password"])
        return Response(status=status.HTTP_204_NO_CONTENT)



# ----------------------------------------------------------------------------------- stats


class StatsView(APIView):
    """Staff only, as the operators' console and /metrics are: the figures name every
    topic, dead letters' accounts and the listeners, whatever the UAL lets an account see."""

    permission_classes = [Staff]

    @extend_schema(operation_id="stats", responses=s.StatsSerializer)
    def get(self, request: Request) -> Response:
        """Message rates, queue depths, sessions per door, dead letters, group commits and
        listeners: what the operators' overview shows (broker.services.stats.snapshot)."""
        return Response(stats_service.snapshot())


def report_data(report, tables: bool = False) -> dict:
    totals = report.usage.filter(dim="total", hour__isnull=True).values(*report_tables.METRICS)
    data = {"day": report.day, "state": report.state, "trigger": report.trigger,
            "started": report.started, "finished": report.finished, "events": report.events,
            "sessions_peak": report.sessions_peak, "subscribers_peak": report.subscribers_peak,
            "totals": dict(totals[0]) if totals else {m: 0 for m in report_tables.METRICS},
            "error": report.error, "partial": report.partial, "until": report.until}
    if tables:
        data["tables"] = report_tables.report_tables(report)
    return data


class ReportsView(APIView):
    """The nightly usage reports (spark_jobs). Staff only, as in the admin: they name every
    topic and account."""

    permission_classes = [Staff]

    @extend_schema(operation_id="reports_list", parameters=[pagination.PageQuery],
                   responses=pagination.paged(s.ReportSummarySerializer))
    def get(self, request: Request) -> Response:
        """The reports, newest day first, each with the day's totals."""
        after, limit = pagination.params(request, str)
        rows = UsageReport.objects.order_by("-day")
        if after is not None:
            try:
                rows = rows.filter(day__lt=date.fromisoformat(after))
            except ValueError:
                return from_service(bad_request("invalid cursor"))
        return pagination.page_of(request, rows, limit, report_data,
                                  lambda last: last.day.isoformat())


class ReportView(APIView):
    permission_classes = [Staff]

    @extend_schema(operation_id="reports_retrieve", responses=s.ReportSerializer)
    def get(self, request: Request, day: str) -> Response:
        """One day's report (``YYYY-MM-DD``, UTC) with every table of its admin page."""
        try:
            report = UsageReport.objects.filter(day=date.fromisoformat(day)).first()
        except ValueError:
            report = None
        if report is None:
            return from_service(not_found("no report for that day"))
        return Response(report_data(report, tables=True))


@extend_schema(exclude=True)
class NoSuchResource(APIView):
    """What no route under /api/v1/ names: 404 as problem details, whatever the method."""

    permission_classes = [permissions.AllowAny]

    def dispatch(self, request, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        request = self.initialize_request(request, *args, **kwargs)
        self.request = request
        self.headers = self.default_response_headers
        response = from_service(not_found("no such resource"))
        self.response = self.finalize_response(request, response, *args, **kwargs)
        return self.response


# ------------------------------------------------------------------- federation links (§9.5)


class LinksView(APIView):
    """Federation links: the same service (:mod:`broker.services.federation`) as
    ``manage.py link`` and the admin. Staff only."""

    permission_classes = [Staff]

    @extend_schema(operation_id="links_list", parameters=[pagination.PageQuery],
                   responses=pagination.paged(s.LinkSerializer))
    def get(self, request: Request) -> Response:
        after, limit = pagination.params(request, str)
        rows = Link.objects.select_related("peer_account").order_by("name")
        if after is not None:
            rows = rows.filter(name__gt=after)
        return pagination.page_of(request, rows, limit, federation.link_data,
                                  lambda last: last.name)

    @extend_schema(request=s.LinkCreateSerializer, responses={201: s.LinkSerializer})
    def post(self, request: Request) -> Response:
        data = dict(valid(s.LinkCreateSerializer, request.data))
        link = federation.save_link(data.pop("name"), create=True, **data)
        return Response(federation.link_data(link), status=status.HTTP_201_CREATED)


class LinkView(APIView):
    permission_classes = [Staff]

    @extend_schema(responses=s.LinkSerializer)
    def get(self, request: Request, name: str) -> Response:
        return Response(federation.link_data(federation.find_link(name)))

    @extend_schema(request=s.LinkChangeSerializer, responses=s.LinkSerializer)
    def patch(self, request: Request, name: str) -> Response:
        """Change some settings: enable or disable the link, its imports, the peer's
        address, TLS. A field not given keeps its value."""
        data = valid(s.LinkChangeSerializer, request.data)
        return Response(federation.link_data(federation.save_link(name, create=False,
                                                                  **data)))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, name: str) -> Response:
        """Remove the link: its supervisor unsubscribes on the peer what it held there."""
        federation.remove_link(name)
        return Response(status=status.HTTP_204_NO_CONTENT)


# ---------------------------------------------------------------------- operators' tools


class IndexView(APIView):
    """``GET /api/v1/``: what there is, by name."""

    RESOURCES = ("topics", "subscriptions", "ual/entries", "ual/explain", "accounts",
                 "sessions", "queues", "definitions", "stats", "reports", "links",
                 "auth/tokens")

    @extend_schema(operation_id="index", responses=s.IndexSerializer)
    def get(self, request: Request) -> Response:
        """The resources of the API (the lists; one item is ``<list>/<id>``), its schema
        and its documentation."""
        base = request.build_absolute_uri("/api/v1/")
        resources = {name: base + name + ("/" if name not in ("ual/explain", "auth/tokens",
                                                                "definitions", "queues")
                                          else "") for name in self.RESOURCES}
        resources["queues"] = base + "queues/{topic path}/consumers|purge|peek"
        return Response({"version": "1", "resources": resources,
                         "schema": request.build_absolute_uri("/api/schema/"),
                         "docs": request.build_absolute_uri("/api/docs/")})


GUID_PARAM = OpenApiParameter("guid", OpenApiTypes.STR, OpenApiParameter.PATH,
                              description="The session's guid (jtegen0456).")
#: What a guid can be (an account name and a number): nothing else is looked up (no
#: database takes a NUL, say).
GUID = re.compile(r"\w{1,100}")


def session_guid(guid: str) -> str:
    if not GUID.fullmatch(guid):
        raise not_found("session")
    return guid


class SessionsView(APIView):
    """Live sessions of every door: RabbitMQ's connections list."""

    permission_classes = [StaffWith]
    required_perms = {"GET": ["accounts.view_loginsession"]}

    @extend_schema(operation_id="sessions_list",
                   parameters=[s.SessionQuerySerializer, pagination.PageQuery],
                   responses=pagination.paged(s.OpsSessionSerializer))
    def get(self, request: Request) -> Response:
        """Newest first, with door, account, client address, login time, messages in and
        out, unacked and locked counts and rates."""
        query = valid(s.SessionQuerySerializer, request.query_params)
        before, limit = pagination.params(request, int)
        rows, next_key = operations.sessions(account=query.get("account"), before=before,
                                             limit=limit)
        if query.get("door"):
            rows = [r for r in rows if r["door"] == query["door"].lower()]
        return pagination.page(request, rows, next_key)


class SessionView(APIView):
    permission_classes = [StaffWith]
    required_perms = {"GET": ["accounts.view_loginsession"],
                      "DELETE": ["accounts.change_loginsession"]}

    @extend_schema(parameters=[GUID_PARAM], responses=s.OpsSessionSerializer)
    def get(self, request: Request, guid: str) -> Response:
        rows, _ = operations.sessions(guid=session_guid(guid), limit=1)
        if not rows:
            raise not_found("session")
        return Response(rows[0])

    @extend_schema(parameters=[GUID_PARAM], responses={202: None})
    def delete(self, request: Request, guid: str) -> Response:
        """Close the session: its listener says NOTIFY SERVER BYE (XMPP: a stream error)
        and disconnects; its queue-mode locks end. 202: asked, not yet done."""
        operations.close_session(request.user, session_guid(guid))
        return Response(status=status.HTTP_202_ACCEPTED)


class ConsumersView(APIView):
    permission_classes = [StaffWith]
    required_perms = {"GET": ["broker.view_delivery"]}

    @extend_schema(operation_id="queue_consumers", parameters=[PATH_PARAM],
                   responses=s.ConsumersSerializer)
    def get(self, request: Request, path: str) -> Response:
        """The topic's subscribing accounts with their backlog, locks, dead letters, lag,
        subscriptions and live sessions."""
        return Response(operations.consumers(topic_path(path)))


class PurgeView(APIView):
    permission_classes = [StaffWith]
    required_perms = {"POST": ["broker.delete_message"]}

    @extend_schema(operation_id="queue_purge", parameters=[PATH_PARAM], request=None,
                   responses=s.PurgedSerializer)
    def post(self, request: Request, path: str) -> Response:
        """Every pending message of the topic goes to its Trash (REPUBLISH can bring one
        back until the Trash purge); returns how many. Audited."""
        return Response(operations.purge(request.user, topic_path(path)))


class PeekView(APIView):
    permission_classes = [StaffWith]
    required_perms = {"GET": ["broker.view_message"]}

    @extend_schema(operation_id="queue_peek",
                   parameters=[PATH_PARAM, s.PeekQuerySerializer],
                   responses=s.PeekSerializer)
    def get(self, request: Request, path: str) -> Response:
        """Messages waiting on the topic (or in its Trash), oldest first, with their data
        and their deliveries' states. Read only: nothing is locked, delivered or ACKed."""
        query = valid(s.PeekQuerySerializer, request.query_params)
        found = operations.peek(topic_path(path), query["count"], query["after"],
                                trash=query["state"] == "trash")
        return Response({"messages": [
            {**message_data(m["smuid"], m["topic"], m["cmuid"], m["message"]),
             "received": m["received"], "size": m["size"], "deliveries": m["deliveries"]}
            for m in found]})


class DefinitionsView(APIView):
    """Topics, accounts (no secrets), groups, UAL entries and links as one document:
    RabbitMQ's definitions export and import. Superusers only: an import may create
    superusers."""

    permission_classes = [Superuser]

    @extend_schema(operation_id="definitions_export", responses=s.DefinitionsSerializer)
    def get(self, request: Request) -> Response:
        return Response(operations.export_definitions())

    @extend_schema(operation_id="definitions_import", request=s.DefinitionsSerializer,
                   responses=s.ImportResultSerializer)
    def post(self, request: Request) -> Response:
        """Create what is missing, change what differs, delete nothing: importing the same
        document again changes nothing. One transaction: a refusal changes nothing and
        names the item."""
        data = valid(s.DefinitionsSerializer, request.data)
        for item in data.get("topics", []):
            item["path"] = new_topic_path(item["path"])
            if item.get("link"):
                item["link"] = new_topic_path(item["link"], "link")
        return Response(operations.import_definitions(request.user, data))
