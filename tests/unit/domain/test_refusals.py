"""The broker's refusals (broker.domain.errors.Refusal): one row per refusal with its wire
form at every door, and ServiceError carrying one (its ``code`` and ``text`` as before)."""

from __future__ import annotations

import pickle

import pytest

from broker.domain.errors import ProtocolError, Refusal
from broker.services import (
    ServiceError,
    bad_request,
    conflict,
    max_quantity,
    not_acceptable,
    not_allowed,
    not_found,
    server_error,
    too_large,
    unauthorized,
)
from broker.services.selectors import SelectorError, incorrect, unsupported

#: The SMQP codes the profiles name (SMQP-PROFILE §3 and §9.2), each with its phrase.
PROFILE_CODES = {400: "Bad request", 401: "Unauthorized", 404: "Not found",
                 405: "Not allowed", 406: "Not acceptable", 408: "Request timeout",
                 409: "Conflict", 414: "Resource too large", 500: "Server error",
                 501: "Not implemented", 510: "Maximum quantity exceeded",
                 566: "Unsupported selector class", 567: "Incorrect message selector",
                 568: "No such subscription"}


def test_every_profile_code_is_a_refusal_with_the_profiles_phrase():
    for code, phrase in PROFILE_CODES.items():
        assert Refusal.of(code).smqp == code
        assert Refusal.of(code).phrase == phrase


def test_a_code_names_its_first_row():
    assert Refusal.of(400) is Refusal.BAD_REQUEST  # not OPTIONS_REQUIRED, also a 400
    assert Refusal.OPTIONS_REQUIRED.smqp == 400


def test_a_code_no_refusal_has_is_a_value_error():
    with pytest.raises(ValueError, match="no refusal has SMQP code 299"):
        Refusal.of(299)


def test_every_row_is_its_own_member():
    # Equal rows would make aliases (Enum), one refusal answering for another.
    assert len({r.value for r in Refusal}) == len(Refusal) == len(Refusal.__members__)


def test_text_is_the_phrase_with_its_reason():
    assert Refusal.NOT_FOUND.text() == "Not found"
    assert Refusal.NOT_FOUND.text("topic") == "Not found (topic)"


def test_rest_title_and_type_follow_the_http_status():
    assert Refusal.TOO_LARGE.http == 413
    assert Refusal.TOO_LARGE.title == "Request Entity Too Large"
    assert Refusal.UNAUTHORIZED.title == "Forbidden"
    assert {r.problem_type for r in Refusal} == {"about:blank"}


def test_rest_never_answers_a_server_status():
    assert all(r.http < 500 for r in Refusal)


def test_service_error_carries_its_refusal_code_and_text():
    exc = ServiceError(Refusal.CONFLICT, "Conflict (lock not held)")
    assert exc.refusal is Refusal.CONFLICT
    assert (exc.code, exc.text) == (409, "Conflict (lock not held)")
    assert str(exc) == "409 Conflict (lock not held)"


def test_service_error_from_a_code_as_callers_before_the_enum():
    exc = ServiceError(500, "Server error (nothing was committed)")
    assert exc.refusal is Refusal.SERVER_ERROR
    assert exc.code == 500
    with pytest.raises(ValueError):
        ServiceError(299, "no such code")


def test_service_error_text_defaults_to_the_phrase():
    assert ServiceError(Refusal.NO_SUCH_SUBSCRIPTION).text == "No such subscription"


@pytest.mark.parametrize("made, code, text", [
    (bad_request("x"), 400, "Bad request (x)"),
    (unauthorized(), 401, "Unauthorized"),
    (unauthorized("no right"), 401, "Unauthorized (no right)"),
    (not_found(), 404, "Not found"),
    (not_found("topic"), 404, "Not found (topic)"),
    (not_allowed("x"), 405, "Not allowed (x)"),
    (not_acceptable("x"), 406, "Not acceptable (x)"),
    (conflict(), 409, "Conflict"),
    (conflict("x"), 409, "Conflict (x)"),
    (too_large("x"), 414, "Resource too large (x)"),
    (max_quantity("x"), 510, "Maximum quantity exceeded (x)"),
    (server_error("nothing was committed"), 500, "Server error (nothing was committed)"),
])
def test_helpers_give_the_texts_they_gave_before(made, code, text):
    assert (made.code, made.text) == (code, text)
    assert made.refusal is Refusal.of(code)


def test_service_errors_survive_pickling_from_a_storage_process():
    for exc in (conflict("x"), ServiceError(Refusal.OPTIONS_REQUIRED, "Bad request (y)")):
        back = pickle.loads(pickle.dumps(exc))
        assert (type(back), back.refusal, back.text) == (type(exc), exc.refusal, exc.text)
    selector = pickle.loads(pickle.dumps(incorrect("unexpected ')'", 7)))
    assert isinstance(selector, SelectorError)
    assert (selector.refusal, selector.text, selector.column) == (
        Refusal.INCORRECT_SELECTOR, "Incorrect message selector (unexpected ')' at column 7)", 7)


def test_selector_refusals_are_rows_of_the_enum():
    assert unsupported("X").refusal is Refusal.UNSUPPORTED_SELECTOR
    assert unsupported("X").text == "Unsupported selector class"
    assert incorrect("bad", None).refusal is Refusal.INCORRECT_SELECTOR


def test_a_protocol_error_names_its_refusal():
    assert ProtocolError(414, "Resource too large (line)").refusal is Refusal.TOO_LARGE
    assert ProtocolError().refusal is Refusal.BAD_REQUEST
