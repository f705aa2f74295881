"""The peer on the same pages: Doc Detective (npm ``doc-detective``) on the documentation corpus.

``python -m benchmarks.doc_detective --json`` prints one JSON object: the installed version,
pages, procedures, per procedure PASS / FAIL (or NO_STEPS when the tool detected no action in
it) with the step it failed at, ``defects_found`` (FAIL on a procedure labelled defective),
``defects_found_at_step`` (of those, FAIL at a step the labels mark), ``false_alarms`` (FAIL on
a correct or stale one), ``s_per_page_p50`` (a whole CLI run per page) and ``error`` with the
exact reason when it cannot run.

Doc Detective detects actions in the page's markup ("click **X**" -> click the text X, any
**bold** -> find it, "go to [..](url)" -> open it, `type "x"` -> type it) and replays them
literally in Chromium through Appium and chromedriver. It is configured here as a doc team
would point it at a staging console, and no further:

- each ``##`` procedure of a page becomes one test (inline ``<!-- test -->`` comments in a
  copy of the page under var/), with the console's sign-in as inline steps at its start (the
  sign-in form is not in the docs); a stale procedure signs in to the ``rename`` console;
- the product links (``https://ecs.console.aliyun.com/`` ...) point at the local console, and
  "Log on to the [X console](url)" opens it (the help center's phrase is not in the shipped
  goTo vocabulary); HTML pages get the same rules for ``<b>``/``<strong>``/``uicontrol``
  (Doc Detective ships no markup rules for HTML);
- before each page a sandbox of resources exists in the account (a VPC, vSwitch, security
  group with a rule, a running and a stopped instance, a RAM user, a bucket), as in a staging
  account; it is destroyed after the page.

The install lives in var/doc-detective (``make setup-peer``); its browser cache holds links to
the system Chromium and chromedriver in the layout @puppeteer/browsers scans, because the
runtime otherwise downloads Chrome for Testing, which this machine cannot reach.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DD_DIR = ROOT / "var" / "doc-detective"
DD_BIN = DD_DIR / "node_modules" / ".bin" / "doc-detective"
CACHE = DD_DIR / "cache"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ENGINES_NODE = ">=22.12.0"  # doc-detective 4.x package.json "engines"; node 20 runs it
LANDING = {"ecs": "/console/ecs/instances", "vpc": "/console/vpc/vpcs",
           "ram": "/console/ram/users", "oss": "/console/oss/buckets"}
SANDBOX = [
    {"id": "net", "type": "vpc", "properties": {"name": "docs-net-{episode}"}},
    {"id": "sw", "type": "vswitch", "properties": {"vpc": "${net}", "zone": "cn-hangzhou-h",
                                                   "cidr_block": "192.168.1.0/24"}},
    {"id": "sg", "type": "security_group", "properties": {"vpc": "${net}", "name": "web"}},
    {"id": "ssh", "type": "security_group_rule", "properties": {"security_group": "${sg}"}},
    {"id": "up", "type": "instance", "properties": {"vswitch": "${sw}", "security_group": "${sg}",
                                                    "name": "app-{episode}"}},
    {"id": "down", "type": "instance", "properties": {"vswitch": "${sw}",
                                                      "security_group": "${sg}",
                                                      "name": "idle-{episode}",
                                                      "status": "Stopped"}},
    {"id": "dev", "type": "ram_user", "properties": {"name": "dev-{episode}",
                                                     "policies": ["ReadOnlyAccess"]}},
    {"id": "assets", "type": "oss_bucket", "properties": {"name": "assets-{episode}"}},
]
# "Log on to the [RAM console](https://ram.console.aliyun.com/)." (Markdown and HTML), and the
# HTML counterparts of the shipped Markdown click/find rules.
_CLICK = r"\b(?:[Cc]lick|[Tt]ap|[Ll]eft-click|[Cc]hoose|[Ss]elect|[Cc]heck)\b\s+"
_TAG = r"<(?:b|strong|span class=\"uicontrol\")>([^<]+)</(?:b|strong|span)>"
_LOG_ON = r"\b(?:[Ll]og on to|[Gg]o to|[Oo]pen)\s+the\s+"
# The shipped rules make every **bold** a find, also the one a click names, so "click **X**"
# is a click then a find of X on the page the click opened; and **Note** is a find. The tuned
# markup (what a doc team writes after its first run) finds only bold that no click names.
_NOT_CLICKED = r"(?<!" + _CLICK + r")"
_NOT_NOTE = r"(?!(?:Note|Warning|Important)\b)"
MARKUP = {
    "shipped": {
        "markdown": [{"name": "logOnToConsole", "actions": ["goTo"], "regex": [
            _LOG_ON + r"\[[^\]]+\]\(\s*(https?:\/\/[^\s)]+)\s*\)"]}],
        "html": [
            {"name": "logOnToConsole", "actions": ["goTo"], "regex": [
                _LOG_ON + r"<a href=\"(https?:\/\/[^\"]+)\">"]},
            {"name": "clickOnscreenText", "actions": ["click"], "regex": [_CLICK + _TAG]},
            {"name": "findOnscreenText", "actions": ["find"], "regex": [_TAG]}],
    },
}
MARKUP["tuned"] = {
    "markdown": MARKUP["shipped"]["markdown"] + [
        {"name": "findOnscreenText", "actions": ["find"], "regex": [
            _NOT_CLICKED + r"(?<![*\w])\*\*(?!\s)" + _NOT_NOTE + r"((?:(?!\*\*).)+?)(?<!\s)\*\*"]}],
    "html": MARKUP["shipped"]["html"][:2] + [
        {"name": "findOnscreenText", "actions": ["find"], "regex": [
            _NOT_CLICKED + _TAG.replace(">([^<]+)", ">" + _NOT_NOTE + "([^<]+)", 1)]}],
}


class PeerUnavailable(RuntimeError):
    """Doc Detective cannot run here; the message says exactly why."""


@dataclass
class Proc:
    page: str
    index: int
    title: str
    label: str = "unlabelled"   # correct | defective | stale | unlabelled
    drift: str = ""
    defect: str = ""
    result: str = ""            # PASS | FAIL | NO_STEPS | ERROR
    doc_steps: int = 0
    failed_step: str = ""
    failed_line: int = 0
    failed_at: str = ""         # the step number ("3", "4.2", "4.b") of the failed action
    defective_steps: tuple[str, ...] = ()
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# ---- the install --------------------------------------------------------------------------
def installed_version() -> str:
    if not DD_BIN.exists():
        raise PeerUnavailable(f"doc-detective is not installed ({DD_BIN} missing): run "
                              "`make setup-peer`")
    out = subprocess.run([str(DD_BIN), "--version"], capture_output=True, text=True,
                         timeout=120, env=_env())
    if out.returncode != 0:
        raise PeerUnavailable(f"`doc-detective --version` exited {out.returncode}: "
                              f"{out.stderr.strip()[-400:]}")
    return out.stdout.strip().splitlines()[-1]


def link_system_browser() -> str:
    """Put the system Chromium and chromedriver where @puppeteer/browsers looks for a Chrome
    for Testing install (browsers/<name>/linux-<build>/<name>-linux64/<name>); returns the
    build. Doc Detective has no setting for a browser path of one's own."""
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not exe.exists():
            raise PeerUnavailable(f"{exe} missing (apt-get install chromium chromium-driver)")
    build = _version_of([str(CHROMIUM), "--version"])
    driver = _version_of([str(CHROMEDRIVER), "--version"])
    if build.split(".")[0] != driver.split(".")[0]:
        raise PeerUnavailable(f"chromium {build} and chromedriver {driver} differ in major "
                              "version")
    for name, exe in (("chrome", CHROMIUM), ("chromedriver", CHROMEDRIVER)):
        link = CACHE / "browsers" / name / f"linux-{build}" / f"{name}-linux64" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(exe)
    return build


def _version_of(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    found = re.search(r"\b(\d+\.\d+\.\d+\.\d+)\b", out.stdout)
    if not found:
        raise PeerUnavailable(f"`{' '.join(cmd)}` printed no version: {out.stdout[:200]!r}")
    return found.group(1)


def _env() -> dict[str, str]:
    # No telemetry, no self-update, no browser download at install time: nothing outside
    # this machine is reachable, and each would wait for a network timeout.
    return {**os.environ, "DOC_DETECTIVE_CACHE_DIR": str(CACHE),
            "DOC_DETECTIVE_AUTOINSTALL": "0", "CI": "1"}


def node_version() -> str:
    out = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


# ---- the pages ----------------------------------------------------------------------------
_MD_H2 = re.compile(r"^## +(.+?)\s*$", re.M)
_MD_STEP = re.compile(r"^\s*1\. ", re.M)
_HTML_H2 = re.compile(r"<h2[^>]*>(.*?)</h2>", re.S | re.I)
_HTML_END = re.compile(r"</article>|</body>", re.I)
_CONSOLE_LINK = re.compile(r"https?://(ecs|vpc|ram|oss)\.console\.aliyun\.com[^\s)\"'<]*")


def sections(text: str, kind: str) -> list[tuple[str, str]]:
    """(heading, body) of each ``##`` section of a page that holds a numbered list: the page's
    procedures, in order. Prerequisites are lists too, but bulleted."""
    if kind == "html":
        heads = list(_HTML_H2.finditer(text))
        end = _HTML_END.search(text, heads[-1].end()) if heads else None
        stop = end.start() if end else len(text)
        found = []
        for i, h in enumerate(heads):
            body = text[h.start(): heads[i + 1].start() if i + 1 < len(heads) else stop]
            if "<ol" in body.lower():
                found.append((re.sub(r"<[^>]+>", "", h.group(1)).strip(), body))
        return found
    heads = list(_MD_H2.finditer(text))
    found = []
    for i, h in enumerate(heads):
        body = text[h.start(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        if _MD_STEP.search(body):
            found.append((h.group(1).strip(), body))
    return found


def page_title(text: str, kind: str) -> str:
    found = (re.search(r"<h1[^>]*>(.*?)</h1>", text, re.S | re.I) if kind == "html"
             else re.search(r"^# +(.+?)\s*$", text, re.M))
    return re.sub(r"<[^>]+>", "", found.group(1)).strip() if found else ""


def marked_up_copy(text: str, kind: str, procs: list[tuple[str, str]], cloud_url: str,
              drifts: list[str], login: str) -> str:
    """The page as a doc team would mark it up for Doc Detective: each procedure a test that
    starts by signing in (the password comes from $DD_CONSOLE_PASSWORD at run time)."""
    parts = [f"<html><body><h1>{page_title(text, kind)}</h1>\n" if kind == "html"
             else f"# {page_title(text, kind)}\n\n"]
    for i, ((_, body), drift) in enumerate(zip(procs, drifts)):
        signin = f"{cloud_url}/console/signin" + (f"?drift={drift}" if drift else "")
        steps = [{"goTo": signin},
                 {"find": {"selector": "#login_name", "click": True, "type": {"keys": [login]}}},
                 {"find": {"selector": "#password", "click": True,
                           "type": {"keys": ["$DD_CONSOLE_PASSWORD", "$ENTER$"]}}}]
        body = _CONSOLE_LINK.sub(lambda m: cloud_url + LANDING[m.group(1)], body)
        parts.append(f'<!-- test {json.dumps({"testId": f"p{i}"})} -->\n')
        parts += [f"<!-- step {json.dumps(s)} -->\n" for s in steps]
        parts.append(body.rstrip() + "\n<!-- test end -->\n\n")
    if kind == "html":
        parts.append("</body></html>\n")
    return "".join(parts)


_MD_ITEM = re.compile(r"^(\s*)(\d+|[a-z])\.\s")
_HTML_TAG = re.compile(r"<(/?)(ol|ul|li)\b([^>]*)>|\n", re.I)


def step_numbers(copy: str, kind: str) -> dict[int, str]:
    """Line (1-based) of the marked-up copy -> the number of the step it belongs to, as the
    labels write it ("3", "4.2", "4.b"); lines outside the numbered steps are absent. This is
    how a failed action is placed at a step of the procedure."""
    at: dict[int, str] = {}
    if kind == "html":
        # A stack of open lists: [tag, items so far, lettered]; only <li> of an <ol> counts.
        line, stack, steps, current = 1, [], [], ""
        for m in _HTML_TAG.finditer(copy):
            tag = m.group(2).lower() if m.group(2) else ""
            if m.group(0) == "\n":
                line += 1
            elif tag in ("ol", "ul") and m.group(1):
                if stack and stack.pop()[0] == "ol" and steps:
                    steps.pop()
                current = ".".join(steps)
            elif tag in ("ol", "ul"):
                stack.append([tag, 0, 'type="a"' in m.group(3)])
                if tag == "ol":
                    steps.append("")
            elif tag == "li" and not m.group(1) and stack and stack[-1][0] == "ol":
                stack[-1][1] += 1
                n = stack[-1][1]
                steps[-1] = chr(ord("a") + n - 1) if stack[-1][2] else str(n)
                current = ".".join(steps)
            if current:
                at[line] = current
        return at
    top = current = ""
    for i, text in enumerate(copy.splitlines(), 1):
        item = _MD_ITEM.match(text)
        if item and not item.group(1) and item.group(2).isdigit():
            top = current = item.group(2)
        elif item and item.group(1) and top:
            current = f"{top}.{item.group(2)}"
        elif text.strip() and not text[0].isspace():
            top = current = ""
        if current:
            at[i] = current
    return at


def at_step(failed: str, labelled: tuple[str, ...]) -> bool:
    """Is a failure at step ``failed`` one at a labelled step (or its sub-step, or its
    parent)?"""
    return bool(failed) and any(failed == s or failed.startswith(s + ".")
                                or s.startswith(failed + ".") for s in labelled)


def config_for(out_dir: Path, markup: str) -> dict[str, Any]:
    return {
        "output": str(out_dir), "logLevel": "info", "recursive": False,
        "telemetry": {"send": False}, "autoUpdate": False, "hints": {"enabled": False},
        "browserFallback": "off", "retries": 0,
        "runOn": [{"platforms": ["linux"], "browsers": [{"name": "chrome", "headless": True}]}],
        "fileTypes": [{"extends": "markdown", "markup": MARKUP[markup]["markdown"]},
                      {"extends": "html", "markup": MARKUP[markup]["html"]}],
    }


# ---- the labels ---------------------------------------------------------------------------
def load_labels(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(page, procedure title) -> its entry of docs/corpus/labels.yaml (a list of entries with
    page, title, status correct|defective|stale, drift, defect; see docs/corpus/README.md)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    if data is None:
        return {}
    if not isinstance(data, list):
        raise PeerUnavailable(f"{path}: expected a list of procedure entries")
    return {(str(e.get("page")), str(e.get("title"))): e for e in data if isinstance(e, dict)}


# ---- a run --------------------------------------------------------------------------------
SIGNIN_STEPS = 3
_RUNNING: set[int] = set()   # process groups of the doc-detective runs under way
_STOP = threading.Event()


def _stop_runs(signum: int, _frame: Any) -> None:
    # Doc Detective starts Appium, chromedriver and Chromium below it: end its whole group.
    _STOP.set()
    for pgid in list(_RUNNING):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    raise SystemExit(128 + signum)


def run_page(copy: Path, out_dir: Path, procs: list[Proc], password: str,
             timeout_s: float, markup: str) -> float:
    """Doc Detective on one prepared page; fills in each procedure's result; returns the wall
    time of the run (Node, Appium and Chromium start included, as a CLI run per page has)."""
    config = out_dir / "config.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(config_for(out_dir, markup), indent=1))
    t0 = time.monotonic()
    proc = subprocess.Popen([str(DD_BIN), "-c", str(config), "-i", str(copy)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**_env(), "DD_CONSOLE_PASSWORD": password}, cwd=out_dir,
                            start_new_session=True)
    _RUNNING.add(proc.pid)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log = proc.communicate()[0] + f"\ntimed out after {timeout_s:g} s"
    finally:
        _RUNNING.discard(proc.pid)
    wall = time.monotonic() - t0
    (out_dir / "run.log").write_text(log)
    results = sorted(out_dir.glob("testResults-*.json"))
    if not results:
        for p in procs:
            p.result, p.failed_step = "ERROR", log.strip()[-300:]
        return wall
    tests = {t.get("testId"): t for spec in json.loads(results[-1].read_text())["specs"]
             for t in spec["tests"]}
    for i, p in enumerate(procs):
        _read_test(p, tests.get(f"p{i}"))
    return wall


def _read_test(p: Proc, test: dict[str, Any] | None) -> None:
    if test is None:
        p.result = "NO_STEPS"   # nothing detected: Doc Detective drops an empty test
        return
    steps = [s for c in test.get("contexts", []) for s in c.get("steps", [])]
    p.doc_steps = max(0, len(steps) - SIGNIN_STEPS)
    p.duration_s = round(test.get("durationMs", 0) / 1000, 1)
    failed = next((k for k, s in enumerate(steps) if s.get("result") == "FAIL"), None)
    if p.doc_steps == 0:
        p.result = "NO_STEPS"
    elif failed is not None and failed < SIGNIN_STEPS:
        p.result, p.failed_step = "ERROR", f"sign-in step failed: {_describe(steps[failed])}"
    elif failed is not None or test.get("result") == "FAIL":
        p.result = "FAIL"
        if failed is not None:
            p.failed_step = _describe(steps[failed])
            p.failed_line = int((steps[failed].get("location") or {}).get("line") or 0)
    else:
        p.result = "PASS" if test.get("result") in ("PASS", "WARNING") else test.get("result")


def _describe(step: dict[str, Any]) -> str:
    action = next((k for k in ("goTo", "click", "find", "type", "checkLink") if k in step), "?")
    what = step[action] if action != "?" else ""
    if isinstance(what, dict):
        what = what.get("elementText") or what.get("url") or what.get("selector") or what
    line = (step.get("location") or {}).get("line")
    return f"{action} {what!r} (line {line}): {str(step.get('resultDescription'))[:160]}"


def place(procs: list[Proc], copy: str, kind: str) -> None:
    numbers = step_numbers(copy, kind)
    for p in procs:
        p.failed_at = numbers.get(p.failed_line, "") if p.failed_line else ""


def seed(cloud_endpoint: str, account: Any, episode: str) -> Any:
    from consolerl.resources import parse_resources
    from infra.cloud import CloudClient, CloudConfig, Credentials
    from infra.provisioning.sdk import SdkProvisioner

    def client() -> CloudClient:
        return CloudClient(CloudConfig(endpoint=cloud_endpoint),
                           Credentials(account.access_key_id, account.access_key_secret))
    prov = SdkProvisioner(client, ready_timeout_s=60, poll_s=0.2)
    prov.provision(parse_resources(SANDBOX), episode)
    return prov


def corpus_pages(corpus: Path) -> list[Path]:
    return sorted(p for p in corpus.rglob("*") if p.suffix in (".md", ".html")
                  and p.name.lower() not in ("readme.md", "index.md"))


def benchmark(corpus: Path, labels_path: Path, work: Path, timeout_s: float,
              pages_limit: int | None, stride: int, seed_sandbox: bool, jobs: int,
              markup: str) -> dict[str, Any]:
    from consolerl.accounts import load_accounts
    from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
    from infra.local_cloud import LocalCloud

    out: dict[str, Any] = {"tool": "doc-detective", "node": node_version(),
                           "node_required": ENGINES_NODE, "markup": markup,
                           "sandbox": seed_sandbox}
    out["version"] = installed_version()
    out["chromium"] = link_system_browser()
    pages = corpus_pages(corpus)[::stride][:pages_limit]
    if not pages:
        raise PeerUnavailable(f"no .md or .html page under {corpus}")
    labels = load_labels(labels_path)
    accounts = load_accounts(DEFAULT_ACCOUNTS_FILE)[:max(1, jobs)]
    shutil.rmtree(work, ignore_errors=True)
    (work / "cloud").mkdir(parents=True)
    cloud = LocalCloud(work / "cloud", ("--transition", "0.3", "--network-ready", "0.1",
                                        "--lookup-qps", "0"))
    cloud.start()
    by_page: list[list[Proc]] = []
    walls: list[float] = []

    def one_page(page: Path, account: Any) -> None:
        rel = page.relative_to(corpus).as_posix()
        kind = "html" if page.suffix == ".html" else "markdown"
        text = page.read_text(encoding="utf-8")
        found = sections(text, kind)
        mine = []
        for i, (title, _) in enumerate(found):
            entry = labels.get((rel, title)) or {}
            mine.append(Proc(rel, i, title, str(entry.get("status") or "unlabelled"),
                             str(entry.get("drift") or ""), str(entry.get("defect") or ""),
                             defective_steps=tuple(map(str, entry.get("defective_steps")
                                                       or ()))))
        by_page.append(mine)
        if not found:
            return
        copy = work / "pages" / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(marked_up_copy(text, kind, found, cloud.url, [p.drift for p in mine],
                                  account.login_name))
        episode = secrets.token_hex(4)
        t0 = time.monotonic()
        prov = seed(cloud.endpoint, account, episode) if seed_sandbox else None
        seeded = time.monotonic() - t0
        try:
            walls.append(run_page(copy, work / "out" / rel, mine, account.password, timeout_s,
                                  markup))
        finally:
            if prov is not None:
                prov.destroy(episode)
        place(mine, copy.read_text(encoding="utf-8"), kind)
        print(f"{rel}: {' '.join(p.result for p in mine)} in {walls[-1]:.0f} s "
              f"(sandbox {seeded:.0f} s)", file=sys.stderr, flush=True)

    def worker(k: int) -> None:
        # One account per worker: a page's sandbox and clicks stay out of the other's lists.
        for page in pages[k::len(accounts)]:
            if _STOP.is_set():
                return
            one_page(page, accounts[k])

    try:
        with ThreadPoolExecutor(len(accounts)) as pool:
            for fut in [pool.submit(worker, k) for k in range(len(accounts))]:
                fut.result()
    finally:
        cloud.stop()
    procs = sorted((p for ps in by_page for p in ps), key=lambda p: (p.page, p.index))
    missing = [f"{page}: {title}" for page, title in labels
               if not any(p.page == page and p.title == title for p in procs)]
    out["labelled_not_found"] = missing
    out["jobs"] = len(accounts)
    return summarize(out, pages, procs, walls)


def summarize(out: dict[str, Any], pages: list[Path], procs: list[Proc],
              walls: list[float]) -> dict[str, Any]:
    def count(label: str, result: str) -> int:
        return sum(p.label == label and p.result == result for p in procs)
    defective = sum(p.label == "defective" for p in procs)
    out.update({
        "pages": len(pages), "procedures": len(procs),
        "by_label": {lab: sum(p.label == lab for p in procs)
                     for lab in ("correct", "defective", "stale", "unlabelled")},
        "results": {r: sum(p.result == r for p in procs)
                    for r in ("PASS", "FAIL", "NO_STEPS", "ERROR")},
        "defects_found": count("defective", "FAIL"),
        "defects_found_at_step": sum(p.label == "defective" and p.result == "FAIL"
                                     and at_step(p.failed_at, p.defective_steps)
                                     for p in procs),
        "defect_recall": round(count("defective", "FAIL") / defective, 3) if defective else None,
        "false_alarms": count("correct", "FAIL") + count("stale", "FAIL"),
        "false_alarms_correct": count("correct", "FAIL"),
        "false_alarms_stale": count("stale", "FAIL"),
        "s_per_page_p50": round(statistics.median(walls), 1) if walls else None,
        "s_per_page_max": round(max(walls), 1) if walls else None,
        "error": None,
        "defects_found_by_kind": {k: sum(p.defect == k and p.result == "FAIL" for p in procs)
                                  for k in sorted({p.defect for p in procs if p.defect})},
        "defects_by_kind": {k: sum(p.defect == k for p in procs)
                            for k in sorted({p.defect for p in procs if p.defect})},
        "per_procedure": [{"page": p.page, "procedure": p.title, "label": p.label,
                           "defect": p.defect,
                           "result": p.result, "doc_steps": p.doc_steps,
                           "duration_s": p.duration_s, "failed_step": p.failed_step,
                           "failed_at": p.failed_at,
                           "defective_steps": list(p.defective_steps)}
                          for p in procs],
    })
    return out


def rescore(previous: Path, work: Path, labels_path: Path) -> dict[str, Any]:
    """The summary of an earlier run (its JSON and the marked-up copies in ``work``) under the
    current labels and scoring, without running anything again."""
    prev = json.loads(previous.read_text(encoding="utf-8"))
    labels = load_labels(labels_path)
    procs = []
    for i, r in enumerate(prev["per_procedure"]):
        entry = labels.get((r["page"], r["procedure"])) or {}
        line = re.search(r"\(line (\d+)\)", r.get("failed_step", ""))
        procs.append(Proc(r["page"], i, r["procedure"], str(entry.get("status") or r["label"]),
                          str(entry.get("drift") or ""), str(entry.get("defect") or ""),
                          r["result"], r.get("doc_steps", 0), r.get("failed_step", ""),
                          int(line.group(1)) if line else 0,
                          defective_steps=tuple(map(str, entry.get("defective_steps") or ())),
                          duration_s=r.get("duration_s", 0.0)))
    for page in {p.page for p in procs}:
        copy = work / "pages" / page
        if copy.exists():
            place([p for p in procs if p.page == page], copy.read_text(encoding="utf-8"),
                  "html" if page.endswith(".html") else "markdown")
    keep = {k: v for k, v in prev.items() if k not in ("per_procedure",)}
    out = summarize(dict(keep), [Path(p.page) for p in procs][:prev["pages"]], procs, [])
    out.update({k: prev[k] for k in ("pages", "s_per_page_p50", "s_per_page_max")})
    out["rescored_from"] = str(previous)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.doc_detective",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "docs" / "corpus")
    ap.add_argument("--labels", type=Path, default=None,
                    help="labels YAML (default: CORPUS/labels.yaml)")
    ap.add_argument("--work", type=Path, default=ROOT / "var" / "doc-detective" / "run",
                    help="prepared pages, the cloud's state and Doc Detective's output")
    ap.add_argument("--page-timeout", type=float, default=900.0)
    ap.add_argument("--pages", type=int, default=None, help="only the first N pages")
    ap.add_argument("--stride", type=int, default=1,
                    help="every K-th page only (a sample across the products)")
    ap.add_argument("--no-sandbox", action="store_true",
                    help="do not create the staging resources before each page")
    ap.add_argument("--markup", choices=sorted(MARKUP), default="tuned",
                    help="shipped: Doc Detective's own Markdown rules (every bold is also a "
                         "find); tuned: a bold that a click names is not found again")
    ap.add_argument("--jobs", type=int, default=1,
                    help="pages run side by side, each worker with an account of its own")
    ap.add_argument("--rescore", type=Path, default=None, metavar="PREVIOUS_JSON",
                    help="summarize an earlier run's output again (with its --work), run nothing")
    ap.add_argument("--json", action="store_true", help="one JSON object (the default)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_runs)
    try:
        corpus = args.corpus.resolve()
        if args.rescore is not None:
            out = rescore(args.rescore, args.work.resolve(),
                          (args.labels or corpus / "labels.yaml").resolve())
            print(json.dumps(out, indent=1))
            return 0
        out = benchmark(corpus, (args.labels or corpus / "labels.yaml").resolve(),
                        args.work.resolve(),
                        args.page_timeout, args.pages, max(1, args.stride),
                        not args.no_sandbox, args.jobs,
                        args.markup)
    except (PeerUnavailable, OSError, subprocess.SubprocessError) as exc:
        out = {"tool": "doc-detective", "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out, indent=1))
    return 0 if out.get("error") is None else 1


if __name__ == "__main__":
    sys.exit(main())
