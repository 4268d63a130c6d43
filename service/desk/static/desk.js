// abstain label desk: fetch the next request, show it, answer with the keyboard or mouse.
// No framework, no external asset. The server decides everything; this file only asks.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const desk = $("desk");
  const leaseMs = parseFloat(desk.dataset.lease) * 1000;
  let current = null;
  let busy = false;
  let renewTimer = null;
  let retryTimer = null;
  let clockTimer = null;

  function status(text, kind) {
    const el = $("status");
    el.textContent = text;
    el.className = kind || "";
  }

  async function call(path, body) {
    const resp = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(body || {}),
    });
    if (resp.status === 401) { window.location.assign("/login"); throw new Error("login"); }
    let data = {};
    try { data = await resp.json(); } catch (e) { data = {}; }
    return { status: resp.status, data: data };
  }

  function fill(tbody, rows) {
    tbody.replaceChildren();
    for (const [a, b] of rows) {
      const tr = document.createElement("tr");
      const th = document.createElement("th"); th.scope = "row"; th.textContent = a;
      const td = document.createElement("td"); td.textContent = b;
      tr.append(th, td); tbody.append(tr);
    }
  }

  function fmt(x) { return typeof x === "number" ? x.toFixed(4) : String(x); }

  function tick() {
    if (!current) return;
    const left = Math.max(0, current.expires_at - Date.now() / 1000);
    $("f-left").textContent = left >= 120 ? (left / 60).toFixed(1) + " min" : left.toFixed(0) + " s";
  }

  function show(req) {
    current = req;
    $("rid").textContent = req.request_id.slice(0, 12);
    $("f-model").textContent = req.model;
    $("f-decision").textContent = req.decision;
    $("f-score").textContent = fmt(req.score);
    $("f-rho").textContent = fmt(req.rho);
    $("f-qp").textContent = fmt(req.query_probability);
    $("a-pos").querySelector("span").textContent = req.answers.pos;
    $("a-neg").querySelector("span").textContent = req.answers.neg;
    $("a-pos").setAttribute("aria-label", "Answer " + req.answers.pos + " (key 1)");
    $("a-neg").setAttribute("aria-label", "Answer " + req.answers.neg + " (key 2)");
    fill($("features").tBodies[0], req.features.map((f) => [f.name, fmt(f.value)]));
    const top = $("top");
    top.hidden = !req.top.length;
    fill(top.tBodies[0], req.top.map((f) => [f.name, fmt(f.contribution)]));
    $("card").hidden = false;
    tick();
    setBusy(false);
    $("a-pos").focus();
  }

  function clear(text, kind) {
    current = null;
    $("card").hidden = true;
    status(text, kind);
  }

  function setBusy(on) {
    busy = on;
    for (const b of document.querySelectorAll(".answers button")) b.disabled = on;
  }

  async function next() {
    clearTimeout(retryTimer);
    setBusy(true);
    let r;
    try {
      r = await call("/api/next", { model: $("model").value || null });
    } catch (e) {
      clear("The desk does not answer; trying again in 5 s.", "error");
      retryTimer = setTimeout(next, 5000);
      return;
    }
    if (r.status === 200 && r.data.request) {
      show(r.data.request);
      if (!$("status").classList.contains("keep")) status("Request " + r.data.request.request_id.slice(0, 12) + " is yours until you answer or leave.");
      $("status").classList.remove("keep");
    } else if (r.status === 200) {
      clear("No open request right now. Checking again every 5 s.");
      retryTimer = setTimeout(next, 5000);
    } else {
      clear((r.data.message || "The desk refused") + " Trying again in 5 s.", "error");
      retryTimer = setTimeout(next, 5000);
    }
  }

  async function act(path, body, done) {
    if (!current || busy) return;
    setBusy(true);
    status("Saving…");
    let r;
    try {
      r = await call(path, Object.assign({ request_id: current.request_id }, body));
    } catch (e) {
      status("Not saved: the desk does not answer. The request stays open; try again.", "error");
      setBusy(false);
      return;
    }
    if (r.status === 200) {
      status(done, "ok keep");
      next();
    } else if (r.status === 503 || r.status >= 500) {
      status("Not saved: " + (r.data.message || "Kafka is unavailable") + " The request stays open; try again.", "error");
      setBusy(false);
    } else {
      status((r.data.message || "Refused") + ".", "error keep");
      next();
    }
  }

  function answer(value) { act("/api/answer", { label: value }, "Saved. Next request…"); }
  function skip(why) { act("/api/skip", { why: why }, why === "skip" ? "Skipped." : "Marked as can't tell."); }

  async function renew() {
    if (!current || busy) return;
    const r = await call("/api/renew", { request_id: current.request_id }).catch(() => null);
    if (r && r.status !== 200 && r.status !== 503) {
      clear((r.data.message || "This request is no longer yours") + ".", "error");
      next();
    }
  }

  for (const b of document.querySelectorAll("[data-answer]")) {
    b.addEventListener("click", () => answer(parseInt(b.dataset.answer, 10)));
  }
  for (const b of document.querySelectorAll("[data-skip]")) {
    b.addEventListener("click", () => skip(b.dataset.skip));
  }
  $("model").addEventListener("change", () => { clear("Loading…"); next(); });
  document.addEventListener("keydown", (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const tag = (ev.target && ev.target.tagName) || "";
    if (tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA") return;
    const key = ev.key.toLowerCase();
    if (key === "1") { ev.preventDefault(); answer(1); }
    else if (key === "2") { ev.preventDefault(); answer(-1); }
    else if (key === "s") { ev.preventDefault(); skip("skip"); }
    else if (key === "c") { ev.preventDefault(); skip("cant_tell"); }
    else if (key === "r") { ev.preventDefault(); if (!current) next(); }
  });
  renewTimer = setInterval(renew, Math.max(2000, leaseMs / 4));
  clockTimer = setInterval(tick, 1000);
  window.addEventListener("beforeunload", () => { clearInterval(renewTimer); clearInterval(clockTimer); });
  next();
})();
