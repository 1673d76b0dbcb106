// Keeps a page current while its tab is visible, unless paused: every few seconds its live parts
// ([data-live]) are replaced by the same parts (by id) of the page fetched again, and the parts
// with their own source ([data-src], the health strip) by what that source answers; the health
// strip is filled once at load in any case. Answers come from this server and are parsed as inert
// documents: nothing in them runs, and the forms outside the live parts keep what the user typed.
(function () {
  "use strict";
  const period = Number(document.body.dataset.refreshMs) || 5000;
  const toggle = document.getElementById("refresh-toggle");
  const key = "aijobs-refresh-paused";
  let paused = sessionStorage.getItem(key) === "1";
  let busy = false;

  function show() {
    toggle.textContent = paused ? "Resume refresh" : "Pause refresh";
    toggle.setAttribute("aria-pressed", String(paused));
    document.documentElement.dataset.refresh = paused ? "paused" : "on";
  }

  async function replace(url, parts) {
    const answer = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    if (!answer.ok) {
      return;
    }
    const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
    for (const part of parts) {
      const next = fresh.getElementById(part.id);
      if (next !== null) {
        part.replaceWith(document.adoptNode(next));
      }
    }
  }

  function sourced() {
    return Array.from(document.querySelectorAll("[data-src]"), function (part) {
      return replace(part.dataset.src, [part]);
    });
  }

  async function refresh() {
    if (paused || busy || document.visibilityState !== "visible") {
      return;
    }
    busy = true;
    try {
      const live = Array.from(document.querySelectorAll("[data-live]"));
      await Promise.all([live.length ? replace(window.location.href, live) : null, ...sourced()]);
    } catch (error) {
      // The server is gone or restarting: the next tick tries again.
    } finally {
      busy = false;
    }
  }

  toggle.addEventListener("click", function () {
    paused = !paused;
    sessionStorage.setItem(key, paused ? "1" : "0");
    show();
    refresh();
  });
  document.addEventListener("visibilitychange", refresh);
  window.setInterval(refresh, period);
  show();
  Promise.all(sourced()).catch(function () {});
})();
