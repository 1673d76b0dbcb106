"""The example job type of your own, `extract_contact`: its input bounds, its schema and its rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.core.errors import BusinessValidationError, InputValidationError
from jobtypes.extract_contact import EXTRACT_CONTACT, emails_in, phones_in

TEXT = (
    "Hi, this is Ada Lovelace from Analytical Engines Ltd. Write to Ada@Example.org or call "
    "+44 (20) 7946-0958 (office) or 020 7946 0959; order 12345, 3 units."
)


def answer(**fields: Any) -> str:
    return json.dumps({"name": "Ada Lovelace", "email": None, "phone": None} | fields)


def test_the_text_s_addresses_and_numbers_are_found_once_each_and_quantities_are_not_numbers() -> None:
    assert emails_in(TEXT + " ada@example.org") == ["Ada@Example.org"]
    assert phones_in(TEXT) == ["+442079460958", "02079460959"]


def test_the_output_schema_offers_only_what_the_text_gives() -> None:
    job_input = EXTRACT_CONTACT.parse_input({"text": TEXT})
    schema = EXTRACT_CONTACT.output_schema(job_input)

    assert schema["properties"]["email"] == {
        "anyOf": [{"type": "string", "enum": ["Ada@Example.org"]}, {"type": "null"}]
    }
    assert schema["properties"]["phone"]["anyOf"][0]["enum"] == ["+442079460958", "02079460959"]
    nothing = EXTRACT_CONTACT.output_schema(EXTRACT_CONTACT.parse_input({"text": "Regards, Bob"}))
    assert (nothing["properties"]["email"], nothing["properties"]["phone"]) == ({"type": "null"}, {"type": "null"})


@pytest.mark.parametrize(
    "content",
    [
        answer(email="ada@example.org", phone="+442079460958"),  # an address differs from the text by case only
        answer(phone="02079460959"),
        answer(name=None),
    ],
)
def test_an_answer_with_what_the_text_gives_is_accepted(content: str) -> None:
    job_input = EXTRACT_CONTACT.parse_input({"text": TEXT})

    assert EXTRACT_CONTACT.validate_output(job_input, content).model_dump()["name"] in {"Ada Lovelace", None}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (answer(email="ada@lovelace.example"), "email 'ada@lovelace.example' is not in the text"),
        (answer(phone="+441234567890"), "phone '+441234567890' is not a number the text gives"),
    ],
)
def test_an_answer_that_makes_up_a_contact_breaks_the_business_rule(content: str, reason: str) -> None:
    job_input = EXTRACT_CONTACT.parse_input({"text": TEXT})

    with pytest.raises(BusinessValidationError) as refused:
        EXTRACT_CONTACT.validate_output(job_input, content)

    assert reason in str(refused.value)


@pytest.mark.parametrize("raw", [{"text": ""}, {"text": "x" * 20_001}, {"text": "hi", "lang": "en"}, {}])
def test_inputs_out_of_bounds_are_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(InputValidationError):
        EXTRACT_CONTACT.parse_input(raw)
