"""Filling and sending a console form with generated valid values, through the page's DOM.

Values come from what the form itself says: a field's current value is kept; a required
select or radio group gets its first choice still offered (dependent selects are read again
after each choice); a text field gets its placeholder when that is an example value (it has a
digit: ``192.168.1.0/24``, ``22/22``), the field's minimum for numbers, and otherwise a name
made of the crawl's id (so a resource it creates carries the crawl's id, lowercase, starting
with a letter: valid for the name rules consoles state), cut to ``maxlength``. Optional fields
without an example are left empty. A wizard is walked step by step (its visible next button)
until its submit button shows.
"""
from __future__ import annotations

from typing import Any

from playwright.async_api import Page

PLAN_JS = r"""
(i) => {
  const clean = (s) => (s || "").replace(/\s+/g, " ").trim();
  const shown = (el) => !!el && el.getClientRects().length > 0 &&
      getComputedStyle(el).visibility !== "hidden";
  const form = document.querySelector(`form[data-crawl-form="${i}"]`);
  if (!form) return null;
  for (const a of ["data-crawl-f", "data-crawl-submit", "data-crawl-next"])
    form.querySelectorAll(`[${a}]`).forEach((e) => e.removeAttribute(a));
  const fields = [];
  const radios = new Set();
  let k = 0;
  for (const el of form.querySelectorAll("input, select, textarea")) {
    const type = (el.getAttribute("type") || "").toLowerCase();
    if (["hidden", "submit", "button", "reset", "image", "file"].includes(type)) continue;
    if (el.disabled || el.readOnly) continue;
    const group = type === "radio" ? Array.from(form.querySelectorAll(
        `input[type=radio][name="${CSS.escape(el.name)}"]`)) : [el];
    if (type === "radio") { if (radios.has(el.name)) continue; radios.add(el.name); }
    if (!group.some((g) => shown(g) || shown(g.closest("label")))) continue;
    el.setAttribute("data-crawl-f", String(k));
    const label = el.id && form.querySelector(`label[for="${el.id}"]`) ?
        clean(form.querySelector(`label[for="${el.id}"]`).textContent) :
        clean(el.getAttribute("aria-label") || el.name);
    fields.push({k, kind: el.tagName === "SELECT" ? "select" : type === "radio" ? "radio" :
                 type === "checkbox" ? "checkbox" : el.tagName === "TEXTAREA" ? "textarea" :
                 (type === "number" || el.getAttribute("inputmode") === "numeric") ? "number" :
                 "text",
                 name: el.name, label, value: type === "radio" ? "" : el.value,
                 checked: group.some((g) => g.checked),
                 required: el.required || el.getAttribute("aria-required") === "true",
                 placeholder: el.getAttribute("placeholder") || "",
                 min: el.getAttribute("min") || "", maxlength: el.maxLength > 0 ? el.maxLength : 0});
    k += 1;
  }
  const buttons = Array.from(form.querySelectorAll("button, input[type=submit]")).filter(shown);
  const submit = buttons.find((b) => (b.getAttribute("type") || "submit") === "submit");
  const nexts = buttons.filter((b) => b.getAttribute("type") === "button");
  if (submit) submit.setAttribute("data-crawl-submit", "1");
  if (nexts.length) nexts[nexts.length - 1].setAttribute("data-crawl-next", "1");
  return {fields, submit: !!submit, next: nexts.length > 0};
}
"""

# The values a select or radio group offers now (dependent selects hide choices).
CHOICES_JS = r"""
(k) => {
  const el = document.querySelector(`[data-crawl-f="${k}"]`);
  if (!el) return [];
  if (el.tagName === "SELECT")
    return Array.from(el.options).filter((o) => o.value !== "" && !o.hidden && !o.disabled)
        .map((o) => o.value);
  return Array.from(el.form.querySelectorAll(`input[type=radio][name="${CSS.escape(el.name)}"]`))
      .filter((r) => !r.disabled).map((r) => r.value);
}
"""


def text_value(field: dict[str, Any], seed: str) -> str | None:
    """What to type into a text, number or textarea field (None: leave it)."""
    if field["value"]:
        return None
    example = field["placeholder"]
    if example and any(ch.isdigit() for ch in example):
        return example
    if field["kind"] == "number":
        return field["min"] or "1" if field["required"] else None
    if not field["required"] and "name" not in field["label"].lower():
        return None
    value = seed if field["kind"] != "textarea" else f"made by {seed}"
    return value[:field["maxlength"]] if field["maxlength"] else value


async def fill_and_send(page: Page, form_index: int, seed: str, timeout_ms: float) -> bool:
    """Fill form ``form_index`` (its ``data-crawl-form`` number) and send it; False when no
    submit button could be reached."""
    for _ in range(12):                       # wizard steps
        plan = await page.evaluate(PLAN_JS, form_index)
        if plan is None:
            return False
        for f in plan["fields"]:
            target = page.locator(f'[data-crawl-f="{f["k"]}"]')
            if f["kind"] == "select":
                if f["value"] or not f["required"]:
                    continue
                choices = await page.evaluate(CHOICES_JS, f["k"])
                if choices:
                    await target.select_option(value=choices[0], timeout=timeout_ms)
            elif f["kind"] == "radio":
                if f["checked"] or not f["required"]:
                    continue
                choices = await page.evaluate(CHOICES_JS, f["k"])
                if choices:
                    name = f["name"].replace('"', '\\"')
                    await page.locator(f'input[type=radio][name="{name}"]'
                                       f'[value="{choices[0]}"]').check(force=True,
                                                                        timeout=timeout_ms)
            elif f["kind"] in ("text", "number", "textarea"):
                value = text_value(f, seed)
                if value is not None:
                    await target.fill(value, timeout=timeout_ms)
        if plan["submit"]:
            async with page.expect_navigation(timeout=timeout_ms * 3):
                await page.locator('[data-crawl-submit="1"]').first.click(timeout=timeout_ms)
            return True
        if not plan["next"]:
            return False
        await page.locator('[data-crawl-next="1"]').first.click(timeout=timeout_ms)
    return False
