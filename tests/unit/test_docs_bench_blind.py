"""benchmarks.docs on blind batches: the procedure verdict figures and the optional-step rule."""
from __future__ import annotations

import pytest

from benchmarks.docs import Item, blind_batches, static_figures, verdict_figures
from doccheck.model import Procedure, StepCheck, StepLabel


def _item(title: str, status: str, labels: dict[str, StepLabel], **label) -> Item:
    entry = {"page": "p.md", "title": title, "status": status, "defective_steps": [],
             "stale_steps": [], "reworded_steps": [], "optional_steps": [], **label}
    checks = tuple(StepCheck(n, lab) for n, lab in labels.items())
    return Item(entry, Procedure(title, "p.md", ()), checks)


OK, MISSING, NA, DIFFERS = (StepLabel.OK, StepLabel.MISSING, StepLabel.NOT_APPLICABLE,
                            StepLabel.LABEL_DIFFERS)


def test_verdict_figures_count_broken_against_defective_and_reworded_as_not_broken():
    items = [
        _item("defect found", "defective", {"1": OK, "2": MISSING}, defective_steps=["2"]),
        _item("defect missed", "defective", {"1": OK, "2": OK}, defective_steps=["2"]),
        _item("reworded, called broken", "correct", {"1": MISSING}, reworded_steps=["1"]),
        _item("stale, read as stale", "stale", {"1": DIFFERS}, stale_steps=["1"]),
        _item("optional step the console lacks", "correct", {"1": OK, "2": NA},
              optional_steps=["2"]),
        _item("plain correct", "correct", {"1": OK}),
    ]
    figures = verdict_figures(items)
    assert figures["called_broken"] == 2                  # the optional step makes no broken
    assert figures["broken_precision"] == 0.5 and figures["broken_recall"] == 0.5
    # defective x2, reworded, stale: right on "defect found" and the stale one
    assert figures["stale_vs_broken_accuracy"] == 0.5
    assert "called broken, labelled correct" in items[2].notes
    static = static_figures(items)
    assert static["flagged_steps"] == 2 and static["defective_steps"] == 2
    assert static["static_precision"] == 0.5 and static["static_recall"] == 0.5


def test_blind_batches_are_chosen_by_number():
    assert blind_batches("none") == []
    assert [p.name for p in blind_batches("1")] == ["corpus-blind-1"]
    assert "corpus-blind-1" in [p.name for p in blind_batches("all")]
    with pytest.raises(SystemExit, match="no blind batch corpus-blind-99"):
        blind_batches("99")


def test_each_procedure_is_checked_against_the_console_its_label_names(tmp_path):
    """A page with a procedure for the default console and a stale one: the stale one is
    checked against the renamed console (its Delete reads Release there), the other not."""
    from benchmarks.docs import read_corpus
    page = ("# Buckets\n\n## Delete a bucket\n\n1. Log on to the OSS console.\n"
            "2. In the left-side navigation pane, click **Buckets**.\n"
            "3. In the **Actions** column of the bucket, click **Delete**.\n4. Click **OK**.\n\n"
            "## Delete a bucket again\n\n1. Log on to the OSS console.\n"
            "2. In the left-side navigation pane, click **Buckets**.\n"
            "3. In the **Actions** column of the bucket, click **Delete**.\n4. Click **OK**.\n")
    (tmp_path / "b.md").write_text(page)
    entry = {"page": "b.md", "status": "correct", "drift": "", "defect": "",
             "defective_steps": [], "stale_steps": [], "operation": "Oss:DeleteBucket",
             "note": ""}
    import yaml
    (tmp_path / "labels.yaml").write_text(yaml.safe_dump([
        {**entry, "title": "Delete a bucket"},
        {**entry, "title": "Delete a bucket again", "status": "stale", "drift": "rename",
         "stale_steps": ["2", "3", "4"]}]))
    default, stale = read_corpus(tmp_path)[0]
    assert [c.label for c in default.checks] == [OK] * 4
    assert [c.label for c in stale.checks][2] == DIFFERS and stale.checks[2].closest == "Release"
