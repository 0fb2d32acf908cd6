"""The JSONC editor behind `shoal connect opencode|claude --write`: one key's text
changes, every other byte of the file (comments, trailing commas, layout) stays."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.connect_jsonc import JsoncError, NotAnObject, loads, merge, remove, set_value

FILE = """\
{
  // line comment
  "a": 1, /* after a */
  "url": "http://x/*not a comment*/ // nor this",
  "nested": {
    "b": [1, 2,], // trailing comma in a list
  },
}
"""


def test_it_reads_comments_and_trailing_commas_but_not_inside_strings():
    assert loads(FILE) == {"a": 1, "url": "http://x/*not a comment*/ // nor this",
                           "nested": {"b": [1, 2]}}


def test_setting_a_value_there_changes_only_that_value():
    assert set_value(FILE, ["a"], 2) == FILE.replace('"a": 1,', '"a": 2,')
    assert set_value(FILE, ["nested", "b"], "x") == FILE.replace("[1, 2,]", '"x"')
    assert set_value(FILE, ["a"], 1) == FILE  # the same value: not even reformatted


def test_a_new_key_goes_last_after_the_comment_that_ends_the_line_keeping_trailing_commas():
    out = set_value(FILE, ["nested", "c"], {"d": True})
    assert out == FILE.replace(
        "    \"b\": [1, 2,], // trailing comma in a list\n",
        "    \"b\": [1, 2,], // trailing comma in a list\n"
        "    \"c\": {\n      \"d\": true\n    },\n")
    assert loads(out)["nested"] == {"b": [1, 2], "c": {"d": True}}


def test_strict_json_stays_strict_json():
    text = '{\n    "theme": "dark",\n    "env": {\n        "A": "1"\n    }\n}\n'
    out = merge(text, [], {"env": {"B": "2"}, "helper": "x"})
    assert json.loads(out) == {"theme": "dark", "env": {"A": "1", "B": "2"}, "helper": "x"}
    assert out == ('{\n    "theme": "dark",\n    "env": {\n        "A": "1",\n'
                   '        "B": "2"\n    },\n    "helper": "x"\n}\n')
    assert json.loads(remove(out, ["env", "B"])) == json.loads(text) | {"helper": "x"}
    assert remove(remove(out, ["helper"]), ["env", "B"]) == text


@pytest.mark.parametrize(("text", "expected"), [
    ("{}", '{\n  "k": {\n    "v": 1\n  }\n}'),
    ('{"a": 1}', '{"a": 1, "k": {"v": 1}}'),
    ('{"a": 1,}', '{"a": 1, "k": {"v": 1},}'),
    ('{\n\t"a": {}\n}\n', '{\n\t"a": {},\n\t"k": {\n\t\t"v": 1\n\t}\n}\n'),
    ('{\r\n  "a": 1\r\n}\r\n', '{\r\n  "a": 1,\r\n  "k": {\r\n    "v": 1\r\n  }\r\n}\r\n'),
    ("// only a comment\n{}\n", '// only a comment\n{\n  "k": {\n    "v": 1\n  }\n}\n'),
])
def test_a_new_key_is_laid_out_like_the_file(text, expected):
    assert set_value(text, ["k"], {"v": 1}) == expected


def test_removing_a_key_takes_its_line_and_the_comma_it_no_longer_needs():
    text = '{\n  "a": 1, // keep me\n  "b": 2\n}\n'
    assert remove(text, ["b"]) == '{\n  "a": 1 // keep me\n}\n'
    assert remove(text, ["a"]) == '{\n  "b": 2\n}\n'
    assert remove(text, ["zzz"]) == text and remove(text, ["a", "x"]) == text
    assert loads(remove('{"a": 1, "a": 2, "b": 3}', ["a"])) == {"b": 3}  # every copy


def test_a_value_that_is_not_an_object_is_not_replaced_by_one():
    with pytest.raises(NotAnObject, match="env is \"all\", not an object"):
        merge('{"env": "all"}', [], {"env": {"A": "1"}})
    with pytest.raises(NotAnObject, match="the top level"):
        set_value("[1]", ["a"], 1)


@pytest.mark.parametrize(("text", "where"), [
    ("", "empty"), ("{", "line 1, column 2"), ('{"a": 1 "b": 2}', "line 1, column 9"),
    ("{\n  /* open", "line 2, column 3"), ('{"a": tru}', "line 1, column 7"),
    ("{} {}", "more text"), ('{"a": "\n"}', "control character"), ("{'a': 1}", "key"),
    ("[" * 100_000, "nested more than"),  # an error, not a RecursionError
])
def test_broken_text_says_where(text, where):
    with pytest.raises(JsoncError, match=where):
        loads(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                               max_size=3), max_leaves=8)
objects = st.dictionaries(st.text(max_size=4), json_values, max_size=4)


def deep_merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) \
            else v
    return out


@settings(max_examples=200, deadline=None)
@given(objects, objects, st.sampled_from([None, 2, "\t"]),
       st.sampled_from(["", "// c\n", "/* c */"]))
def test_merging_gives_the_merged_value_whatever_the_layout(user, ours, indent, comment):
    text = comment + json.dumps(user, indent=indent) + "\n"
    ours = {k: v for k, v in ours.items()  # a value of the user's that isn't an object
            if not (isinstance(v, dict) and k in user and not isinstance(user[k], dict))}
    out = merge(text, [], ours)
    assert loads(out) == deep_merge(user, ours)
    assert out.startswith(comment)
    if not comment:
        assert json.loads(out) == deep_merge(user, ours)  # JSON in, JSON out
