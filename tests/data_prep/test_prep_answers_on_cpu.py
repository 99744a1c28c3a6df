"""Answer matching, hint-leak detection and reply parsing used by ``variants`` and ``validate``."""

from __future__ import annotations

import json

import pytest
from prep_fixtures import png

from data_prep.answers import answers_match, hint_leak
from data_prep.generation import accept_hint, accept_paraphrases, hint_messages, parse_json_reply


@pytest.mark.parametrize(
    ("predicted", "truth", "same"),
    [
        ("12", "12", True),
        ("\\boxed{12}", "12", True),
        ("1,000", "1000", True),
        ("0.5", "\\frac{1}{2}", True),
        ("\\sqrt{27}", "3\\sqrt{3}", True),
        ("13", "12", False),
        ("", "12", False),
        ("B", "B", True),
        ("A", "B", False),
    ],
)
def test_answers_match(predicted, truth, same):
    assert answers_match(predicted, truth) is same


@pytest.mark.parametrize(
    ("step", "answer", "question", "leaks"),
    [
        ("So x = 12.", "12", "", True),
        ("There are 112 apples.", "12", "", False),
        ("The scale reads 1.25 here.", "12", "", False),
        ("Add the bar values together.", "12", "", False),
        ("Then \\boxed{?} follows.", "12", "", True),
        ("The final answer follows from this.", "7", "", True),
        ("Half of it gives y = 0.5, as required", "\\frac{1}{2}", "", True),
        ("Point B lies on the circle.", "B", "", False),
        ("So option (B) is right.", "B", "", True),
        ("The side 12 is given.", "12", "A side is 12 cm long. What is x?", False),
        ("The side is 3\\sqrt{3} long.", "3\\sqrt{3}", "", True),
    ],
)
def test_hint_leak(step, answer, question, leaks):
    assert (hint_leak(step, answer, question) is not None) is leaks


def test_parse_json_reply_accepts_fences_and_prose_never_evaluates():
    assert parse_json_reply('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_reply('Here it is: {"a": [1, 2]} hope it helps') == {"a": [1, 2]}
    for bad in ("no json here", "[1, 2]", "{'a': __import__('os')}"):
        with pytest.raises(ValueError, match="malformed output"):
            parse_json_reply(bad)


def test_accept_hint_requires_matching_answer_step_count_and_no_leak():
    steps = ["Read the two sides.", "Use the area formula.", "Multiply carefully."]
    assert accept_hint(json.dumps({"steps": steps, "final_answer": "12"}), "Area?", "12") == (steps, [])
    for reply, reason in [
        ({"steps": steps, "final_answer": "13"}, "wrong final answer"),
        ({"steps": steps[:2], "final_answer": "12"}, "wrong number of steps"),
        ({"steps": steps * 2, "final_answer": "12"}, "wrong number of steps"),
        ({"steps": [*steps[:2], "which gives 12"], "final_answer": "12"}, "hint leaks the answer"),
        ({"steps": "one long string", "final_answer": "12"}, "malformed output"),
    ]:
        accepted, rejects = accept_hint(json.dumps(reply), "Area?", "12")
        assert accepted is None and rejects[0]["reason"].startswith(reason)


def test_accept_paraphrases_keeps_numbers_and_drops_duplicates():
    question = "A rectangle is 3 by 4. What is its area?"
    reply = json.dumps(
        {
            "paraphrases": [
                "What is the area of a 3 by 4 rectangle?",
                "What is the area of a 3 by 4 rectangle?",
                "A rectangle is 3 by 5. What is its area?",
                question,
                "Find the area of the rectangle measuring 3 by 4 (it is 12).",
                "<image>Find the area of a rectangle with sides 3 and 4.",
            ]
        }
    )
    accepted, rejects = accept_paraphrases(reply, question, "12", wanted=2)
    assert accepted == ["What is the area of a 3 by 4 rectangle?", "Find the area of a rectangle with sides 3 and 4."]
    assert [r["reason"].split(":")[0] for r in rejects] == [
        "paraphrase repeats the question or another paraphrase",
        "paraphrase changes the numbers",
        "paraphrase repeats the question or another paraphrase",
        "paraphrase changes the numbers",
    ]


def test_hint_messages_send_images_as_data_urls():
    content = hint_messages("Area?", [png(1)])[1]["content"]
    assert content[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert content[-1]["type"] == "text" and "Area?" in content[-1]["text"]
    assert isinstance(hint_messages("Area?", [png(1)], text_only=True)[1]["content"], str)
