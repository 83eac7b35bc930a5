// leasekit dashboard: live updates for pages that ask for them (body[data-refresh] > 0).
// It re-fetches the same page and swaps the parts marked [data-live] by id. The
// server escapes every value; nothing here builds HTML from data. Paused while the
// tab is hidden; never on pages where looking costs (they set no refresh).
(function () {
  "use strict";
  var seconds = Number(document.body.getAttribute("data-refresh") || "0");
  if (!(seconds > 0)) return;
  var busy = false;
  function tick() {
    if (busy || document.visibilityState !== "visible") return;
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (old) {
          var fresh = old.id ? doc.getElementById(old.id) : null;
          if (fresh) old.replaceWith(document.importNode(fresh, true));
        });
        var state = doc.body.getAttribute("data-refresh");
        if (state === "0") window.clearInterval(timer);
      })
      .catch(function () { /* the next tick tries again */ })
      .finally(function () { busy = false; });
  }
  var timer = window.setInterval(tick, seconds * 1000);
  document.addEventListener("visibilitychange", tick);
})();
