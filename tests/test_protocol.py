"""Action protocols: parsing is total (never raises on any input) and says what went wrong."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capo_envs.core.protocol import Action, TagProtocol, ToolCallProtocol, ToolSpec, clean_text, make_protocol

TOOLS = (ToolSpec("search", "query", "search"), ToolSpec("answer", "answer", "answer"))
TAGS = TagProtocol(TOOLS)
CALLS = ToolCallProtocol(TOOLS)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<search>capital of France</search>", Action("search", {"query": "capital of France"})),
        ("I should look this up.\n<search> Paris </search>", Action("search", {"query": "Paris"})),
        ("<think>maybe <answer>x</answer>?</think><answer>Paris</answer>", Action("answer", {"answer": "Paris"})),
        ("<answer>Zoë Ñandú 中文 🚀</answer>", Action("answer", {"answer": "Zoë Ñandú 中文 🚀"})),
        ("</answer> stray close, then <search>q</search>", Action("search", {"query": "q"})),
        ("<search>a\x00b\x07c</search>", Action("search", {"query": "abc"})),
    ],
)
def test_tags_parse_valid(text, expected):
    result = TAGS.parse(text)
    assert result.valid and result.error is None
    assert result.action == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "no action found"),
        ("The answer is Paris.", "no action found"),
        ("<search>unclosed", "never closed"),
        ("<search>a <answer>b</answer></search>", "nested"),
        ("<search>a</answer>", "closed by"),
        ("<search>a</search><search>b</search>", "exactly one"),
        ("<search>   </search>", "non-empty"),
        ("<search>\x00\x01</search>", "non-empty"),
        ("<search>" + "q" * 5000 + "</search>", "limit"),
        ("x" * 100_000, "limit"),
        (None, "must be a str"),
        (42, "must be a str"),
        (b"<search>q</search>", "must be a str"),
    ],
)
def test_tags_parse_invalid(text, fragment):
    result = TAGS.parse(text)
    assert not result.valid and result.action is None
    assert fragment in result.error


def test_round_trip_render_parse():
    for protocol in (TAGS, CALLS):
        for action in (Action("search", {"query": 'q "quoted" \\ ü'}), Action("answer", {"answer": "1987"})):
            assert protocol.parse(protocol.render(action)).action == action


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>["search"]</tool_call>', "JSON object"),
        ('<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>', "unknown tool"),
        ('<tool_call>{"name": "answer", "arguments": {"answer": "x"}}</tool_call>', "unknown tool"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', 'needs the argument "query"'),
        ('<tool_call>{"name": "search", "arguments": {"query": 3}}</tool_call>', "must be a string"),
        ('<tool_call>{"name": "search", "arguments": 7}</tool_call>', "must be a JSON object"),
        ("<tool_call>" + "[" * 50_000 + "</tool_call>", "limit"),
        ("<tool_call>" + "[" * 10_000 + "</tool_call>", "JSON"),
    ],
)
def test_tool_call_invalid(text, fragment):
    result = CALLS.parse(text)
    assert not result.valid
    assert fragment in result.error


def test_tool_call_accepts_double_encoded_arguments():
    text = "<tool_call>" + json.dumps({"name": "search", "arguments": json.dumps({"query": "x"})}) + "</tool_call>"
    assert CALLS.parse(text).action == Action("search", {"query": "x"})


def test_stop_strings_end_every_rendered_action():
    for protocol in (TAGS, CALLS):
        for action in (Action("search", {"query": "q"}), Action("answer", {"answer": "a"})):
            text = protocol.render(action)
            assert any(text.endswith(stop) for stop in protocol.stop_strings)


def test_describe_is_plain_data():
    described = TAGS.describe()
    assert json.loads(json.dumps(described)) == described
    assert described["stop_strings"] == ["</search>", "</answer>"]
    assert "<search>query</search>" in described["instructions"]


def test_feedback_explains_the_format():
    feedback = TAGS.feedback(TAGS.parse("hello").error)
    assert feedback.startswith("Invalid action: no action found")
    assert "<search>query</search>" in feedback and "<answer>answer</answer>" in feedback


def test_make_protocol_rejects_unknown_format():
    with pytest.raises(ValueError, match="unknown action format"):
        make_protocol("xml", TOOLS)


def test_clean_text_keeps_newlines_and_drops_controls():
    assert clean_text("  a\tb\nc\x1b[31m\x7f ") == "a\tb\nc[31m"


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="<>/searchanswertool_cl{}\":, ")))
def test_parse_is_total(text):
    for protocol in (TAGS, CALLS):
        result = protocol.parse(text)
        assert result.valid != (result.error is not None)
        if result.valid:
            (value,) = result.action.args.values()
            assert value and value == value.strip()
