/* The portal's own script: draws the usage chart and a job's GPU charts, keeps a followed log scrolled to its end,
   announces a job's state changes to screen readers, and says so when a live update fails.
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
          labels: data.labels.map(function (day) { return day.slice(5); }),
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

  document.addEventListener("DOMContentLoaded", function () {
    drawCharts();
    scrollLogs();
    announceState();
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
    form.elements.gpu_hours.value = button.dataset.gpuHours;
    form.elements.gpus.focus();
  });
  document.addEventListener("htmx:sendError", function () { liveError("offline"); });
  document.addEventListener("htmx:responseError", function () { liveError("failed"); });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.successful) liveError(null);
  });
})();
