"""``console-rl docs check PAGE`` without ``--run`` checks here: no server, no token."""
from __future__ import annotations

import json

from jobsapi.cli import main

PAGE = """# Users

## Create a RAM user

1. Log on to the RAM console.
2. In the left-side navigation pane, click **Users**.
3. Click **Create User**.
4. Click **Add New Member**.
"""


def test_the_static_check_runs_with_no_server_and_no_token(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CONSOLE_RL_TOKEN", raising=False)
    monkeypatch.setenv("CONSOLE_RL_URL", "http://127.0.0.1:9")     # nothing listens there
    (tmp_path / "ram.md").write_text(PAGE)
    (tmp_path / "empty.md").write_text("# Nothing to do here\n\nJust prose.\n")
    assert main(["docs", "check", str(tmp_path / "ram.md"), "--json",
                 "--html", str(tmp_path / "static.html")]) == 0
    out = json.loads(capsys.readouterr().out)
    (proc,) = out["procedures"]
    assert proc["title"] == "Create a RAM user" and proc["verdict"] == "broken"
    assert [s["label"] for s in proc["steps"]] == ["ok", "ok", "ok", "missing"]
    assert "missing" in (tmp_path / "static.html").read_text()
    assert main(["docs", "check", str(tmp_path / "empty.md"), "--json"]) == 0
    messages = json.loads(capsys.readouterr().out)["messages"]
    assert messages[0].startswith("empty.md: no procedure found")
    assert messages[1] == "no procedure found in any page"


def test_bad_input_and_run_without_a_token_are_usage_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CONSOLE_RL_TOKEN", raising=False)
    (tmp_path / "bad.md").write_bytes(b"\xff\xfe\x00binary")
    (tmp_path / "ram.md").write_text(PAGE)
    assert main(["docs", "check", str(tmp_path / "bad.md")]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    assert main(["docs", "check", str(tmp_path / "ram.md"), "--drift", "nope"]) == 2
    assert "drift" in capsys.readouterr().err
    assert main(["docs", "check", str(tmp_path / "ram.md"), "--samples", "2"]) == 2
    assert "--samples" in capsys.readouterr().err
    assert main(["docs", "check", str(tmp_path / "ram.md"), "--executor", "replay"]) == 2
    assert "--executor: only with --run" in capsys.readouterr().err
    assert main(["docs", "check", str(tmp_path / "ram.md"), "--run"]) == 2
    assert "no token" in capsys.readouterr().err
