// Draws the planning-quality plots from the page's JSON (json_script "quality-data") with the
// vendored Chart.js. Every plot's figures are also in the table below it; without JavaScript
// the tables are the page.
(function () {
  "use strict";

  var COLOURS = ["#2457c5", "#1a7f37", "#b42318", "#9a6700", "#7c3aed", "#0e7490"];

  function percent(values) {
    return values.map(function (v) { return v === null ? null : Math.round(v * 1000) / 10; });
  }

  // A line's points stay visible above the bars (lower `order` is drawn on top).
  function dataset(label, values, index, extra) {
    var set = {
      label: label,
      data: values,
      backgroundColor: COLOURS[index % COLOURS.length],
      borderColor: COLOURS[index % COLOURS.length],
      spanGaps: true,
    };
    Object.keys(extra || {}).forEach(function (key) { set[key] = extra[key]; });
    return set;
  }

  function draw(id, config) {
    var canvas = document.getElementById(id);
    if (!canvas) { return; }
    config.options = config.options || {};
    config.options.responsive = true;
    config.options.maintainAspectRatio = false;
    config.options.animation = false;
    config.options.plugins = config.options.plugins || {};
    config.options.plugins.legend = { position: "bottom" };
    canvas.dataset.drawn = "true";
    return new window.Chart(canvas, config);
  }

  function rateAxis() {
    return { position: "right", min: 0, max: 100, title: { display: true, text: "%" },
             grid: { drawOnChartArea: false } };
  }

  function start() {
    var source = document.getElementById("quality-data");
    if (!source || !window.Chart) { return; }
    var data = JSON.parse(source.textContent);
    var s = data.series;

    draw("chart-series", {
      type: "bar",
      data: {
        labels: s.labels,
        datasets: [
          dataset("cases", s.cases, 0, { yAxisID: "y", order: 2 }),
          dataset("goal verification passed (%)", percent(s.verified), 1,
                  { type: "line", yAxisID: "rate", order: 1 }),
          dataset("gate edit rate (%)", percent(s.edit_rate), 3, { type: "line", yAxisID: "rate", order: 1 }),
          dataset("gate reject rate (%)", percent(s.reject_rate), 2,
                  { type: "line", yAxisID: "rate", order: 1 }),
        ],
      },
      options: { scales: { y: { beginAtZero: true, ticks: { precision: 0 },
                                title: { display: true, text: "cases" } },
                           rate: rateAxis() } },
    });

    draw("chart-tokens", {
      type: "bar",
      data: {
        labels: s.labels,
        datasets: [
          dataset("tokens", s.tokens, 0, { yAxisID: "y", order: 2 }),
          dataset("estimated cost (USD)", s.cost, 3, { type: "line", yAxisID: "usd", order: 1 }),
        ],
      },
      options: { scales: { y: { beginAtZero: true, title: { display: true, text: "tokens" } },
                           usd: { position: "right", beginAtZero: true,
                                  title: { display: true, text: "USD" },
                                  grid: { drawOnChartArea: false } } } },
    });

    var g = data.strategies;
    draw("chart-shape", {
      type: "bar",
      data: {
        labels: g.labels,
        datasets: [
          dataset("leaves", g.leaves, 0),
          dataset("depth", g.depth, 1),
          dataset("width", g.width, 3),
          dataset("critical path (steps)", g.critical_path, 2),
        ],
      },
      options: { scales: { y: { beginAtZero: true } } },
    });

    draw("chart-times", {
      type: "bar",
      data: {
        labels: g.labels,
        datasets: [
          dataset("planning time (s)", g.planning_s, 0, { yAxisID: "y" }),
          dataset("time to approval (s)", g.approval_s, 4, { yAxisID: "approval" }),
        ],
      },
      // Seconds of planning beside minutes or hours of review: each on its own axis, so the
      // shorter one is not a sliver.
      options: { scales: { y: { beginAtZero: true,
                                title: { display: true, text: "planning time (s)" } },
                           approval: { position: "right", beginAtZero: true,
                                       title: { display: true, text: "time to approval (s)" },
                                       grid: { drawOnChartArea: false } } } },
    });

    var gates = data.gates;
    draw("chart-gates", {
      type: "bar",
      data: {
        labels: gates.labels,
        datasets: [
          dataset("edit rate (%)", percent(gates.edit_rate), 3),
          dataset("reject rate (%)", percent(gates.reject_rate), 2),
        ],
      },
      options: { scales: { y: { min: 0, max: 100, title: { display: true, text: "%" } } } },
    });

    var ratio = data.ratio;
    draw("chart-ratio", {
      type: "bar",
      data: { labels: ratio.labels,
              datasets: [dataset("makespan ÷ critical path", ratio.values, 0)] },
      options: { scales: { y: { beginAtZero: true } } },
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
