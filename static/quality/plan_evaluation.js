// Draws one bar chart per model on the plan-evaluation page from its JSON (json_script
// "evaluation-data") with the vendored Chart.js. The table under each plot has the same figures.
(function () {
  "use strict";

  var COLOURS = ["#1a7f37", "#2457c5", "#9a6700", "#7c3aed"];

  function start() {
    var source = document.getElementById("evaluation-data");
    if (!source || !window.Chart) { return; }
    var data = JSON.parse(source.textContent);
    document.querySelectorAll("canvas[data-model]").forEach(function (canvas) {
      var model = data[canvas.dataset.model];
      if (!model) { return; }
      var series = [
        ["valid plans (%)", model.valid],
        ["delivered plans (%)", model.delivered],
        ["node F1 (0 to 100)", model.node_f1],
        ["edge F1 (0 to 100)", model.edge_f1],
      ];
      canvas.dataset.drawn = "true";
      new window.Chart(canvas, {
        type: "bar",
        data: {
          labels: model.labels,
          datasets: series.map(function (entry, index) {
            return { label: entry[0], data: entry[1], backgroundColor: COLOURS[index] };
          }),
        },
        options: {
          responsive: true,
          maintainAspectRatio: false,
          animation: false,
          plugins: { legend: { position: "bottom" } },
          scales: { y: { min: 0, max: 100 } },
        },
      });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
}());
