// The jobledger console's one script: a job page follows its job live. No build step.
// The page is rendered (and escaped) by the server; when the job's live stream (Server-
// Sent Events) says it moved, this swaps in the server's fresh rendering of the same
// page rather than building any markup itself.
"use strict";

(function () {
  const live = document.getElementById("live");
  if (!live || !live.dataset.follow || !window.EventSource) return;

  let version = Number(live.dataset.version);
  let refreshing = false;
  let again = false;

  async function refresh() {
    if (refreshing) {
      again = true;
      return;
    }
    refreshing = true;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      const next = fresh.getElementById("live");
      const current = document.getElementById("live");
      if (next && current) {
        current.replaceWith(next);
        document.title = fresh.title;
      }
    } finally {
      refreshing = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  }

  const source = new EventSource(live.dataset.eventsUrl);
  function moved(event) {
    const id = Number(event.lastEventId);
    if (id > version) {
      version = id;
      refresh();
    }
  }
  for (const type of live.dataset.eventTypes.split(",")) {
    source.addEventListener(type, moved);
  }
})();
