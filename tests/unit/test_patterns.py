"""Users' regular expressions (consolerl.patterns): RE2, linear time, a size limit, and a
refusal that names the field and says why."""
from __future__ import annotations

import pickle
import re
import time

import pytest

from consolerl.patterns import MAX_CHARS, PatternError, compile_pattern, fullmatch, search


def test_what_re_backtracks_on_runs_in_linear_time():
    # ^(?:.|.){0,22}! takes about 1.5 s in Python's re on a 40-character id, 4x per two more
    # repetitions; RE2 never backtracks.
    started = time.perf_counter()
    for n in (22, 31, 200):
        pattern = compile_pattern(f"^(?:.|.){{0,{n}}}!", "f")
        assert not search(pattern, "x" * 40)
        assert not search(pattern, "y" * 10_000)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("pattern,why", [
    (r"(a)\1", "backreferences"), (r"(?P<p>a)(?P=p)", "backreferences"),
    ("a(?=b)", "lookaround"), ("(?<!a)b", "lookaround"), ("(?!a)", "lookaround"),
    ("(?<=a)b", "lookaround"), (r"a\Z", r"\z"), ("(?x) a", "flags"),
    (r"\pL{1000}", "too large"), ("a{1001}", "repetition size"), ("(", "missing )"),
    ("x" * (MAX_CHARS + 1), f"at most {MAX_CHARS}"), ("\ud800", "surrogate")])
def test_refusals_name_the_field_and_say_why(pattern, why):
    with pytest.raises(PatternError) as caught:
        compile_pattern(pattern, "tasks.id_regex")
    assert str(caught.value).startswith("tasks.id_regex: ") and why in str(caught.value)
    assert isinstance(caught.value, ValueError)
    again = pickle.loads(pickle.dumps(caught.value))
    assert type(again) is PatternError and str(again) == str(caught.value)


def test_the_patterns_users_write_mean_what_they_do_in_re():
    ids = ["ram-create-user-0", "ram-create-user-1", "ecs-add-rule-0", "ECS-x", "vpc-ä-1"]
    for pattern in ("^ram-", r"-\d$", "(?i)^ecs", r"^\w+-\w+-\w+-0$", "user-[01]|rule",
                    "^(?:ram|ecs)-", "ä", r"^[a-z]{3}-", "1$"):
        compiled = compile_pattern(pattern, "f")
        assert [i for i in ids if search(compiled, i)] == \
            [i for i in ids if re.search(pattern, i)], pattern
    assert fullmatch(compile_pattern("(?i)tcp", "f"), "TCP")
    assert not fullmatch(compile_pattern("(?i)tcp", "f"), "tcp/22")
    # A lone surrogate in the text (JSON allows one) is no match, not an encoding error.
    assert not fullmatch(compile_pattern("tcp", "f"), "tcp\ud800")
    assert search(compile_pattern("tcp", "f"), "\ud800tcp")
