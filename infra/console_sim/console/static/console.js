// Console behaviour: menus, confirmation dialogs, wizards, dependent selects, submit guards,
// toasts and live status refresh. Everything works on server-rendered markup; no framework.
"use strict";

(function () {
  const $ = (sel, root = document) => root.querySelector(sel);
  const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

  // ---- menus: the product menu and "More" action menus --------------------------------------
  function closeMenus(except) {
    $$('[aria-haspopup="menu"][aria-expanded="true"], .menu-toggle[aria-expanded="true"]').forEach((b) => {
      if (b === except) return;
      b.setAttribute("aria-expanded", "false");
      const menu = b.classList.contains("menu-toggle") ? document.getElementById(b.getAttribute("aria-controls")) : b.nextElementSibling;
      if (menu) menu.hidden = true;
    });
  }
  document.addEventListener("click", (ev) => {
    const toggle = ev.target.closest('[aria-haspopup="menu"], .menu-toggle');
    if (toggle) {
      const open = toggle.getAttribute("aria-expanded") !== "true";
      closeMenus(toggle);
      toggle.setAttribute("aria-expanded", String(open));
      const menu = toggle.classList.contains("menu-toggle") ? document.getElementById(toggle.getAttribute("aria-controls")) : toggle.nextElementSibling;
      if (menu) {
        menu.hidden = !open;
        const first = open && menu.querySelector('[role="menuitem"]:not([disabled])');
        if (first) first.focus();
      }
      return;
    }
    if (!ev.target.closest('[role="menu"], .product-menu')) closeMenus(null);
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") closeMenus(null);
  });

  // ---- confirmation dialog -------------------------------------------------------------------
  const dialog = $("#confirm-dialog");
  function openConfirm(btn) {
    const form = $("#confirm-form");
    form.action = btn.dataset.action;
    $("#confirm-title").textContent = btn.textContent.trim();
    $("#confirm-message").textContent = btn.dataset.confirm;
    const holder = $("#confirm-params");
    holder.replaceChildren();
    for (const [k, v] of JSON.parse(btn.dataset.params || "[]")) {
      const input = document.createElement("input");
      input.type = "hidden"; input.name = k; input.value = v;
      holder.appendChild(input);
    }
    const ok = $("#confirm-ok");
    ok.disabled = false;
    const typed = $("#confirm-typed");
    if (typed) {
      const expected = btn.dataset.confirmId || "";
      typed.hidden = !expected;
      const input = $("#confirm-input");
      input.value = "";
      input.disabled = !expected;
      $("#confirm-expected").textContent = expected;
      ok.disabled = Boolean(expected);
      input.oninput = () => { ok.disabled = input.value.trim() !== expected; };
    }
    closeMenus(null);
    dialog.showModal();
    const focus = typed && !typed.hidden ? $("#confirm-input") : ok;
    focus.focus();
  }
  document.addEventListener("click", (ev) => {
    const btn = ev.target.closest("button[data-confirm]");
    if (btn && !btn.disabled) { ev.preventDefault(); openConfirm(btn); }
    if (ev.target.closest("[data-dialog-cancel]")) dialog.close();
  });

  // ---- forms: one submit at a time --------------------------------------------------------------
  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    if (form.method.toLowerCase() !== "post") return;
    if (form.dataset.submitting) { ev.preventDefault(); return; }
    form.dataset.submitting = "1";
    form.setAttribute("aria-busy", "true");
    // Disabled after the event, so the browser still sends the form.
    // form.elements also holds buttons that belong to the form from elsewhere (form="...").
    const buttons = Array.from(form.elements).filter((b) => b.tagName === "BUTTON" && b.type === "submit");
    setTimeout(() => buttons.forEach((b) => {
      b.disabled = true;
      b.classList.add("is-loading");
    }), 0);
  });
  window.addEventListener("pageshow", (ev) => {   // back/forward cache: re-enable
    if (!ev.persisted) return;
    $$("form[data-submitting]").forEach((f) => {
      delete f.dataset.submitting;
      f.removeAttribute("aria-busy");
      Array.from(f.elements).filter((b) => b.classList.contains("is-loading")).forEach((b) => {
        b.disabled = false; b.classList.remove("is-loading");
      });
    });
  });
  $$("select[data-autosubmit]").forEach((s) => s.addEventListener("change", () => s.form.requestSubmit()));

  // ---- wizards ------------------------------------------------------------------------------
  $$("form[data-wizard]").forEach((form) => {
    const steps = $$("fieldset.step", form);
    const marks = $$("[data-step-indicator]", form);
    let current = Number(form.dataset.activeStep || 0);
    const show = (i) => {
      current = Math.max(0, Math.min(steps.length - 1, i));
      steps.forEach((s, n) => { s.hidden = n !== current; });
      marks.forEach((m, n) => {
        if (n === current) m.setAttribute("aria-current", "step"); else m.removeAttribute("aria-current");
        m.classList.toggle("done", n < current);
      });
      $("[data-prev]", form).hidden = current === 0;
      $("[data-next]", form).hidden = current === steps.length - 1;
      $("[data-submit]", form).hidden = current !== steps.length - 1;
      const first = steps[current].querySelector("input:not([type=hidden]):not([readonly]), select, textarea");
      if (first && document.activeElement && document.activeElement !== document.body) first.focus();
    };
    $("[data-prev]", form).addEventListener("click", () => show(current - 1));
    $("[data-next]", form).addEventListener("click", () => show(current + 1));
    form.addEventListener("keydown", (ev) => {   // Enter moves on instead of submitting early
      if (ev.key === "Enter" && ev.target.tagName === "INPUT" && current < steps.length - 1) {
        ev.preventDefault(); show(current + 1);
      }
    });
    show(current);
  });

  // ---- dependent selects (a vSwitch list filtered by the chosen VPC and zone) ----------------
  $$("select[data-filter-by]").forEach((select) => {
    const form = select.form;
    const names = select.dataset.filterBy.split(" ");
    const apply = () => {
      for (const opt of select.options) {
        if (!opt.value) continue;
        const ok = names.every((n) => {
          const src = form.elements[n];
          const want = src ? src.value : "";
          return !want || opt.dataset[n.toLowerCase()] === want;
        });
        opt.hidden = !ok; opt.disabled = !ok;
      }
      if (select.selectedOptions[0] && select.selectedOptions[0].disabled) select.value = "";
    };
    names.forEach((n) => {
      const src = form.elements[n];
      if (!src) return;
      (src instanceof RadioNodeList ? Array.from(src) : [src]).forEach((el) => el.addEventListener("change", apply));
    });
    apply();
  });

  // ---- tabs ---------------------------------------------------------------------------------
  $$("[data-tabs]").forEach((box) => {
    const tabs = $$('[role="tab"]', box);
    const select = (tab) => tabs.forEach((t) => {
      const on = t === tab;
      t.setAttribute("aria-selected", String(on));
      t.tabIndex = on ? 0 : -1;
      document.getElementById(t.getAttribute("aria-controls")).hidden = !on;
    });
    tabs.forEach((t, i) => {
      t.addEventListener("click", () => select(t));
      t.addEventListener("keydown", (ev) => {
        const d = ev.key === "ArrowRight" ? 1 : ev.key === "ArrowLeft" ? -1 : 0;
        if (d) { const n = tabs[(i + d + tabs.length) % tabs.length]; select(n); n.focus(); }
      });
    });
  });

  // ---- toasts -------------------------------------------------------------------------------
  $$(".toast").forEach((t) => {
    $(".toast-close", t).addEventListener("click", () => t.remove());
    if (!t.classList.contains("toast-error")) setTimeout(() => t.remove(), 8000);
  });

  // ---- live status: refresh while something is Pending, Starting or Stopping -----------------
  const busy = () => document.querySelector("#live[data-transitional]");
  async function refresh() {
    if (!busy()) return;
    const interacting = (dialog && dialog.open) || $('[aria-expanded="true"]');
    if (!interacting) {
      try {
        const resp = await fetch(location.href, { headers: { "X-Console-Refresh": "1" }, credentials: "same-origin" });
        if (resp.ok && resp.url === location.href) {
          const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
          const fresh = doc.getElementById("live");
          const live = document.getElementById("live");
          if (fresh && live) {
            live.replaceWith(document.importNode(fresh, true));
          }
        }
      } catch (e) { /* the next tick tries again */ }
    }
    if (busy()) setTimeout(refresh, 1000);
  }
  if (busy()) setTimeout(refresh, 1000);
})();
