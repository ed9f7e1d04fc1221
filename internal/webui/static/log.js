// harmonia-ci: follow a running build's log on its page. Hand-written, no dependencies; the
// page works without it (it shows the tail as it was when loaded).
//
// <pre id="log" data-stream="/api/builds/{id}/log"> is replaced by each "tail" event (the
// whole current tail, as text); "end" says the build finished: the page is reloaded to show
// its result and archived log.
(function () {
  "use strict";
  var pre = document.getElementById("log");
  if (!pre) {
    return;
  }
  pre.scrollTop = pre.scrollHeight; // the end of a log is what people look for
  var src = pre.getAttribute("data-stream");
  if (!src || !window.EventSource) {
    return;
  }
  var status = document.getElementById("log-status");
  var say = function (text) {
    if (status) {
      status.textContent = text;
    }
  };
  var es = new EventSource(src);
  say("Following the log…");
  es.addEventListener("tail", function (e) {
    var atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 16;
    pre.textContent = e.data;
    if (atEnd) {
      pre.scrollTop = pre.scrollHeight;
    }
  });
  es.addEventListener("end", function () {
    es.close();
    say("The build finished: loading its result…");
    window.location.reload();
  });
  es.addEventListener("error", function () {
    if (es.readyState === EventSource.CLOSED) {
      say("Live updates stopped: reload the page for newer output.");
    }
  });
})();
