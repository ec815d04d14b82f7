/* The TCO view's chart (templates/reports/tco.html): the cost per delivered GPU-hour from 10 % to
   100 % utilization, each cloud price as a horizontal line, and the point where it breaks even.
   The page reads the same without it: the table beside the chart holds every figure. */
(function () {
  "use strict";
  var COLOURS = ["#b35c00", "#1a7f37", "#8250df", "#cf222e", "#57606a"];

  function draw() {
    var canvas = document.querySelector("canvas[data-tco-chart]");
    if (!canvas || !window.Chart) return;
    var data = JSON.parse(document.getElementById(canvas.dataset.tcoChart).textContent);
    var datasets = [{
      label: data.label, borderColor: "#2f6fbd", backgroundColor: "#2f6fbd", borderWidth: 2, tension: 0.2,
      data: data.curve.map(function (p) { return { x: Number(p[0]), y: Number(p[1]) }; }),
    }];
    data.clouds.forEach(function (cloud, i) {
      var colour = COLOURS[i % COLOURS.length];
      datasets.push({
        label: cloud.label + " (" + cloud.price + ")", borderColor: colour, backgroundColor: colour,
        borderDash: [6, 4], borderWidth: 1.5, pointRadius: 0,
        data: [{ x: 0, y: Number(cloud.price) }, { x: 100, y: Number(cloud.price) }],
      });
      if (cloud.break_even !== null) {
        datasets.push({
          type: "scatter", label: cloud.label + ": " + cloud.break_even + " %", borderColor: colour,
          backgroundColor: colour, pointRadius: 6, pointStyle: "rectRot",
          data: [{ x: Number(cloud.break_even), y: Number(cloud.price) }],
        });
      }
    });
    new window.Chart(canvas, {
      type: "line",
      data: { datasets: datasets },
      options: {
        responsive: true, maintainAspectRatio: false, animation: false, parsing: false,
        plugins: { legend: { labels: { boxWidth: 10, color: "#57606a" } } },
        scales: {
          x: { type: "linear", min: 0, max: 100, title: { display: true, text: "%", color: "#57606a" }, ticks: { color: "#57606a" } },
          y: { beginAtZero: true, title: { display: true, text: data.currency, color: "#57606a" }, ticks: { color: "#57606a" } },
        },
      },
    });
  }

  document.addEventListener("DOMContentLoaded", draw);
})();
