/* The portal's own script: draws the usage chart and a job's GPU charts, keeps a followed log scrolled to its end,
   announces a job's state changes to screen readers, says so when a live update fails, and follows the
   portal's event streams (Server-Sent Events, jobs/stream.py): a job event makes htmx fetch what changed,
   a log event appends its lines. While a stream is down the elements poll every 3 s as before.
   Every page works without it; htmx (static/vendor/htmx) does the live swaps. */
(function () {
  "use strict";

  function drawCharts() {
    if (!window.Chart) return;
    document.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      if (canvas.dataset.drawn) return;
      var source = document.getElementById(canvas.dataset.chart);
      if (!source) return;
      var data = JSON.parse(source.textContent);
      canvas.dataset.drawn = "1";
      if (data.kind === "line") {
        lineChart(canvas, data);
        return;
      }
      new window.Chart(canvas, {
        type: "bar",
        data: {
          // Days show as MM-DD; names (a statement's GPU models, users) as they are.
          labels: data.kind === "names" ? data.labels : data.labels.map(function (day) { return day.slice(5); }),
          datasets: [{ label: data.label, data: data.values, backgroundColor: "#2f6fbd", borderRadius: 3, maxBarThickness: 18 }],
        },
        options: {
          responsive: true,
          maintainAspectRatio: false,
          animation: false,
          plugins: {
            legend: { display: false },
            tooltip: { callbacks: { title: function (items) { return data.labels[items[0].dataIndex]; } } },
          },
          scales: {
            y: { beginAtZero: true, suggestedMax: 1, title: { display: true, text: data.label, color: "#57606a" }, ticks: { color: "#57606a", maxTicksLimit: 6 }, grid: { color: "#e4e9ef" } },
            x: { grid: { display: false }, ticks: { color: "#57606a", maxRotation: 0, autoSkip: true, maxTicksLimit: 10 } },
          },
        },
      });
    });
  }

  // A job's GPU figure over time: one line per series (mean, least busy and busiest GPU, …).
  var LINE_COLOURS = ["#2f6fbd", "#8aa9cf", "#b35c00"];
  function lineChart(canvas, data) {
    new window.Chart(canvas, {
      type: "line",
      data: {
        labels: data.labels,
        datasets: data.series.map(function (series, i) {
          return {
            label: series.label, data: series.values, borderColor: LINE_COLOURS[i % LINE_COLOURS.length],
            backgroundColor: LINE_COLOURS[i % LINE_COLOURS.length], borderWidth: i === 0 ? 2 : 1,
            pointRadius: data.labels.length > 60 ? 0 : 2, spanGaps: false, tension: 0.2,
          };
        }),
      },
      options: {
        responsive: true,
        maintainAspectRatio: false,
        animation: false,
        interaction: { mode: "index", intersect: false },
        plugins: { legend: { display: data.series.length > 1, labels: { boxWidth: 10, color: "#57606a" } } },
        scales: {
          y: { beginAtZero: true, max: data.max || undefined, title: { display: true, text: data.unit, color: "#57606a" }, ticks: { color: "#57606a", maxTicksLimit: 6 }, grid: { color: "#e4e9ef" } },
          x: { grid: { display: false }, ticks: { color: "#57606a", maxRotation: 0, autoSkip: true, maxTicksLimit: 6 } },
        },
      },
    });
  }

  // A log the reader has scrolled up in stays put; one at its end follows new lines.
  var logAtEnd = true;
  function scrollLogs() {
    document.querySelectorAll("pre.log").forEach(function (pre) {
      if (logAtEnd) pre.scrollTop = pre.scrollHeight;
    });
  }

  function announceState() {
    var announcer = document.getElementById("job-announcer");
    var state = document.getElementById("job-state");
    if (!announcer || !state) return;
    var text = announcer.dataset.prefix + " " + state.textContent.trim();
    if (announcer.dataset.last && announcer.dataset.last !== text) announcer.textContent = text;
    announcer.dataset.last = text;
  }

  function liveError(kind) {
    var box = document.getElementById("live-error");
    if (!box) return;
    if (kind) {
      box.textContent = box.dataset[kind];
      box.hidden = false;
    } else if (!box.hidden) {
      box.hidden = true;
    }
  }

  // The streams: one per kind and page, opened for the first element that names one.
  var live = { events: false, log: false };
  var streams = {};
  window.portalLive = function (kind) { return live[kind]; };

  function follow(kind, url, handlers) {
    if (streams[kind] || !url || !window.EventSource) return;
    var source = new EventSource(url);
    streams[kind] = source;
    source.onopen = function () { live[kind] = true; };
    // EventSource reconnects by itself (with Last-Event-ID); meanwhile the elements poll.
    source.onerror = function () { live[kind] = false; };
    Object.keys(handlers).forEach(function (name) {
      source.addEventListener(name, function (message) { handlers[name](JSON.parse(message.data), source); });
    });
  }

  function appendLog(data) {
    var pre = document.querySelector("#job-log pre.log");
    if (!pre) {
      document.body.dispatchEvent(new CustomEvent("portal:log"));  // the first lines: the whole card
      return;
    }
    var keep = parseInt(document.getElementById("job-log").dataset.lines, 10) || 200;
    var atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    // "whole": the stream's first lines are the log's tail as it is now (what the page shows, and more)
    var lines = ((data.whole ? "" : pre.textContent) + data.lines.join("\n") + "\n").split("\n");
    pre.textContent = lines.slice(Math.max(0, lines.length - 1 - keep)).join("\n");
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }

  function followStreams() {
    var rows = document.querySelector("[data-events]");
    if (rows) {
      follow("events", rows.dataset.events, {
        job: function (data) { document.body.dispatchEvent(new CustomEvent("portal:job", { detail: data })); },
      });
    }
    var log = document.querySelector("[data-log-stream]");
    if (log) {
      follow("log", log.dataset.logStream, {
        log: appendLog,
        end: function (data, source) {
          source.close();
          live.log = true;  // nothing more to poll for: the last refresh shows the end
          document.body.dispatchEvent(new CustomEvent("portal:log"));
        },
      });
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    drawCharts();
    scrollLogs();
    announceState();
    followStreams();
  });
  document.addEventListener("htmx:beforeSwap", function (event) {
    var pre = event.detail.target && event.detail.target.querySelector && event.detail.target.querySelector("pre.log");
    if (pre) logAtEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
  });
  document.addEventListener("htmx:afterSettle", function () {
    scrollLogs();
    announceState();
  });
  // A scenario select (data-autosubmit) reloads its form's page for the chosen scenario; the
  // form's own button does the same without JavaScript.
  document.addEventListener("change", function (event) {
    var select = event.target;
    if (select.matches && select.matches("select[data-autosubmit]") && select.form) select.form.submit();
  });
  // The sizing advisor's "Use" buttons fill the quota request form below it with an option.
  function showFillButtons() {
    document.querySelectorAll("button[data-fill-request][hidden]").forEach(function (button) { button.hidden = false; });
  }
  document.addEventListener("DOMContentLoaded", showFillButtons);
  document.addEventListener("htmx:afterSettle", showFillButtons);
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-fill-request]");
    var form = document.getElementById("quota-request-form");
    if (!button || !form) return;
    form.elements.gpu_model.value = button.dataset.gpuModel;
    form.elements.gpus.value = button.dataset.gpus;
    if (form.elements.share) form.elements.share.value = button.dataset.share || "whole";
    if (form.elements.mig_profile) form.elements.mig_profile.value = button.dataset.migProfile || "";
    form.elements.gpu_hours.value = button.dataset.gpuHours;
    form.elements.gpus.focus();
  });
  document.addEventListener("htmx:sendError", function () { liveError("offline"); });
  document.addEventListener("htmx:responseError", function () { liveError("failed"); });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.successful) liveError(null);
  });
})();
