"""What the crawler reads off one console page, and how it turns that into inventory entries.

:data:`FACTS_JS` runs in the page (Playwright ``evaluate``) and returns plain data read from the
DOM and its accessibility attributes only: the ``h1``, the side navigation (a navigation
landmark outside ``main`` and the top bar; its heading, groups and the entry marked
``aria-current``), the breadcrumb, every visible control in ``main`` and in open dialogs (links,
buttons, tabs, menu items, with the place they sit in), the tables' headers, the page's POST
forms with their fields, and the words of table cells (resource names and IDs, used to tell
which path segments name a resource). Nothing here knows the console's routes.

:class:`Normaliser` turns concrete paths and texts into patterns: a path segment that names a
resource (a value seen in a table row, a resource the crawl made, an ID-shaped word) becomes
``{}``; so does such a name inside a title or an option label.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from .model import Control, Form, FormField, PageEntry, WhereKind

# Controls get data-crawl="<n>" so Python can click the n-th one; forms data-crawl-form.
FACTS_JS = r"""
() => {
  const clean = (s) => (s || "").replace(/\s+/g, " ").trim();
  const shown = (el) => !!el && el.getClientRects().length > 0 &&
      getComputedStyle(el).visibility !== "hidden";
  const spoken = (el) => {          // text without aria-hidden decorations (a "*", an arrow)
    if (!el) return "";
    const copy = el.cloneNode(true);
    copy.querySelectorAll("[aria-hidden=true]").forEach((n) => n.remove());
    return clean(copy.textContent);
  };
  const nameOf = (el) => {
    if (!el) return "";
    const ids = el.getAttribute("aria-labelledby");
    if (ids) {
      const t = clean(ids.split(/\s+/).map((i) => spoken(document.getElementById(i))).join(" "));
      if (t) return t;
    }
    const al = el.getAttribute("aria-label");
    if (al && clean(al)) return clean(al);
    return spoken(el);
  };
  const main = document.querySelector("main, [role=main]") || document.body;
  const header = document.querySelector("header, [role=banner]");
  const dialogs = Array.from(document.querySelectorAll(
      "dialog[open], [role=dialog], [role=alertdialog]")).filter(shown);
  const dialogTitle = (d) => nameOf(d) || spoken(d.querySelector("h1,h2,h3"));

  // side navigation
  const navs = Array.from(document.querySelectorAll("nav, [role=navigation]")).filter(
      (n) => !main.contains(n) && !(header && header.contains(n)) && shown(n));
  const side = navs.find((n) => n.querySelector("[aria-current]")) || navs[0] || null;
  let nav = null;
  if (side) {
    const heading = side.querySelector("h1,h2,h3,h4");
    nav = {title: heading ? spoken(heading) : clean(side.getAttribute("aria-label")),
           items: Array.from(side.querySelectorAll("a[href]")).map((a) => {
             const det = a.closest("details");
             const sum = det ? det.querySelector("summary") : null;
             return {label: nameOf(a), href: a.href, group: sum ? spoken(sum) : "",
                     current: a.getAttribute("aria-current") === "page"};
           })};
  }
  const crumbNav = Array.from(main.querySelectorAll("nav, [role=navigation]")).find(
      (n) => /bread/i.test(n.getAttribute("aria-label") || n.className || ""));
  const crumbs = crumbNav ? Array.from(crumbNav.querySelectorAll("li")).map(spoken) : [];

  // controls
  const whereOf = (el) => {
    const d = el.closest("dialog, [role=dialog], [role=alertdialog]");
    if (d) return "dialog:" + dialogTitle(d);
    if (el.closest("tbody tr, [role=row]")) return "row";
    const f = el.closest("form");
    if (f && (f.getAttribute("method") || "").toLowerCase() === "post") return "form";
    if (el.closest("[role=toolbar], .toolbar")) return "toolbar";
    if (el.closest("[role=tablist]")) return "page";
    const sec = el.closest("section, [role=region]");
    if (sec) {
      const h = sec.querySelector("h2, h3");
      if (h && !h.contains(el)) return "section:" + spoken(h);
    }
    return "page";
  };
  const roleOf = (el) => {
    const r = el.getAttribute("role");
    if (r === "tab" || r === "menuitem") return r;
    if (r === "link" || el.tagName === "A") return "link";
    return "button";
  };
  const sel = "a[href], button, [role=button], [role=link], [role=tab], [role=menuitem], " +
              "input[type=submit], input[type=button]";
  const roots = [main, ...dialogs.filter((d) => !main.contains(d))];
  const controls = [];
  let n = 0;
  for (const root of roots) {
    for (const el of root.querySelectorAll(sel)) {
      const inNav = el.closest("nav, [role=navigation]");
      if (inNav && main.contains(inNav)) continue;       // breadcrumb, pager
      const inMenu = el.closest("[role=menu]");
      const form = el.form || el.closest("form");
      const inPostForm = !!form && main.contains(form) &&
          (form.getAttribute("method") || "").toLowerCase() === "post";
      // hidden but one click away: a closed menu, another tab's panel, a wizard's next step
      const inPanel = el.closest("[role=tabpanel]");
      if (!shown(el) && !inMenu && !inPostForm && !inPanel) continue;
      const label = el.tagName === "INPUT" ? clean(el.value) : nameOf(el);
      if (!label) continue;
      el.setAttribute("data-crawl", String(n));
      const type = el.tagName === "A" ? "link" :
          (el.getAttribute("type") || (el.tagName === "BUTTON" ? "submit" : "")).toLowerCase();
      let method = "", url = "";
      if (el.tagName === "A") url = el.href;
      else if (type === "submit" && el.form) {
        method = (el.getAttribute("formmethod") || el.form.getAttribute("method") ||
                  "get").toLowerCase();
        url = el.getAttribute("formaction") ? el.formAction : el.form.action;
      }
      let toggle = "";
      if (inMenu && !shown(el)) {
        const opener = (inMenu.id && document.querySelector(`[aria-controls="${inMenu.id}"]`))
            || inMenu.previousElementSibling;
        toggle = (opener && opener.getAttribute("data-crawl")) || "";
      }
      controls.push({n, role: roleOf(el), label, where: whereOf(el), type, method, url,
                     disabled: el.disabled === true || el.getAttribute("aria-disabled") === "true",
                     danger: /danger|destructive/i.test(el.className || ""),
                     shown: shown(el), expands: el.hasAttribute("aria-haspopup") ||
                         el.hasAttribute("aria-expanded"), toggle,
                     row: clean((el.closest("tr, [role=row]") || {}).innerText || "")});
      n += 1;
    }
  }

  // forms that post
  const forms = [];
  let fi = 0;
  for (const form of main.querySelectorAll("form")) {
    // forms that post, and search forms (read, never sent: they change nothing)
    const method = (form.getAttribute("method") || "get").toLowerCase();
    if (method !== "post" && form.getAttribute("role") !== "search") continue;
    form.setAttribute("data-crawl-form", String(fi));
    const steps = Array.from(form.querySelectorAll("fieldset")).filter(
        (fs) => !fs.parentElement.closest("fieldset") && fs.querySelector("legend"));
    const wizard = steps.length > 1;
    const fields = [];
    const radios = new Set();
    for (const el of form.querySelectorAll("input, select, textarea")) {
      const type = (el.getAttribute("type") || "").toLowerCase();
      if (["hidden", "submit", "button", "reset", "image", "file"].includes(type)) continue;
      if (el.tagName === "INPUT" && type === "radio") {
        if (radios.has(el.name)) continue;
        radios.add(el.name);
      }
      const group = type === "radio" ? el.closest("fieldset, [role=radiogroup]") : null;
      const step = el.closest("fieldset") && steps.find((s) => s.contains(el));
      let label = "";
      if (group) label = (group.querySelector("legend") && spoken(group.querySelector("legend")))
          || nameOf(group);
      else if (el.id && form.querySelector(`label[for="${el.id}"]`))
        label = spoken(form.querySelector(`label[for="${el.id}"]`));
      else if (el.closest("label")) label = spoken(el.closest("label"));
      else label = clean(el.getAttribute("aria-label") || el.getAttribute("placeholder"));
      const kind = el.tagName === "SELECT" ? "select" : el.tagName === "TEXTAREA" ? "textarea" :
          type === "radio" ? "radio" : type === "checkbox" ? "checkbox" :
          el.readOnly ? "readonly" :
          (type === "number" || el.getAttribute("inputmode") === "numeric") ? "number" : "text";
      let options = [];
      let values = [];
      if (kind === "select") {
        const opts = Array.from(el.options).filter((o) => o.value !== "");
        options = opts.map((o) => clean(o.textContent));
        values = opts.map((o) => o.value);
      }
      if (kind === "radio") {
        const group = Array.from(form.querySelectorAll(
            `input[type=radio][name="${CSS.escape(el.name)}"]`));
        options = group.map((r) => nameOf(r) || spoken(r.closest("label")));
        values = group.map((r) => r.value);
      }
      const num = (a) => el.hasAttribute(a) && el.getAttribute(a) !== "" ?
          Number(el.getAttribute(a)) : null;
      const described = (el.getAttribute("aria-describedby") || (group &&
          group.getAttribute("aria-describedby")) || "").split(/\s+/).filter(Boolean)
          .map((i) => spoken(document.getElementById(i))).join(" ");
      fields.push({name: el.name || el.id || "", label, kind,
                   required: el.required || el.getAttribute("aria-required") === "true",
                   options, values, minimum: num("min"), maximum: num("max"),
                   max_length: el.maxLength > 0 ? el.maxLength : null,
                   pattern: el.getAttribute("pattern") || "",
                   step: wizard && step ? spoken(step.querySelector("legend")) : "",
                   section: step ? spoken(step.querySelector("legend")) : "",
                   help: described, placeholder: el.getAttribute("placeholder") || ""});
    }
    const buttons = Array.from(form.querySelectorAll("button, input[type=submit]"));
    const submit = buttons.find((b) => (b.getAttribute("type") || "submit") === "submit");
    const next = wizard ? buttons.find((b) => b.getAttribute("type") === "button" && shown(b))
        : null;
    const cancel = form.querySelector("a[href]");
    const title = nameOf(form) || (steps[0] ? "" : "") ||
        spoken(document.querySelector("main h1"));
    forms.push({i: fi, title, url: form.action, method, fields,
                steps: wizard ? steps.map((s) => spoken(s.querySelector("legend"))) : [],
                submit: submit ? (submit.tagName === "INPUT" ? clean(submit.value)
                                  : nameOf(submit)) : "",
                next: next ? nameOf(next) : "", cancel: cancel ? nameOf(cancel) : ""});
    fi += 1;
  }

  const columns = [];
  for (const th of main.querySelectorAll("thead th, [role=columnheader]")) {
    const t = spoken(th);
    if (t && !columns.includes(t)) columns.push(t);
  }
  const tabs = Array.from(main.querySelectorAll("[role=tab]")).map(nameOf);
  const words = new Set();
  // Values shown in table rows (not the rows' buttons and menus); a link whose text is the
  // last segment of where it points names a resource by that segment.
  for (const td of main.querySelectorAll("tbody td, [role=cell]")) {
    const copy = td.cloneNode(true);
    copy.querySelectorAll(sel + ", [role=menu]").forEach((e) => e.remove());
    for (const w of (copy.textContent || "").split(/[\s,]+/)) if (w) words.add(w);
    for (const a of td.querySelectorAll("a[href]")) {
      const parts = new URL(a.href).pathname.split("/").filter(Boolean);
      const last = parts.length ? decodeURIComponent(parts[parts.length - 1]) : "";
      if (last && clean(a.textContent) === last) words.add(last);
    }
  }
  const h1 = main.querySelector("h1");
  return {url: location.href, h1: h1 ? spoken(h1) : clean(document.title), nav, crumbs,
          controls, forms, columns, tabs, words: Array.from(words),
          dialogs: dialogs.map(dialogTitle)};
}
"""

# The open dialog (after a click): its title and the URL its form posts to.
DIALOG_JS = r"""
() => {
  const clean = (s) => (s || "").replace(/\s+/g, " ").trim();
  const shown = (el) => !!el && el.getClientRects().length > 0;
  const d = Array.from(document.querySelectorAll(
      "dialog[open], [role=dialog], [role=alertdialog]")).find(shown);
  if (!d) return null;
  const form = d.querySelector("form");
  return {url: form && (form.getAttribute("method") || "").toLowerCase() === "post" ?
          form.action : ""};
}
"""

_ID_WORD = re.compile(r"\b[a-z]{1,6}-[a-z0-9]{10,}\b")
_COUNT = re.compile(r"\s+\d+$")


def id_shaped(word: str) -> bool:
    return bool(_ID_WORD.fullmatch(word)) and any(ch.isdigit() for ch in word)


@dataclass
class Normaliser:
    """Concrete console paths and texts to patterns. ``known``: names and IDs of resources
    (the crawl's own, the account's login name); ``seen``: words of table rows."""

    console_host: str
    known: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)

    def resource(self, segment: str) -> bool:
        return segment in self.known or segment in self.seen or id_shaped(segment)

    def path(self, url: str) -> str:
        """``http://host/console/ram/users/bob?x=1`` -> ``/console/ram/users/{}``; query
        parameters that name a resource are dropped (the same page, prefilled), others kept."""
        parts = urlsplit(url)
        segs = [unquote(s) for s in parts.path.split("/")]
        path = "/".join("{}" if s and self.resource(s) else s for s in segs) or "/"
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                 if not self.resource(v)]
        return path + ("?" + urlencode(sorted(query)) if query else "")

    def text(self, text: str, extra: Iterable[str] = ()) -> str:
        """``Rename i-bp1...`` -> ``Rename {}``: known names and ID-shaped words replaced."""
        names = sorted({*self.known, *extra} - {""}, key=len, reverse=True)
        for name in names:
            if name in text:
                text = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", "{}", text)
        return _ID_WORD.sub(lambda m: "{}" if id_shaped(m[0]) else m[0], text)

    def on_console(self, url: str) -> bool:
        """A console page the crawl may open: this host, under /console/, not sign-in or
        sign-out or static files."""
        try:
            parts = urlsplit(url)
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or parts.netloc != self.console_host:
            return False
        path = parts.path
        return (path.startswith("/console/") or path == "/console") and not any(
            path.startswith(p) for p in ("/console/signin", "/console/signout",
                                         "/console/static/"))


def concrete_resources(norm: Normaliser, url: str) -> list[str]:
    """The path segments of ``url`` that :meth:`Normaliser.path` turns into ``{}``."""
    return [unquote(s) for s in urlsplit(url).path.split("/") if s and norm.resource(unquote(s))]


def product_of(pattern: str) -> str:
    """The console's first path segment after /console (``ram``), "" for the home page."""
    parts = [p for p in pattern.split("?")[0].split("/") if p]
    return parts[1] if len(parts) > 1 and parts[0] == "console" and parts[1] != "{}" else ""


def target_of(norm: Normaliser, c: Mapping[str, Any]) -> str:
    """A control's target from what the DOM says ("" when only a click can tell)."""
    if c["url"] and c["type"] == "link":
        return f"page:{norm.path(c['url'])}" if norm.on_console(c["url"]) else ""
    if c["url"] and c["method"] == "post":
        return f"post:{norm.path(c['url'])}"
    if c["url"] and c["method"]:
        return f"page:{norm.path(c['url'])}"
    return ""


def entry_from_facts(norm: Normaliser, facts: Mapping[str, Any], probed: Mapping[int, str],
                     dialog_controls: Sequence[Control], example: str) -> PageEntry:
    """One visit's :class:`PageEntry`. ``probed``: control number -> target learnt by
    clicking it; ``dialog_controls``: the controls of the dialogs those clicks opened."""
    url = facts["url"]
    pattern = norm.path(url)
    extra = concrete_resources(norm, url)

    def text(t: str) -> str:
        return norm.text(t, extra)
    menu: tuple[str, ...] = ()
    controls: list[Control] = []
    nav = facts.get("nav")
    if nav:
        for item in nav["items"]:
            if not norm.on_console(item["href"]):
                continue
            controls.append(Control("navitem", text(item["label"]),
                                    f"page:{norm.path(item['href'])}", where="nav"))
            if item["current"] and norm.path(item["href"]) == pattern:
                crumbs = facts.get("crumbs") or []
                root = crumbs[1] if len(crumbs) > 1 else nav["title"]
                menu = tuple(x for x in (root, item["group"], item["label"]) if x)
    for c in facts["controls"]:
        if c["type"] == "link" and not (norm.on_console(c["url"]) or not c["url"]):
            continue        # leaves the console: not followed, not listed
        target = probed.get(c["n"]) or target_of(norm, c)
        label = _COUNT.sub("", c["label"]) if c["role"] == "tab" else c["label"]
        controls.append(Control(c["role"], text(label), target, where=text(c["where"]),
                                danger=bool(c["danger"])))
    controls += dialog_controls
    forms = tuple(Form(title=text(f["title"]), fields=tuple(
        FormField(name=x["name"], label=x["label"], kind=x["kind"], required=x["required"],
                  options=tuple(text(o) for o in x["options"]),
                  minimum=_bound(x, "minimum", 0), maximum=_bound(x, "maximum", 1),
                  max_length=x["max_length"], pattern=x["pattern"],
                  step=x["step"], section=x["section"], help=text(x["help"]),
                  values=tuple(text(v) for v in x["values"])) for x in f["fields"]),
        submit=f["submit"],
        post=norm.path(f["url"]) if f["url"] and f["method"] == "post" else "",
        steps=tuple(f["steps"]), next_label=f["next"], cancel=f["cancel"])
        for f in facts["forms"])
    return PageEntry(pattern=pattern, title=text(facts["h1"]), product=product_of(pattern),
                     menu_path=menu, controls=tuple(_dedupe(controls)), forms=forms,
                     tabs=tuple(_COUNT.sub("", t) for t in facts["tabs"]),
                     columns=tuple(facts["columns"]), example=_path_of(url))


_RANGE = re.compile(r"^\s*(-?\d+(?:\.\d+)?) to (-?\d+(?:\.\d+)?)(?![\w.])")


def _bound(field: dict[str, Any], key: str, index: int) -> float | None:
    """A number field's bound: its ``min``/``max`` attribute, else the range its help text
    opens with ("1 to 100; a smaller number is ..."), as consoles often state it in words."""
    if field[key] is not None or field["kind"] != "number":
        return field[key]
    m = _RANGE.match(field.get("help") or "")
    return float(m.group(index + 1)) if m else None


def _path_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _dedupe(controls: Iterable[Control]) -> list[Control]:
    """One control per (role, label, where, target), in first-seen order (dialogs' controls
    last, by dialog: which dialog a visit opened first depends on the resources' order); a
    control whose target is unknown yields to one that is known (a disabled copy in another
    row)."""
    out = _first_seen(controls)
    return [c for c in out if c.where.kind is not WhereKind.DIALOG] + sorted(
        (c for c in out if c.where.kind is WhereKind.DIALOG), key=lambda c: c.where)


def _first_seen(controls: Iterable[Control]) -> list[Control]:
    out: list[Control] = []
    for c in controls:
        same = [i for i, d in enumerate(out) if (d.role, d.label, d.where) ==
                (c.role, c.label, c.where)]
        if any(out[i].target == c.target for i in same):
            continue
        unknown = [i for i in same if not out[i].target]
        if c.target and unknown:
            out[unknown[0]] = replace(c, danger=c.danger or out[unknown[0]].danger)
            continue
        if not c.target and same:
            continue
        out.append(c)
    return out


def merge(a: PageEntry, b: PageEntry) -> PageEntry:
    """Two visits of one page pattern (two resources) as one entry: controls of both (a
    disabled control's target learnt on the other), forms by what they post to."""
    forms = list(a.forms) + [f for f in b.forms if all(f.post != g.post for g in a.forms)]
    return replace(a, controls=tuple(_dedupe([*a.controls, *b.controls])), forms=tuple(forms),
                   columns=a.columns or b.columns, tabs=a.tabs or b.tabs,
                   menu_path=a.menu_path or b.menu_path)


def with_actions(entry: PageEntry,
                 controls: Mapping[tuple[str, str, str], str | tuple[str, tuple]],
                 forms: Mapping[str, str | tuple[str, tuple]]) -> PageEntry:
    """``entry`` with the API actions learnt: ``controls`` (label, where, target) -> action,
    ``forms`` post pattern -> action; an action may come with the request parameters it sent,
    as ``(action, sends)``."""
    def learnt(found: str | tuple[str, tuple] | None, action: str, sends: tuple
               ) -> dict[str, Any]:
        if found is None:
            return {"action": action, "sends": sends}
        if isinstance(found, str):
            return {"action": found, "sends": sends}
        return {"action": found[0], "sends": tuple(found[1])}
    return replace(entry, controls=tuple(
        replace(c, **learnt(controls.get((c.label, c.where, c.target)), c.action, c.sends))
        for c in entry.controls), forms=tuple(
        replace(f, **learnt(forms.get(f.post), f.action, f.sends)) for f in entry.forms))


__all__ = ["FACTS_JS", "DIALOG_JS", "Normaliser", "id_shaped", "entry_from_facts", "merge",
           "product_of",
           "target_of", "with_actions", "concrete_resources"]
