"""The observation text from an accessibility snapshot: bids, compaction, determinism."""
from __future__ import annotations

from env_workers.driver import find_bid, find_in_row
from env_workers.observation import approx_tokens, render_snapshot

SNAPSHOT = """\
- generic [active] [ref=f2e1]:
  - banner [ref=f2e3]:
    - button "Products" [ref=f2e4] [cursor=pointer]: Products
    - generic [ref=f2e9]: Region
    - combobox "Region" [ref=f2e10]:
      - option "China (Hangzhou)" [selected]
      - option "Singapore"
  - main [ref=f2e25]:
    - heading "Users" [level=1] [ref=f2e34]
    - generic [aria-hidden] [ref=f2e6]: "[ ]"
    - link "Create User" [ref=f2e40] [cursor=pointer]:
      - /url: /console/ram/users/create
    - table "Users" [ref=f2e47]:
      - caption [ref=f2e48]: Users
      - rowgroup [ref=f2e49]:
        - row [ref=f2e50]:
          - columnheader "Logon Name" [ref=f2e51]
          - columnheader "Actions" [ref=f2e57]
      - rowgroup [ref=f2e58]:
        - row [ref=f2e59]:
          - cell "ops Ops Team" [ref=f2e60]:
            - link "ops" [ref=f2e61] [cursor=pointer]:
              - /url: /console/ram/users/ops
            - generic [ref=f2e62]: Ops Team
          - cell [ref=f2e71]:
            - button "Start" [disabled] [ref=f2e73]
            - button "Delete" [ref=f2e74] [cursor=pointer]
    - textbox "Logon Name" [ref=f2e80]: typed value
    - radio "AdministratorAccess" [checked] [ref=f2e81]
    - button "Save" [disabled] [ref=f2e82]
"""


def test_render_gives_bids_to_enabled_controls_in_document_order():
    r = render_snapshot(SNAPSHOT)
    assert r.bids == {"1": "f2e4", "2": "f2e10", "3": "f2e40", "4": "f2e61", "5": "f2e74",
                      "6": "f2e80", "7": "f2e81"}
    # Unnamed landmarks and wrappers are flattened; a label repeated by its control is dropped.
    assert r.text.splitlines() == [
        '[1] button "Products"',
        '[2] combobox "Region": China (Hangzhou)* | Singapore',
        "# Users",
        '[3] link "Create User"',
        'table "Users":',
        " - Logon Name | Actions",
        " - [4]ops Ops Team | [5]Delete",
        '[6] textbox "Logon Name": typed value',
        '[7] radio "AdministratorAccess" (checked)',
        'button "Save" (disabled)',
    ]


def test_render_is_deterministic_and_drops_noise():
    first, second = render_snapshot(SNAPSHOT), render_snapshot(SNAPSHOT)
    assert first == second
    for noise in ("/url", "cursor", "ref=", "[ ]", "caption"):
        assert noise not in first.text
    assert approx_tokens(first.text) < len(SNAPSHOT) // 8


def test_malformed_or_empty_snapshots_do_not_raise():
    assert render_snapshot("").text == ""
    assert render_snapshot("- : : [\n  -").bids == {}
    assert render_snapshot("just text").text == "just text"


def test_driver_lookups():
    text = render_snapshot(SNAPSHOT).text
    assert find_bid(text, "link", "Create User") == "3"
    assert find_bid(text, "button", "Save") is None          # disabled: no bid
    assert find_in_row(text, "ops", "Delete") == "5"
    assert find_in_row(text, "ops", "Start") is None


def test_a_field_with_a_placeholder_shows_what_was_typed_not_the_placeholder():
    """Chromium's snapshot gives such a field's value as a child ``text:`` beside
    ``/placeholder:``; the agent (and the teacher) must see what it typed there."""
    snapshot = """\
- textbox "Port Range" [ref=f2e1]:
  - /placeholder: 22/22
  - text: 443/443
- textbox "Authorization Object" [ref=f2e2]:
  - /placeholder: 0.0.0.0/0
- textbox "Name" [ref=f2e3]: xyz
"""
    text = render_snapshot(snapshot).text
    assert '[1] textbox "Port Range": 443/443' in text
    assert '[2] textbox "Authorization Object"\n' in text + "\n"
    assert "22/22" not in text and "0.0.0.0/0" not in text
    assert '[3] textbox "Name": xyz' in text
