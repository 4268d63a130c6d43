// abstain label desk, review page: a reviewer's final answer to the answer opened, with the
// mouse or the keyboard (1, 2). No framework, no external asset; the server decides.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const item = document.getElementById("item");
  const status = document.getElementById("status");
  const done = new URLSearchParams(window.location.search).get("done");
  if (done) {
    status.textContent = "Saved: " + done + ".";
    status.className = "ok";
  }
  if (!item) return;
  const buttons = item.querySelectorAll("[data-review]");
  let busy = false;

  async function decide(value) {
    if (busy || !buttons.length) return;
    busy = true;
    for (const b of buttons) b.disabled = true;
    status.textContent = "Saving…";
    status.className = "";
    let resp, data = {};
    try {
      resp = await fetch("/api/review", {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
        body: JSON.stringify({ request_id: item.dataset.request, label: value }),
      });
      try { data = await resp.json(); } catch (e) { data = {}; }
    } catch (e) {
      resp = null;
    }
    if (resp && resp.status === 200) {
      const what = data.decided === "confirmed" ? "confirmed" : "corrected";
      window.location.assign("/review?done=" + encodeURIComponent(item.dataset.request.slice(0, 12) + " " + what));
      return;
    }
    status.textContent = "Not saved: " + ((data && data.message) || "the desk does not answer") + ".";
    status.className = "error";
    busy = false;
    for (const b of buttons) b.disabled = false;
  }

  for (const b of buttons) b.addEventListener("click", () => decide(parseInt(b.dataset.review, 10)));
  document.addEventListener("keydown", (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const tag = (ev.target && ev.target.tagName) || "";
    if (tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA") return;
    if (ev.key === "1") { ev.preventDefault(); decide(1); }
    else if (ev.key === "2") { ev.preventDefault(); decide(-1); }
  });
  if (buttons.length) buttons[0].focus();
})();
