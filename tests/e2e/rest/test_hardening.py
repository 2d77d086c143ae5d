"""Issue 34 at the REST door (real Daphne over HTTP, SQLite and PostgreSQL): password guesses
are counted per (address, account), another account's good login resetting nothing (item 3);
a virtual link needs the subscribe right on its destination (5); a hidden topic answers
topic creation and republish exactly as a missing one (7)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.api_stack import ApiStack, api_stack
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

SETUP = """
from broker.services import topics as ts
from topics.models import Topic
from ual.models import UALEntry
from ual.resolution import AccessSnapshot
snap = AccessSnapshot(Account.objects.get(username='root'))
for p in ['/secret', '/secret/inner', '/bobzone', '/open', '/open/pubonly']:
    ts.create_topic(snap, p)
bob = Account.objects.get(username='bob')
def allow(path, right, effect='allow'):
    UALEntry.objects.create(topic=Topic.objects.get(path=path), principal_kind='account',
                            account=bob, right=right, effect=effect)
allow('/bobzone', 'manage')
allow('/open', 'subscribe')
allow('/open/pubonly', 'publish')
allow('/open/pubonly', 'subscribe', 'deny')
from topics import tree
tree.changed()
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory) -> Iterator[ApiStack]:
    # No delays before the lockout: only the count is looked at here.
    with api_stack(request.param, tmp_path_factory.mktemp(f"hard-{request.param}"),
                   SETUP, extra_env={"SMQP_LOGIN_FAILURES_BEFORE_DELAY": "1000"}) as s:
        yield s


def answer(reply) -> tuple[int, dict]:
    body = reply.json()
    body.pop("instance", None)  # the request's own path
    return reply.status_code, body


@pytest.mark.parametrize("hidden, missing", [
    ({"path": "/secret/kid"}, {"path": "/nothere/kid"}),
    ({"path": "/secret"}, {"path": "/nothere"}),
    ({"path": "/secret/inner/kid"}, {"path": "/nothere/inner/kid"}),
    ({"path": "/bobzone/v1", "link": "/secret"}, {"path": "/bobzone/v1", "link": "/nothere"}),
])
def test_creating_at_a_hidden_topic_answers_as_at_a_missing_one(stack, hidden, missing):
    with stack.client("bob") as bob:
        first, second = answer(bob.post("topics/", json=hidden)), answer(
            bob.post("topics/", json=missing))
        assert first == second and first[0] >= 400


def test_a_link_needs_the_subscribe_right_on_its_destination(stack):
    with stack.client("bob") as bob:
        refused = bob.post("topics/", json={"path": "/bobzone/v2", "link": "/open/pubonly"})
        assert refused.status_code == 403 and "subscribe" in refused.text
        made = bob.post("topics/", json={"path": "/bobzone/v3", "link": "/open"})
        assert made.status_code == 201, made.text


def test_republish_of_a_message_on_a_hidden_topic_answers_as_a_missing_message(stack):
    with stack.client("root") as root, stack.client("bob") as bob:
        reply = root.post("topics/secret/messages", json={"sections": [{"text": "s"}]})
        assert reply.status_code == 201, reply.text
        smuid = reply.json()["smuid"]
        hidden = answer(bob.post(f"messages/{smuid}/republish"))
        missing = answer(bob.post(f"messages/{smuid + 1000}/republish"))
        assert hidden == missing and hidden[0] == 404


def test_token_guesses_are_not_reset_by_anothers_good_login(stack):
    """Two wrong passwords for alice, then a token for bob with his right one, six times:
    alice's guesses stop at the limit (10); the eleventh and twelfth are 429."""
    codes = []
    with httpx.Client(base_url=stack.http + "/api/v1/", timeout=scaled(60)) as anon:
        for _ in range(6):
            for _ in range(2):
                codes.append(anon.post("auth/tokens", json={
                    "username": "alice", "password": "wrong", "name": "t"}).status_code)
            made = anon.post("auth/tokens", json={"username": "bob", "password": "pw",
                                                  "name": "t"})
            assert made.status_code == 201, made.text
    assert codes == [401] * 10 + [429] * 2
