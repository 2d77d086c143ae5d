"""Each door's one mapping of the services' refusals to its wire (no socket): SMQP's reply
(broker.smqp.replies.error), XMPP's IQ error (broker.xmpp.stanzas.fault_of), REST's problem
(api.problems.from_service) and QQP's status (broker.consumers.qqp._refused). The expected
values are what each door answered before the Refusal enum: the wire does not change."""

from __future__ import annotations

import pytest

from api.problems import from_service
from broker.consumers.qqp import _refused
from broker.domain.errors import ProtocolError, Refusal
from broker.services import ServiceError, conflict, not_found, refuse, too_large
from broker.services.pubsub import OptionsRequired
from broker.services.selectors import incorrect, unsupported
from broker.smqp.replies import error as smqp_error
from broker.xmpp import stanzas as s
from broker.xmpp.stanzas import fault_of

# code → (REST status, XMPP condition, XMPP pubsub condition, QQP status), as before.
WIRE = {
    400: (400, "bad-request", None, 5),
    401: (403, "forbidden", None, 5),
    404: (404, "item-not-found", None, 5),
    405: (403, "not-allowed", None, 5),
    406: (409, "bad-request", None, 5),
    408: (400, "bad-request", None, 5),
    409: (409, "conflict", None, 5),
    414: (413, "not-acceptable", "payload-too-big", 5),
    500: (400, "internal-server-error", None, 4),
    510: (422, "resource-constraint", None, 4),
}


@pytest.mark.parametrize("code", sorted(WIRE))
def test_each_door_answers_a_refusal_as_before(code):
    http, condition, pubsub, qqp = WIRE[code]
    exc = refuse(Refusal.of(code), "why")
    text = f"{Refusal.of(code).phrase} (why)"
    assert smqp_error(exc) == f"{code} {text}\r\n".encode()
    fault = fault_of(exc)
    assert (fault.condition, fault.pubsub, fault.text) == (condition, pubsub, text)
    response = from_service(exc)
    assert response.status_code == http
    assert response.data["smqp_code"] == code
    assert response.data["detail"] == text
    assert response.content_type == "application/problem+json"
    refused = _refused(exc)
    assert refused.code == qqp
    assert refused.text == (f"not stored ({text}); try again later" if qqp == 4
                            else f"refused: {code} {text}")


def test_a_problem_has_the_refusals_type_and_title():
    body = from_service(too_large("message of 9 bytes")).data
    assert body == {"type": "about:blank", "title": "Request Entity Too Large", "status": 413,
                    "detail": "Resource too large (message of 9 bytes)", "smqp_code": 414}


def test_a_selector_refusal_keeps_its_code_and_column():
    exc = incorrect("unexpected ')'", 7)
    assert smqp_error(exc) == b"567 Incorrect message selector (unexpected ')' at column 7)\r\n"
    fault = fault_of(exc)
    assert (fault.condition, fault.pubsub, fault.text) == (
        "bad-request", "invalid-options",
        "567 Incorrect message selector (unexpected ')' at column 7)")
    body = from_service(exc).data
    assert (body["status"], body["smqp_code"], body["column"]) == (400, 567, 7)
    fault = fault_of(unsupported("X"))
    assert (fault.condition, fault.pubsub, fault.text) == (
        "bad-request", "invalid-options", "566 Unsupported selector class")


def test_a_queue_subscription_without_options_is_configuration_required():
    exc = OptionsRequired()
    assert smqp_error(exc) == b"400 Bad request (pubsub#queue_requests required)\r\n"
    fault = fault_of(exc)
    assert (fault.condition, fault.pubsub, fault.text) == (
        "not-acceptable", "configuration-required", "")
    assert from_service(exc).status_code == 400


def test_an_iq_error_carries_the_conditions_on_the_wire():
    xml = s.iq_error("q1", "pubsub.example", "a@example/r", fault_of(conflict("locked")))
    assert "<conflict xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'" in xml.replace('"', "'")
    assert "locked" in xml


def test_a_protocol_error_is_a_bad_request_at_rest_whatever_its_code():
    assert from_service(ProtocolError(414, "Resource too large (line)")).status_code == 413
    response = from_service(ProtocolError(299, "odd"))
    assert (response.status_code, response.data["smqp_code"]) == (400, 299)


def test_a_refusal_by_code_maps_as_by_member():
    assert fault_of(ServiceError(404, "Not found (node)")).condition == "item-not-found"
    assert from_service(not_found("x")).status_code == 404
