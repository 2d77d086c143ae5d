"""The federation rules (profile §9.5) without sockets: imports and interest, what a server
stores or drops of what a link received (loop, duplicate, Depth, imports, malformed input,
fuzzed), what a peer's account may receive (``remote`` right, never Depth 0), the operator's
``manage.py link`` and the admin's view of a link's state, backlog and last error. The wire
behaviour is in tests/test_e2e_federation*.py."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.domain import message as codec
from broker.domain.values import TopicPattern
from broker.models import Delivery, FederatedOrigin, Link, Message, Subscription
from broker.services import ServiceError
from broker.services import federation as fed
from broker.services.prepare import PublishRequest
from broker.services.publish import publish
from broker.services.subscriptions import subscribe
from tests.support.examples import examples
from tests.support.factories import make_account
from topics.models import Topic
from ual import grants
from ual.resolution import invalidate_local, snapshot_for

pytestmark = pytest.mark.django_db

ME = "b.test"


def topic(path: str) -> Topic:
    parent = None
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        sub = "/".join(parts[:i])
        parent = (Topic.objects.filter(key=sub.casefold()).first()
                  or Topic.objects.create(path=sub, parent=parent))
    return parent


def forwarded(smuid: str = "a.test/7", depth: str | None = "1", **extra: str) -> codec.Message:
    headers = [("Created", "D08232001T14451246Z"), ("Smuid", smuid),
               ("Cmuid", "bob/bob1/A1")]
    if depth is not None:
        headers.append(("Depth", depth))
    headers += [(k.replace("_", "-"), v) for k, v in extra.items()]
    return codec.Message(headers, [codec.DataSection([("Content-Type", "text/plain")], b"24.5")])


def accept(msg: codec.Message, peer_topic: str = "/news/ibm", imports: str = "/*",
           link: str = "a") -> fed.Accepted:
    with override_settings(SMQP_SERVER_CONTEXT=ME):
        return fed.accept_forwarded(link, fed.parse_imports(imports), peer_topic, msg)


def headers_of(smuid: int) -> dict[str, str]:
    return {k: v for k, v in Message.objects.get(pk=smuid).headers}


# ------------------------------------------------------------------------- imports, interest


def test_imports_name_what_may_cross():
    imports = fed.parse_imports("/news/*, /stocks/ibm")
    assert [str(p) for p in imports] == ["/news/*", "/stocks/ibm"]
    assert fed.imported("/news/tech/ai", imports)
    assert fed.imported("/STOCKS/IBM", imports)
    assert not fed.imported("/news", imports)  # a wildcard is what is below it
    assert not fed.imported("/stocks/hp", imports)
    assert fed.imported("/anything", fed.parse_imports("/*"))
    with pytest.raises(ValueError):
        fed.parse_imports("/news/*, not a topic")


def test_interest_is_what_subscribers_here_want_below_the_link_narrowed_to_its_imports():
    bob, carol = make_account("bob"), make_account("carol")
    for account, pattern in [(bob, "/a/news/*"), (bob, "/a/stocks/ibm"), (carol, "/a/news/*"),
                             (carol, "/b/news/*"), (bob, "/a"), (carol, "/A/Sports/x")]:
        Subscription.objects.create(account=account, resource="MESSAGE", pattern=pattern)
    assert fed.interest("a", fed.parse_imports("/*")) == [
        "/news/*", "/Sports/x", "/stocks/ibm"]
    # Narrowed: only what the link imports; a wider wish becomes the import itself.
    assert fed.interest("a", fed.parse_imports("/news/tech/*, /stocks/*")) == [
        "/news/tech/*", "/stocks/ibm"]
    # /<link>/* wants every import.
    Subscription.objects.create(account=bob, resource="MESSAGE", pattern="/a/*")
    assert fed.interest("a", fed.parse_imports("/news/tech/*, /stocks/*")) == [
        "/news/tech/*", "/stocks/*"]


# ------------------------------------------------------------------------------ accepting


def test_a_forwarded_message_is_stored_below_the_link_with_origin_route_and_lower_depth():
    result = accept(forwarded(depth="2"))
    assert result.dropped is None and result.origin == "a.test/7"
    stored = Message.objects.get(pk=result.smuid)
    assert stored.topic.path == "/a/news/ibm"  # the topics below /a made as needed
    assert stored.depth == 1
    h = headers_of(result.smuid)
    assert h["Depth"] == "1"
    assert h["X-Origin"] == "a.test/7"
    assert h["X-Route"] == "a.test,b.test"
    assert "Smuid" not in h and "Cmuid" not in h
    assert FederatedOrigin.objects.get(origin="a.test/7").message_id == result.smuid


def test_unlimited_depth_stays_unlimited_and_the_route_grows():
    result = accept(forwarded("c.test/3", depth="-1", X_Origin="a.test/9",
                              X_Route="a.test,c.test"), peer_topic="/a/news/x", link="c")
    h = headers_of(result.smuid)
    assert (h["Depth"], h["X-Origin"], h["X-Route"]) == ("-1", "a.test/9",
                                                         "a.test,c.test,b.test")
    assert Message.objects.get(pk=result.smuid).topic.path == "/c/a/news/x"


def test_a_route_that_names_this_server_is_a_loop():
    result = accept(forwarded("c.test/3", depth="-1", X_Origin="b.test/1",
                              X_Route="B.TEST,c.test"))
    assert result.dropped == "loop"
    assert not Message.objects.exists()


def test_a_second_copy_of_an_origin_is_a_duplicate_by_any_route():
    first = accept(forwarded("a.test/5", depth="-1"))
    again = accept(forwarded("a.test/5", depth="-1"))  # sent again after a broken link
    other = accept(forwarded("c.test/8", depth="-1", X_Origin="a.test/5", X_Route="a.test,c.test"),
                   peer_topic="/a/news/ibm", link="c")
    assert first.smuid is not None
    assert again.dropped == other.dropped == "duplicate"
    assert Message.objects.count() == 1


def test_spent_depth_and_topics_outside_the_imports_are_dropped():
    assert accept(forwarded(depth="0")).dropped == "depth"
    assert accept(forwarded(depth=None)).dropped == "depth"  # no Depth: local only
    assert accept(forwarded(), imports="/stocks/*").dropped == "not imported"
    assert not Message.objects.exists()


@pytest.mark.parametrize("msg,peer_topic", [
    (forwarded(smuid="7"), "/news"),  # no host in the Smuid
    (forwarded(smuid=""), "/news"),
    (forwarded(depth="deep"), "/news"),
    (forwarded(depth="-2"), "/news"),
    (forwarded(Priority="0"), "/news"),
    (forwarded(Timeout="soon"), "/news"),
    (forwarded(), "news"),
    (forwarded(), "/news/Trash"),
])
def test_malformed_input_is_dropped_and_said(msg, peer_topic):
    result = accept(msg, peer_topic=peer_topic)
    assert result.dropped is not None and result.smuid is None
    assert result.dropped.startswith("malformed") or "Trash" in peer_topic
    assert not Message.objects.exists()


def test_a_limit_here_refuses_and_the_peer_sends_it_again_later():
    topic("/a/news/ibm").__class__.objects.filter(key="/a/news/ibm").update(
        max_message_size=2)
    with pytest.raises(ServiceError) as refused:
        accept(forwarded())
    assert refused.value.code == 414
    assert not FederatedOrigin.objects.exists()  # not counted: the next copy is stored


_header_names = st.sampled_from(["Depth", "X-Origin", "X-Route", "Smuid", "Priority",
                                 "Timeout", "Created", "Sequence", "Reply", "Name", "X-Other"])
_values = st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                         blacklist_characters="\r\n"), max_size=40)


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(headers=st.lists(st.tuples(_header_names, _values), max_size=8),
       peer_topic=st.one_of(st.sampled_from(["/news/ibm", "/x"]), _values))
def test_fuzz_whatever_a_peer_sends_is_stored_dropped_or_refused(headers, peer_topic):
    """A peer's message is outside input: any header values and topic, and the server
    stores it, drops it with a reason, or refuses it with a reply code; nothing else."""
    msg = codec.Message([("Smuid", "a.test/1"), *headers], [])
    try:
        result = accept(msg, peer_topic=peer_topic)
    except ServiceError as exc:
        assert 400 <= exc.code < 600
        return
    assert (result.smuid is None) != (result.dropped is None)


# ----------------------------------------------------------------------- the sending side


def _publish(account, path: str, depth: str) -> int:
    req = PublishRequest(account_id=account.pk, guid="g", kind="MESSAGE", topic=path,
                         cmuid="c", message=codec.Message(
                             [("Created", "D08232001T14451246Z"), ("Depth", depth)], []))
    return publish(req).smuid


def test_a_peer_receives_with_the_remote_right_and_never_depth_zero():
    news = topic("/news")
    bob, peer = make_account("bob"), make_account("peer_b", is_remote_server=True)
    grants.grant_to_many(news, "publish", "allow", [bob])
    # With subscribe alone a server may subscribe, but receives nothing: it needs remote.
    grants.grant_to_many(news, "subscribe", "allow", [peer])
    invalidate_local()
    earlier = _publish(bob, "/news", "1")
    assert subscribe(snapshot_for(peer), "MESSAGE", TopicPattern("/news", False)) == ["/news"]
    held = _publish(bob, "/news", "1")
    held_local = _publish(bob, "/news", "0")
    assert not Delivery.objects.filter(account=peer).exists()
    grants.grant_to_many(news, "remote", "allow", [peer])
    invalidate_local()
    # Subscribing now, it gets what is still held there for it, but not a Depth 0 one.
    assert subscribe(snapshot_for(peer), "MESSAGE", TopicPattern("/news", False)) == ["/news"]
    one = _publish(bob, "/news", "1")
    zero = _publish(bob, "/news", "0")
    unlimited = _publish(bob, "/news", "-1")
    assert sorted(Delivery.objects.filter(account=peer).values_list("message_id", flat=True)) \
        == [earlier, held, one, unlimited]
    assert held_local < one
    # A Depth 0 message the peer did not get has its timeout start (nobody waits for it).
    assert Message.objects.get(pk=zero).expires is not None


def test_subscribing_below_a_link_makes_the_topics_when_the_account_may_receive_there():
    Link.objects.create(name="east", host="h", account="x")
    root = topic("/east")
    bob, eve = make_account("bob"), make_account("eve")
    grants.grant_to_many(root, "subscribe", "allow", [bob])
    invalidate_local()
    assert subscribe(snapshot_for(bob), "MESSAGE", TopicPattern("/east/news/tech", True)) == [
        "/east/news/tech/*"]
    assert Topic.objects.filter(key="/east/news/tech").exists()
    with pytest.raises(ServiceError):  # no right there: nothing made, 404 as for any topic
        subscribe(snapshot_for(eve), "MESSAGE", TopicPattern("/east/sports", False))
    assert not Topic.objects.filter(key="/east/sports").exists()
    with pytest.raises(ServiceError):  # not a link: nothing made
        subscribe(snapshot_for(bob), "MESSAGE", TopicPattern("/west/news", False))


# ------------------------------------------------------------------- operator and admin


def test_manage_link_add_list_remove(capsys):
    make_account("peer_east", is_remote_server=True)
    call_command("link", "add", "east", "--host", "east.example.net", "--port", "7200",
                 "--account", "west", "--password", "s3cret", "--import", "/news/*",
                 "--import", "/stocks/ibm", "--peer-account", "peer_east", "--tls")
    link = Link.objects.get(name="east")
    assert (link.host, link.port, link.tls, link.imports) == (
        "east.example.net", 7200, True, "/news/*, /stocks/ibm")
    with pytest.raises(CommandError):
        call_command("link", "add", "east", "--host", "x", "--account", "y")
    with pytest.raises(CommandError):
        call_command("link", "add", "no/pe", "--host", "x", "--account", "y")
    with pytest.raises(CommandError):
        call_command("link", "add", "west", "--host", "x", "--account", "y", "--import", "bad")
    capsys.readouterr()
    call_command("link", "list")
    out = capsys.readouterr().out
    assert "east\twest@east.example.net:7200 SMQPS\tidle" in out and "backlog 0" in out
    call_command("link", "remove", "east")
    assert not Link.objects.exists()
    with pytest.raises(CommandError):
        call_command("link", "remove", "east")


def test_admin_shows_each_links_state_backlog_and_last_error(admin_client):
    news = topic("/news")
    bob, peer = make_account("bob"), make_account("peer_east", is_remote_server=True)
    grants.grant_to_many(news, "publish", "allow", [bob])
    grants.grant_to_many(news, "remote", "allow", [peer])
    invalidate_local()
    Subscription.objects.create(account=peer, resource="MESSAGE", pattern="/news")
    for _ in range(3):
        _publish(bob, "/news", "1")
    Link.objects.create(name="east", host="east.example.net", account="west", password="pw",
                        peer_account=peer, state=Link.State.DOWN,
                        last_error="ConnectionRefusedError: [Errno 111] Connection refused")
    page = admin_client.get("/admin/broker/link/").content.decode()
    assert "east" in page and "west@east.example.net:720" in page
    assert "down (retrying with backoff)" in page
    assert "Connection refused" in page
    assert '<td class="field-backlog">3</td>' in page
    link = Link.objects.get()
    change = admin_client.get(f"/admin/broker/link/{link.pk}/change/").content.decode()
    assert "Connection refused" in change and 'type="password"' in change
    assert 'value="pw"' not in change  # the stored password is never shown back


def test_a_publisher_cannot_forge_an_origin_or_a_route():
    news = topic("/news")
    bob = make_account("bob")
    grants.grant_to_many(news, "publish", "allow", [bob])
    invalidate_local()
    req = PublishRequest(account_id=bob.pk, guid="g", kind="MESSAGE", topic="/news", cmuid="c",
                         message=codec.Message([("Created", "D08232001T14451246Z"),
                                                ("X-Origin", "c.test/5"),
                                                ("x-route", "b.test"), ("X-Other", "kept")], []))
    stored = dict(Message.objects.get(pk=publish(req).smuid).headers)
    assert "X-Origin" not in stored and "x-route" not in stored
    assert stored["X-Other"] == "kept"


def test_the_admin_form_keeps_the_stored_password_when_left_blank():
    from broker.admin import LinkForm

    link = Link.objects.create(name="east", host="h", account="west", password="s3cret")
    data = {"name": "east", "host": "h2", "port": 720, "account": "west", "password": "",
            "imports": "/news/*,  /x", "enabled": "on", "tls_ca": "", "tls_server_name": ""}
    form = LinkForm(data=data, instance=link)
    assert form.is_valid(), form.errors
    form.save()
    link.refresh_from_db()
    assert (link.host, link.password, link.imports) == ("h2", "s3cret", "/news/*, /x")
    bad = LinkForm(data={**data, "imports": "nope"}, instance=link)
    assert not bad.is_valid() and "imports" in bad.errors
    named = LinkForm(data={**data, "name": "Trash"})
    assert not named.is_valid() and "name" in named.errors


# ------------------------------------------------------------------------- a link's window


def test_a_window_is_stored_in_one_batch_in_order_each_origin_once():
    window = [("/news/ibm", forwarded(f"a.test/{n}")) for n in (3, 4, 3, 5)]
    window.append(("/news/ibm", forwarded("a.test/6", depth="0")))  # dropped before any query
    with override_settings(SMQP_SERVER_CONTEXT=ME):
        results = fed.accept_forwarded_batch("a", fed.parse_imports("/*"), window)
    first, second, _again, third, _spent = results
    assert [r.dropped for r in results] == [None, None, "duplicate", None, "depth"]
    assert first.smuid < second.smuid < third.smuid  # stored in the order sent
    assert [headers_of(r.smuid)["X-Origin"] for r in (first, second, third)] == [
        "a.test/3", "a.test/4", "a.test/5"]
    # The peer sends the window again (its ACKs lost with the session): nothing twice.
    with override_settings(SMQP_SERVER_CONTEXT=ME):
        repeated = fed.accept_forwarded_batch("a", fed.parse_imports("/*"), window[:4])
    assert [r.dropped for r in repeated] == ["duplicate"] * 4
    assert Message.objects.count() == 3


def test_one_refused_in_a_window_leaves_the_others_stored():
    topic("/a/news/ibm").__class__.objects.filter(key="/a/news/ibm").update(
        max_message_size=3)
    big = forwarded("a.test/8")  # 4 bytes: over the limit here
    small = codec.Message(big.headers, [codec.DataSection([], b"ok")])
    small = codec.Message([(k, "a.test/9" if k == "Smuid" else v) for k, v in small.headers],
                          small.sections)
    with override_settings(SMQP_SERVER_CONTEXT=ME):
        refused, stored = fed.accept_forwarded_batch(
            "a", fed.parse_imports("/*"), [("/news/ibm", big), ("/news/ibm", small)])
    assert isinstance(refused, ServiceError) and refused.code == 414
    assert stored.smuid is not None
    assert list(FederatedOrigin.objects.values_list("origin", flat=True)) == ["a.test/9"]


def test_the_link_reads_the_peers_max_window_and_names_its_messages():
    from broker.federation.link import _max_window, _peer_smuid
    from broker.smqp import Reply

    assert _max_window(Reply(200, ["OK", "Max-Message-Size: 10", "Max-Window: 256"])) == 256
    assert _max_window(Reply(200, ["OK", "Max-Message-Size: 10"])) is None
    assert _peer_smuid("a.test/42") == 42
    assert _peer_smuid("a.test/ctx/7") == 7
    assert _peer_smuid(None) is None
