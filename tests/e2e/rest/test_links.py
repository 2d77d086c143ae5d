"""Federation links registered over the REST API (profile §9.5: "An administrator registers
links (admin, REST, manage.py link)"), end to end: two real brokers (tests/federation_net.py)
with no link between them yet; B's REST door (Daphne) and link supervisor run. A link made
by ``POST /api/v1/links/`` on B comes up, and a message published on A reaches B's
subscriber through it; disabled and enabled again by PATCH; deleted, its subscription on A
is withdrawn. Refusals (bad imports, a second link of the same name, a non-staff caller)
are problem documents, and the password is never shown back."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import daphne, run_manage
from tests.support.federation_net import Domain, prepared, wait_for
from tests.support.smqp_session import Session, header, smuid_of
from tests.support.timing import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

STAFF = """
from accounts.models import Account
for name, staff in (('root', True), ('carol', False)):
    a = Account(username=name, is_superuser=staff, is_staff=staff)
    a.set_password('pw')
    a.save()
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def pair(request, tmp_path_factory) -> Iterator[tuple[Domain, Domain, str, dict[str, str]]]:
    base = tmp_path_factory.mktemp(f"api-links-{request.param}")
    with prepared(request.param, base, ("a", "b")) as domains:
        a, b = domains["a"], domains["b"]
        a.start_listener()
        b.start_listener()
        b.shell(STAFF)
        b.start_links()  # no link yet: the supervisor picks up what REST registers
        tokens = {user: run_manage(b.env, "token", "create", user, "t").stdout.strip()
                  for user in ("root", "carol")}
        with daphne(b.env, base / "b") as url:
            yield a, b, url, tokens


def client(url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url + "/api/v1/", timeout=scaled(60), headers=headers)


def peer_subscriptions(a: Domain) -> list[str]:
    """What B's link (logged in to A as peer_b) holds subscribed on A."""
    return [p for (p,) in a.sql(
        "SELECT s.pattern FROM broker_subscription s JOIN accounts_account x ON x.id = "
        "s.account_id WHERE x.username = 'peer_b'")]


def test_link_made_over_rest_carries_a_message_and_its_removal_withdraws(pair):
    a, b, url, tokens = pair
    api = client(url, tokens["root"])
    made = api.post("links/", json={
        "name": "a", "host": a.host, "port": a.port, "account": "peer_b", "password": "pw",
        "imports": ["/news/*"], "peer_account": "peer_a"})
    assert made.status_code == 201, made.text
    body = made.json()
    assert "password" not in body and body["password_set"] is True
    assert body["imports"] == ["/news/*"] and body["peer_account"] == "peer_a"
    assert body["enabled"] is True and body["backlog"] == 0

    up = wait_for(lambda: (r := api.get("links/a").json())["state"] == "up" and r, 120,
                  "the link up")
    assert up["up"] is True and up["last_connected"] is not None

    s = Session(b.host, b.port, "bob")
    wait_for(lambda: s.command("SUB MESSAGE /a/news/d1").code == 200, 120,
             "SUB on B below the new link", interval=0.5)
    wait_for(lambda: "/news/d1" in api.get("links/a").json()["subscribed"], 120,
             "B's link subscribed on A", interval=0.5)
    assert "/news/d1" in peer_subscriptions(a)
    with Session(a.host, a.port, "bob") as pub:
        smuid = smuid_of(pub.publish("/news/d1", "over-rest", [("Depth", "1")]))
    msg = s.message(timeout=120)
    s.ack()
    assert msg.topic == "/a/news/d1" and header(msg, "X-Origin") == f"a.test/{smuid}"
    wait_for(lambda: api.get("links/a").json()["stored"] >= 1, 60, "the stored counter")

    listed = api.get("links/").json()
    assert [x["name"] for x in listed["results"]] == ["a"] and listed["next"] is None
    assert "password" not in listed["results"][0]

    # Disabled: the supervisor stops the session (the subscription on A stays, so A keeps
    # queueing); enabled again, it comes back up.
    off = api.patch("links/a", json={"enabled": False})
    assert off.status_code == 200 and off.json()["enabled"] is False
    wait_for(lambda: api.get("links/a").json()["state"] == "disabled", 120, "disabled")
    assert "/news/d1" in peer_subscriptions(a)
    on = api.patch("links/a", json={"enabled": True, "imports": ["/news/*", "/stocks/*"]})
    assert on.status_code == 200 and on.json()["imports"] == ["/news/*", "/stocks/*"]
    assert on.json()["password_set"] is True  # a PATCH without a password keeps it
    wait_for(lambda: api.get("links/a").json()["state"] == "up", 120, "up again")

    gone = api.delete("links/a")
    assert gone.status_code == 204
    assert api.get("links/a").status_code == 404
    wait_for(lambda: not peer_subscriptions(a), 120, "B's link's subscription on A withdrawn")
    s.close()


def test_refusals_are_problem_documents(pair):
    _, _, url, tokens = pair
    api = client(url, tokens["root"])
    good = {"name": "east", "host": "127.0.0.1", "port": 1, "account": "x",
            "password": "secret", "enabled": False}
    bad_import = api.post("links/", json={**good, "imports": ["news"]})
    assert bad_import.status_code == 400 and bad_import.json()["smqp_code"] == 400
    assert "not a topic pattern" in bad_import.json()["detail"]
    bad_name = api.post("links/", json={**good, "name": "no/pe"})
    assert bad_name.status_code == 400
    reserved = api.post("links/", json={**good, "name": "accounts"})
    assert reserved.status_code == 400
    no_peer = api.post("links/", json={**good, "peer_account": "nobody"})
    assert no_peer.status_code == 400 and "nobody" in no_peer.json()["detail"]
    control = api.post("links/", json={**good, "account": "x\r\nQUIT"})
    assert control.status_code == 400
    port = api.post("links/", json={**good, "port": 70000})
    assert port.status_code == 400 and "port" in port.json()["errors"]

    made = api.post("links/", json=good)
    assert made.status_code == 201, made.text
    assert "secret" not in made.text
    again = api.post("links/", json={**good, "name": "EAST"})  # names are case-insensitive
    assert again.status_code == 409 and again.json()["smqp_code"] == 409
    assert api.patch("links/nowhere", json={"enabled": True}).status_code == 404
    assert api.patch("links/east", json={"imports": ["*"]}).status_code == 400
    # The stored row is as it was after the refused change.
    assert api.get("links/EAST").json()["imports"] == ["/*"]

    # Staff only: an ordinary account's token is refused, no token asks for credentials.
    assert client(url, tokens["carol"]).get("links/").status_code == 403
    assert client(url, tokens["carol"]).post("links/", json={**good, "name": "w"}) \
        .status_code == 403
    assert client(url, None).get("links/east").status_code == 401
    assert api.delete("links/east").status_code == 204
    assert api.delete("links/east").status_code == 404
