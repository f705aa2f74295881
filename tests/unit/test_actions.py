"""The action grammar: parsing, locating the action in model output, round trips, refusals."""
from __future__ import annotations

import pickle
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consolerl.errors import ConsoleRLError
from env_workers.actions import (
    ACTION_HELP, ACTION_TYPES, MAX_ACTION_CHARS, MAX_OUTPUT_CHARS, MODIFIER_KEYS, NAMED_KEYS,
    Action, ActionError, Click, Fill, GoBack, Goto, InvalidActionError, Press, RefusedURLError,
    ReportInfeasible, Scroll, Select, Stop, host_allowed, parse_action)

FENCE = "```"


@pytest.mark.parametrize("text,expected", [
    # every kind, bids bare / quoted / digits-only
    ("click(a12)", Click("a12")),
    ('click("a12")', Click("a12")),
    ("click('b3')", Click("b3")),
    ("click(17)", Click("17")),
    ("click( a-1_x )", Click("a-1_x")),
    ('fill(b3, "hello world")', Fill("b3", "hello world")),
    ("fill('b3', 'it\\'s')", Fill("b3", "it's")),
    ('fill(b3, "a\\"b\\\\c\\nd\\te")', Fill("b3", 'a"b\\c\nd\te')),
    ('fill(b3, "")', Fill("b3", "")),
    ('fill(b3, "你好, (x)")', Fill("b3", "你好, (x)")),
    ('select(s1, "cn-hangzhou")', Select("s1", "cn-hangzhou")),
    ('press("Enter")', Press("Enter")),
    ("press('Control+a')", Press("Control+a")),
    ('press("Shift+Tab")', Press("Shift+Tab")),
    ('press("Control+Shift+ArrowLeft")', Press("Control+Shift+ArrowLeft")),
    ('scroll("down")', Scroll("down")),
    ("scroll('up')", Scroll("up")),
    ('goto("https://ecs.console.aliyun.com/server?region=cn-hangzhou#/list")',
     Goto("https://ecs.console.aliyun.com/server?region=cn-hangzhou#/list")),
    ('goto("http://127.0.0.1:18080/")', Goto("http://127.0.0.1:18080/")),
    ("go_back()", GoBack()),
    ("go_back( )", GoBack()),
    ('stop("vpc-123")', Stop("vpc-123")),
    ('stop("")', Stop("")),
    ('report_infeasible("no permission to create VPCs")',
     ReportInfeasible("no permission to create VPCs")),
    # where the action is found
    ("The Create button has bid a12.\nclick(a12)", Click("a12")),
    ("I will click it.\n  click(a12)  \nThat should open the form.", Click("a12")),
    ("click(a1)\nThat failed before, so instead:\nclick(a2)", Click("a2")),
    ("Thinking...\nAction: click(a12)", Click("a12")),
    ("Action:click(a12)", Click("a12")),
    ("click(a12)\r\n", Click("a12")),
    (f"Reasoning.\n{FENCE}\nclick(a12)\n{FENCE}", Click("a12")),
    (f"{FENCE}python\n\nAction: fill(b3, \"x\")\n\n{FENCE}\nDone.", Fill("b3", "x")),
    (f"{FENCE}click(a12){FENCE}", Click("a12")),
    (f"{FENCE}\nclick(a1)\n{FENCE}\nthat failed, so:\n{FENCE}\nclick(a2)\n{FENCE}", Click("a2")),
    (f"Earlier:\n{FENCE}html\n<a href=x>(</a>\n{FENCE}\nclick(a2)", Click("a2")),
    (f"click(a1)\n{FENCE}\nclick(a2)\n{FENCE}", Click("a2")),
    ("I would click(a9) but first:\nscroll(\"down\")", Scroll("down")),
])
def test_parses(text: str, expected: Action) -> None:
    assert parse_action(text) == expected


@pytest.mark.parametrize("text,fragment", [
    ("", "no action found"),
    ("I am not sure what to do.", "no action found"),
    ("tap(a12)", "unknown action 'tap'"),
    ("Click(a12)", "unknown action 'Click'"),
    ("__import__('os')", "unknown action '__import__'"),
    ("Action: open the menu", "unknown action 'open'"),
    (f"{FENCE}\nos.system('ls')\n{FENCE}", "unknown action 'os'"),
    ("click(a12", "missing closing parenthesis"),
    ("click a12)", "no action found"),
    ("Action: click a12", "expected '(' after click"),
    ("click(a12, a13)", "expected 1 argument, got 2"),
    ('fill(b3, "x", "y")', "expected 2 arguments, got 3"),
    ("fill(b3)", "expected 2 arguments, got 1"),
    ("go_back(a1)", "expected 0 arguments, got 1"),
    ("click()", "expected 1 argument, got 0"),
    ("click(a12,)", "expected an argument"),
    ("click(,a12)", "expected an argument"),
    ('fill(b3, "abc)', "unterminated string"),
    ("fill(b3, 'abc\\')", "unterminated string"),
    ('fill(b3, "a\\qb")', "unknown escape \\q"),
    ('fill(b3, "a\\x41")', "unknown escape \\x"),
    ('fill(b3, "a\\u0041")', "unknown escape \\u"),
    ('fill(b3, "' + "x" * 2001 + '")', "text is 2,001 characters, at most 2,000"),
    ('select(s1, "' + "x" * 501 + '")', "option is 501 characters"),
    ('select(s1, "")', "option must not be empty"),
    ('stop("' + "x" * 2001 + '")', "answer is 2,001 characters"),
    ('report_infeasible("' + "x" * 2001 + '")', "reason is 2,001 characters"),
    ('report_infeasible("")', "reason must not be empty"),
    ('goto("https://a.example/' + "x" * 2048 + '")', "url is 2,"),
    ('fill(b3, "' + "x" * 9000 + '")', "action line is 9,"),
    ('fill(b3, "a\x00b")', "control character U+0000"),
    ('fill(b3, "a\x1bb")', "control character U+001B"),
    ('fill(b3, "a\rb")', "control character U+000D"),
    ("click(a\x7f12)", "control character U+007F"),
    ("click(a12); import os", "unexpected text after the closing parenthesis: '; import os'"),
    ("click(a12) click(a13)", "unexpected text after the closing parenthesis"),
    ("click(a12) # the button", "unexpected text after the closing parenthesis"),
    ("click(click(a12))", "nested calls are not allowed"),
    ("stop(str(1))", "nested calls are not allowed"),
    ('click(a12 + "x")', "expected ',' or ')'"),
    ("click(ä12)", "bid 'ä12' must be 1-16 characters"),
    ("click(a١٢)", "bid"),                        # Arabic-Indic digits are not ASCII digits
    ("click(abcdefghijklmnopq)", "bid 'abcdefghijklmnopq' must be 1-16"),
    ('click("")', "bid '' must be"),
    ("click(a.b)", "bid 'a.b'"),
    ("press(Enter)", "key must be a quoted string"),
    ('press("enter")', "key 'enter' is not allowed"),
    ('press("F5")', "key 'F5' is not allowed"),
    ('press("a")', "key 'a' is not allowed"),
    ('press("Control+Control+a")', "not allowed"),
    ('press("Hyper+a")', "not allowed"),
    ('press("Control+")', "not allowed"),
    ('scroll("left")', "direction 'left' is not allowed"),
    ('scroll("Down")', "direction 'Down' is not allowed"),
    ("scroll(down)", "direction must be a quoted string"),
    ('goto("javascript:alert(1)")', "only http:// and https:// URLs are allowed, not 'javascript:'"),
    ('goto("JavaScript:alert(1)")', "not 'javascript:'"),
    ('goto("file:///etc/passwd")', "not 'file:'"),
    ('goto("data:text/html,hi")', "not 'data:'"),
    ('goto("ecs.console.aliyun.com")', "only http:// and https://"),
    ('goto("http:example.com")', "has no host"),
    ('goto("http://allowed@evil.example/")', "user credentials"),
    ('goto("http://a b.example/")', "spaces or backslashes"),
    ('goto("http://evil.example\\\\@allowed/")', "spaces or backslashes"),
    ('goto("http://host:99999/")', "is not a valid URL"),
    ('goto("http://[::1/")', "is not a valid URL"),
    ('goto("")', "url must not be empty"),
    (f"Reasoning.\n{FENCE}\nclick(a12)", "code block opened on line 2 is not closed"),
    (f"{FENCE}\n\n{FENCE}", "last code block is empty"),
    (f"{FENCE}\nclick(a1)\nclick(a2)\n{FENCE}", "last code block has 2 lines"),
    (f"click(a1)\n{FENCE}\nimport os\n{FENCE}", "unknown action 'import'"),
    ("x" * (MAX_OUTPUT_CHARS + 1), f"is {MAX_OUTPUT_CHARS + 1:,} characters, more than "
                                   f"{MAX_OUTPUT_CHARS:,}"),
])
def test_refuses(text: str, fragment: str) -> None:
    result = parse_action(text)
    assert isinstance(result, ActionError), result
    assert fragment in result.message
    assert str(result) == result.message


def test_a_reply_over_the_output_cap_is_refused_whatever_it_holds() -> None:
    """The cap is on the whole reply, looked at before anything else, and sized to replies
    (max_new_tokens is at most 512): a reply of reasoning plus a valid action just over it is
    refused, naming its size and the limit; one just under it parses."""
    assert MAX_OUTPUT_CHARS <= 16_384
    action = 'fill(b3, "' + "\\n" * 2_000 + '")'     # the longest valid action
    assert len(action) < MAX_ACTION_CHARS and parse_action(action) == Fill("b3", "\n" * 2_000)
    fits = "x" * (MAX_OUTPUT_CHARS - len(action) - 1) + "\n" + action
    assert len(fits) == MAX_OUTPUT_CHARS and parse_action(fits) == Fill("b3", "\n" * 2_000)
    over = "x" + fits
    result = parse_action(over)
    assert isinstance(result, ActionError)
    assert f"the output is {MAX_OUTPUT_CHARS + 1:,} characters, more than " \
           f"{MAX_OUTPUT_CHARS:,}" in result.message


@pytest.mark.parametrize("text,url", [
    ('goto("javascript:alert(1)")', "javascript:alert(1)"),
    ('goto("file:///etc/passwd")', "file:///etc/passwd"),
    ('goto("data:text/html,hi")', "data:text/html,hi"),
    ('goto("http://allowed@evil.example/")', "http://allowed@evil.example/"),
    ('goto("http:example.com")', "http:example.com"),
    ('goto("http://evil.example\\\\@allowed/")', "http://evil.example\\@allowed/"),
])
def test_a_goto_refused_for_where_it_points_carries_the_url(text: str, url: str) -> None:
    """The worker counts these as blocked navigations, as it does a goto to another host."""
    result = parse_action(text)
    assert isinstance(result, ActionError) and result.refused_url == url
    with pytest.raises(RefusedURLError) as raised:
        Goto(url)
    assert raised.value.url == url and isinstance(raised.value, InvalidActionError)
    again = pickle.loads(pickle.dumps(raised.value))
    assert (type(again), str(again), again.url) == (RefusedURLError, str(raised.value), url)


@pytest.mark.parametrize("text", [
    'goto("")', 'goto("http://a.example/' + "x" * 2048 + '")', 'goto("http://a\x01")',
    'fill(b3, "javascript:alert(1)")', "goto(javascript:alert(1))", "click(a1)",
])
def test_other_errors_carry_no_refused_url(text: str) -> None:
    result = parse_action(text)
    assert not isinstance(result, ActionError) or result.refused_url == ""


def test_error_names_allowed_forms() -> None:
    for text in ("tap(a1)", "nothing here"):
        message = parse_action(text).message   # type: ignore[union-attr]
        assert all(cls.name in message for cls in ACTION_TYPES)
    assert "usage: fill(bid, \"text\")" in parse_action("fill(b3)").message  # type: ignore[union-attr]


def test_not_text_is_an_error_value() -> None:
    assert isinstance(parse_action(None), ActionError)   # type: ignore[arg-type]
    assert isinstance(parse_action(b"click(a1)"), ActionError)   # type: ignore[arg-type]


def test_constructors_validate() -> None:
    with pytest.raises(InvalidActionError, match="bid"):
        Click("a 1")
    with pytest.raises(ValueError, match="only http"):
        Goto("file:///etc/passwd")
    with pytest.raises(ConsoleRLError, match="key"):
        Press("Win+r")
    with pytest.raises(InvalidActionError, match="text must be a string"):
        Fill("a1", 3)   # type: ignore[arg-type]
    with pytest.raises(InvalidActionError, match=r"control character U\+0007"):
        Stop("bell\x07")


def test_canonical_text() -> None:
    assert Click("a12").to_text() == "click(a12)"
    assert Fill("b3", 'say "hi"\n\tbye\\').to_text() == 'fill(b3, "say \\"hi\\"\\n\\tbye\\\\")'
    assert GoBack().to_text() == "go_back()"
    assert Press("Control+a").to_text() == 'press("Control+a")'


def test_help_mentions_every_action() -> None:
    assert all(f"{cls.name}(" in ACTION_HELP for cls in ACTION_TYPES)
    # The examples in the help are themselves valid actions.
    for example in ('click(a12)', 'scroll("down")', 'go_back()', 'goto("https://host/path")'):
        assert isinstance(parse_action(example), Action)


@pytest.mark.parametrize("action", [
    Click("a1"), Fill("b2", "x\ny"), Select("c3", "opt"), Press("Enter"), Scroll("up"),
    Goto("https://example.com/"), GoBack(), Stop("42"), ReportInfeasible("blocked"),
    ActionError("bad"),
], ids=lambda a: type(a).__name__)
def test_pickle_round_trip(action: object) -> None:
    copy = pickle.loads(pickle.dumps(action))
    assert copy == action and type(copy) is type(action)


def test_every_action_type_is_covered() -> None:
    assert {cls.name for cls in ACTION_TYPES} == {
        "click", "fill", "select", "press", "scroll", "goto", "go_back", "stop",
        "report_infeasible"}


def test_invalid_action_error_pickles() -> None:
    err = pickle.loads(pickle.dumps(InvalidActionError("click: bad")))
    assert isinstance(err, InvalidActionError) and str(err) == "click: bad"


# -- properties ------------------------------------------------------------------------------------

_value_chars = st.characters(exclude_categories=("Cc", "Cs")) | st.sampled_from("\n\t\"'\\,()")
bids = st.from_regex(r"[A-Za-z0-9_-]{1,16}", fullmatch=True)
keys = st.builds(
    lambda mods, key: "+".join([*mods, key]),
    st.lists(st.sampled_from(MODIFIER_KEYS), unique=True, max_size=2),
    st.sampled_from(NAMED_KEYS)) | st.builds(
    lambda mod, ch: f"{mod}+{ch}", st.sampled_from(MODIFIER_KEYS),
    st.sampled_from("azAZ09"))
urls = st.builds(
    lambda scheme, host, port, path: f"{scheme}://{host}{port}/{path}",
    st.sampled_from(["http", "https"]),
    st.from_regex(r"[a-z0-9-]{1,20}(\.[a-z0-9-]{1,10}){0,3}", fullmatch=True)
    | st.just("127.0.0.1") | st.just("[::1]"),
    st.sampled_from(["", ":8080", ":443"]),
    st.text(st.characters(exclude_categories=("Cc", "Cs", "Zs", "Zl", "Zp"),
                          exclude_characters="\\"), max_size=60))
actions = st.one_of(
    st.builds(Click, bids),
    st.builds(Fill, bids, st.text(_value_chars, max_size=2000)),
    st.builds(Select, bids, st.text(_value_chars, min_size=1, max_size=500)),
    st.builds(Press, keys),
    st.builds(Scroll, st.sampled_from(["up", "down"])),
    st.builds(Goto, urls),
    st.just(GoBack()),
    st.builds(Stop, st.text(_value_chars, max_size=2000)),
    st.builds(ReportInfeasible, st.text(_value_chars, min_size=1, max_size=2000)),
)


@settings(max_examples=300, deadline=None)
@given(actions, st.sampled_from(["{}", "Reasoning first.\n{}\nDone.", "Action: {}",
                                 FENCE + "\n{}\n" + FENCE]))
def test_round_trip(action: Action, template: str) -> None:
    assert parse_action(action.to_text()) == action
    assert parse_action(template.format(action.to_text())) == action


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_fuzz_arbitrary_text_never_raises(text: str) -> None:
    assert isinstance(parse_action(text), (Action, ActionError))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ACTION_TYPES), st.text(st.sampled_from("aZ09_-\"'\\(),. \t\n\x00é`:+"),
                                               max_size=40))
def test_fuzz_near_actions_never_raise(cls: type[Action], tail: str) -> None:
    result = parse_action(f"{cls.name}({tail}")
    assert isinstance(result, (Action, ActionError))
    if isinstance(result, Action):   # whatever parsed is valid and canonical
        assert parse_action(result.to_text()) == result


@pytest.mark.parametrize("text", [
    "(" * MAX_OUTPUT_CHARS,
    "\n" * MAX_OUTPUT_CHARS,
    "click(a1)\n" * (MAX_OUTPUT_CHARS // 10),
    'fill(b3, "' + "\\n" * (MAX_OUTPUT_CHARS // 2 - 10),
    "a" * (MAX_OUTPUT_CHARS - 1) + "(",
    (FENCE + "\n") * (MAX_OUTPUT_CHARS // 4),
    " " * (MAX_OUTPUT_CHARS - 20) + "click(a1)",
    "x" * 10 * MAX_OUTPUT_CHARS,
])
def test_long_outputs_are_fast(text: str) -> None:
    start = time.perf_counter()
    result = parse_action(text)
    assert time.perf_counter() - start < 0.5
    assert isinstance(result, (Action, ActionError))


# -- host_allowed ----------------------------------------------------------------------------------

ALLOWED = ("ecs.console.aliyun.com", "127.0.0.1:18080", "[::1]:8443", "Console.Local")


@pytest.mark.parametrize("url,ok", [
    ("https://ecs.console.aliyun.com/server", True),
    ("https://ECS.Console.Aliyun.COM/", True),
    ("http://ecs.console.aliyun.com/", True),
    ("https://ecs.console.aliyun.com:443/", True),
    ("http://ecs.console.aliyun.com:80/", True),
    ("https://ecs.console.aliyun.com:8443/", False),     # an entry without port: default only
    ("http://127.0.0.1:18080/console", True),
    ("http://127.0.0.1/", False),
    ("http://127.0.0.1:18081/", False),
    ("https://[::1]:8443/", True),
    ("https://[0:0:0:0:0:0:0:1]:8443/", True),          # IPs compare by value
    ("http://console.local/", True),
    ("http://evil.example/", False),
    ("http://ecs.console.aliyun.com.evil.example/", False),
    ("http://evil.ecs.console.aliyun.com/", False),      # no subdomains
    ("http://ecs.console.aliyun.com@evil.example/", False),
    ("http://evil.example@ecs.console.aliyun.com/", False),   # credentials refused outright
    ("http://ecs.console.aliyun.com\\@evil.example/", False),
    ("http://ecs.console.aliyun.com%2eevil.example/", False),
    ("http://ecs.console.aliyun.com./", False),
    ("http://\u212Aonsole.local/", False),               # KELVIN SIGN lower-cases to 'k'
    ("http://ecs.console.aliyun.com:99999/", False),
    ("javascript://ecs.console.aliyun.com/%0aalert(1)", False),
    ("file://ecs.console.aliyun.com/etc/passwd", False),
    ("//ecs.console.aliyun.com/", False),
    ("http:ecs.console.aliyun.com", False),
    ("http://ecs.console.aliyun.com#@evil.example", True),   # '@' in the fragment is harmless
    ("", False),
])
def test_host_allowed(url: str, ok: bool) -> None:
    assert host_allowed(url, ALLOWED) is ok


def test_host_allowed_ignores_malformed_entries() -> None:
    assert not host_allowed("http://a.example/", [])
    assert not host_allowed("http://a.example/", ["a.example/path", "x@a.example", "",
                                                  "a.example:notaport"])
    assert host_allowed("http://a.example/", ("bad entry", "a.example"))


def test_bids_copied_with_their_brackets_from_the_observation():
    assert parse_action("click([17])") == Click("17")
    assert parse_action('fill([3], "x")') == Fill("3", "x")
    assert isinstance(parse_action("click([17)"), ActionError)
    assert isinstance(parse_action("click([])"), ActionError)
