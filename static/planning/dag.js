// Draw every [data-dot] element as SVG with the vendored Graphviz WebAssembly build (Viz.js),
// again whenever htmx swaps new content in, and open a step's detail in #node-panel on click.
// The step panel is the one source of the selection: whatever it shows (after a click, a link
// in the table or the panel, a reload of a step's URL, a poll) is highlighted in the graph and
// the task table.
(function () {
  "use strict";

  var XLINK = "http://www.w3.org/1999/xlink";
  var vizReady = null;
  // Last drawing per [data-dot-key]: a poll that brings the same DOT back reuses it, and a
  // changed DOT shows the previous drawing until the new one is laid out (no flicker).
  var drawings = new Map();

  function viz() {
    if (!vizReady) vizReady = window.Viz.instance();
    return vizReady;
  }

  function hrefOf(link) {
    return link.getAttribute("href") || link.getAttributeNS(XLINK, "href");
  }

  function selection() {
    var panel = document.getElementById("node-panel");
    return {
      url: (panel && panel.getAttribute("data-node-url")) || null,
      key: (panel && panel.getAttribute("data-node")) || null,
    };
  }

  function markSelected(root) {
    var selected = selection();
    root.querySelectorAll("g.node").forEach(function (node) {
      var link = node.querySelector("a");
      node.classList.toggle("selected", !!selected.url && !!link && hrefOf(link) === selected.url);
    });
  }

  function markRows() {
    var key = selection().key;
    document.querySelectorAll("#task-table tbody tr[data-key]").forEach(function (row) {
      var on = key !== null && row.getAttribute("data-key") === key;
      row.classList.toggle("selected", on);
      if (on) row.setAttribute("aria-current", "true");
      else row.removeAttribute("aria-current");
    });
  }

  function markAll() {
    document.querySelectorAll("[data-dot]").forEach(markSelected);
    markRows();
  }

  function show(el, svg) {
    // Natural size (Graphviz points), shrunk by CSS to fit: small plans are not blown up.
    svg.setAttribute("preserveAspectRatio", "xMinYMin meet");
    svg.setAttribute("focusable", "false");
    el.replaceChildren(svg);
    el.dataset.rendered = "true";
    markSelected(el);
  }

  function draw(el) {
    var dot = el.getAttribute("data-dot");
    if (!dot || el.dataset.drawing === dot) return;
    el.dataset.drawing = dot;
    var key = el.getAttribute("data-dot-key") || dot;
    var last = drawings.get(key);
    if (last && last.dot === dot) {
      show(el, last.svg.cloneNode(true));
      return;
    }
    if (last) show(el, last.svg.cloneNode(true));
    viz()
      .then(function (instance) {
        var svg = instance.renderSVGElement(dot);
        drawings.set(key, { dot: dot, svg: svg.cloneNode(true) });
        if (el.isConnected) show(el, svg);
      })
      .catch(function (error) {
        var message = document.createElement("p");
        message.className = "error";
        message.textContent = "The graph could not be drawn (" + error + "). The task table lists every step.";
        el.replaceChildren(message);
      });
  }

  function drawAll(root) {
    var scope = root && root.querySelectorAll ? root : document;
    if (scope.matches && scope.matches("[data-dot]")) draw(scope);
    scope.querySelectorAll("[data-dot]").forEach(draw);
  }

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("[data-dot] a");
    if (!link || event.ctrlKey || event.metaKey || event.shiftKey) return;
    var href = hrefOf(link);
    if (!href || !document.getElementById("node-panel") || !window.htmx) return;
    event.preventDefault();
    // The answer pushes the step's URL (HX-Push-Url), so reload shows this step again.
    window.htmx.ajax("GET", href, { target: "#node-panel", swap: "outerHTML" });
  });

  // Keyboard users reach the SVG links with Tab; Enter follows them through the click above.
  document.addEventListener("keydown", function (event) {
    var link = event.target.closest && event.target.closest("[data-dot] a");
    if (link && event.key === "Enter") {
      event.preventDefault();
      link.dispatchEvent(new MouseEvent("click", { bubbles: true, cancelable: true }));
    }
  });

  if (window.htmx) {
    window.htmx.onLoad(function (root) {
      drawAll(root);
      markAll();
    });
    // htmx fires load when the swap settles (20 ms later): mark in the swap's own task too, so
    // the panel, the graph and the table never disagree in between (a poll or a step's panel).
    document.addEventListener("htmx:afterSwap", function (event) {
      drawAll(event.target);
      markAll();
    });
  } else {
    document.addEventListener("DOMContentLoaded", function () { drawAll(document); markAll(); });
  }
})();
