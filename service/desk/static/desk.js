// abstain label desk: fetch the next request, show it, answer with the keyboard or mouse;
// list the person's recent answers, with undo, change and "ask for review".
// No framework, no external asset. The server decides everything; this file only asks.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const desk = $("desk");
  const leaseMs = parseFloat(desk.dataset.lease) * 1000;
  let current = null;
  let mode = "answer"; // "answer" a request, give a second "opinion", answer "again" after undo
  let mine = [];
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
      const td = document.createElement("td");
      if (typeof b === "string" && b.length > 160) {  // text: a box of its own that scrolls
        const box = document.createElement("div"); box.className = "long"; box.textContent = b;
        td.append(box);
      } else {
        td.textContent = b;
      }
      tr.append(th, td); tbody.append(tr);
    }
  }

  function fmt(x) { return typeof x === "number" ? x.toFixed(4) : String(x); }

  function tick() {
    if (!current) return;
    const left = Math.max(0, current.expires_at - Date.now() / 1000);
    $("f-left").textContent = left >= 120 ? (left / 60).toFixed(1) + " min" : left.toFixed(0) + " s";
  }

  const MODES = {
    answer: "A request: nobody has answered it yet. Your answer teaches the model.",
    opinion: "Second opinion: someone else has answered this request. Give your own answer; " +
      "you will not see theirs.",
    again: "You withdrew your answer to this request. Answer it again, or press S to leave it " +
      "withdrawn.",
  };
  const PATHS = {
    answer: { answer: "/api/answer", skip: "/api/skip", renew: "/api/renew" },
    opinion: { answer: "/api/opinion", skip: "/api/opinion/skip", renew: "/api/opinion/renew" },
    again: { answer: "/api/correct", skip: null, renew: null },
  };

  function show(req, how) {
    current = req;
    mode = how || (req.second_opinion ? "opinion" : "answer");
    $("mode").hidden = !MODES[mode];
    $("mode").textContent = MODES[mode] || "";
    $("card").classList.toggle("opinion", mode === "opinion");
    $("card").classList.toggle("again", mode === "again");
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
      status(typeof done === "function" ? done(r.data) : done, "ok keep");
      next();
      refreshMine();
    } else if (r.status === 503 || r.status >= 500) {
      status("Not saved: " + (r.data.message || "Kafka is unavailable") + " The request stays open; try again.", "error");
      setBusy(false);
    } else {
      status((r.data.message || "Refused") + ".", "error keep");
      next();
    }
  }

  function answer(value) {
    let done = mode === "again" ? "Answered again. Next request…" : "Saved. Next request…";
    if (mode === "opinion") {
      done = (data) => data.can_change === false
        ? "Saved for agreement: the model has learned so many labels since the first answer " +
          "that it can no longer change it. Next request…"
        : "Saved. Next request…";
    }
    act(PATHS[mode].answer, { label: value }, done);
  }
  function skip(why) {
    if (mode === "again") { // nothing to write: the answer stays withdrawn
      if (busy) return;
      status("Left withdrawn.", "ok keep");
      next();
      return;
    }
    act(PATHS[mode].skip, { why: why }, why === "skip" ? "Skipped." : "Marked as can't tell.");
  }

  async function renew() {
    if (!current || busy || !PATHS[mode].renew) return;
    const r = await call(PATHS[mode].renew, { request_id: current.request_id }).catch(() => null);
    if (r && r.status !== 200 && r.status !== 503) {
      clear((r.data.message || "This request is no longer yours") + ".", "error");
      next();
    }
  }

  // --- my recent answers -------------------------------------------------------------

  function minutes(until) {
    const left = Math.max(0, until - Date.now() / 1000);
    return left >= 60 ? Math.ceil(left / 60) + " min left" : Math.ceil(left) + " s left";
  }

  function button(text, label, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.setAttribute("aria-label", label);
    b.addEventListener("click", onClick);
    return b;
  }

  function renderMine() {
    const tbody = $("mine-list").tBodies[0];
    tbody.replaceChildren();
    if (!mine.length) {
      const tr = document.createElement("tr");
      const td = document.createElement("td");
      td.colSpan = 5; td.className = "muted"; td.textContent = "No answers yet.";
      tr.append(td); tbody.append(tr);
      return;
    }
    for (const a of mine) {
      const tr = document.createElement("tr");
      tr.dataset.request = a.request_id;
      const cells = [a.short, a.model, a.answer, a.status].map((text) => {
        const td = document.createElement("td"); td.textContent = text; return td;
      });
      const th = document.createElement("th"); th.scope = "row"; th.append(cells[0].firstChild);
      const cell = document.createElement("td"); cell.className = "actions";
      const acts = document.createElement("div"); acts.className = "buttons";
      cell.append(acts);
      const left = a.grace_until ? " (" + minutes(a.grace_until) + ")" : "";
      for (const action of a.actions) {
        if (action === "undo") acts.append(button("Undo" + left, "Undo your answer to " + a.short, () => undo(a.request_id)));
        if (action === "change") acts.append(button("Change", "Change your answer to " + a.short, () => change(a)));
        if (action === "again") acts.append(button("Answer again" + left, "Answer " + a.short + " again", () => again(a.request_id)));
        if (action === "review") acts.append(button("Ask for review", "Ask a reviewer to look at " + a.short, () => flag(a.request_id)));
      }
      tr.append(th, cells[1], cells[2], cells[3], cell);
      tbody.append(tr);
    }
  }

  async function refreshMine() {
    const r = await call("/api/mine", {}).catch(() => null);
    if (r && r.status === 200) { mine = r.data.answers; renderMine(); }
  }

  let mineBusy = false;
  async function mineAction(path, body, done, then) {
    if (mineBusy) return;
    mineBusy = true;
    let r;
    try { r = await call(path, body); } catch (e) { r = { status: 0, data: {} }; }
    mineBusy = false;
    if (r.status === 200) { status(done, "ok keep"); if (then) then(r.data); }
    else status((r.data.message || "Refused") + ".", "error keep");
    refreshMine();
  }

  function undo(rid) {
    mineAction("/api/undo", { request_id: rid }, "Withdrawn.", (data) => {
      clearTimeout(retryTimer);
      show(data.request, "again");
      $("status").classList.remove("keep");
    });
  }
  function again(rid) {
    mineAction("/api/again", { request_id: rid }, "Answer it again.", (data) => {
      clearTimeout(retryTimer);
      show(data.request, "again");
    });
  }
  function change(a) {
    const other = a.label === 1 ? -1 : 1;
    mineAction("/api/correct", { request_id: a.request_id, label: other }, "Changed.");
  }
  function flag(rid) { mineAction("/api/flag", { request_id: rid }, "Sent to a reviewer."); }

  function undoLast() {
    const last = mine.find((a) => a.actions.includes("undo"));
    if (last) undo(last.request_id);
    else if (!mine.length) status("Nothing to undo: you have not answered a request yet " +
      "(a second opinion is not undone).", "error keep");
    else if (mine[0].status.endsWith("too old to change")) status("Nothing to undo: the " +
      "model has learned so many labels since your last answer that it can no longer " +
      "change it.", "error keep");
    else status("Nothing to undo: your recent answers are past the time to undo them; " +
      "ask for a review instead.", "error keep");
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
    else if (key === "u") { ev.preventDefault(); undoLast(); }
  });
  renewTimer = setInterval(renew, Math.max(2000, leaseMs / 4));
  clockTimer = setInterval(tick, 1000);
  const mineTimer = setInterval(refreshMine, 15000);
  window.addEventListener("beforeunload", () => {
    clearInterval(renewTimer); clearInterval(clockTimer); clearInterval(mineTimer);
  });
  next();
  refreshMine();
})();
