// The jobledger console's one script: a job page follows its job live. No build step.
// The page is rendered (and escaped) by the server; on a change this swaps in the
// server's fresh rendering of the same page rather than building any markup here.
"use strict";

(function () {
  const live = document.getElementById("live");
  if (!live || !live.dataset.follow) return;

  let version = Number(live.dataset.version);
  let refreshing = false;

  async function refresh() {
    if (refreshing) return;
    refreshing = true;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      const next = fresh.getElementById("live");
      const current = document.getElementById("live");
      if (next && current) {
        current.replaceWith(next);
        version = Number(next.dataset.version);
      }
    } finally {
      refreshing = false;
    }
  }

  function changed(newVersion) {
    if (newVersion > version) refresh();
  }

  // Live: the job's event stream (Server-Sent Events), when the server offers one.
  if (live.dataset.eventsUrl && window.EventSource) {
    const source = new EventSource(live.dataset.eventsUrl);
    source.onmessage = function (event) {
      const id = Number(event.lastEventId);
      changed(Number.isFinite(id) && id > 0 ? id : version + 1);
    };
    return;
  }
  // Otherwise ask for the job's version once a second.
  setInterval(async function () {
    const response = await fetch(live.dataset.versionUrl, { credentials: "same-origin" });
    if (response.ok) changed((await response.json()).version);
  }, 1000);
})();
