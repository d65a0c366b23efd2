// The gate page (R9, against automation bias): the approve button stays disabled until the
// step's detail has been opened. Opening it sets the form's detail_opened flag; without this
// script the server still refuses an approval that does not carry the flag (the detail then
// holds a checkbox that sets it).
(function () {
  "use strict";

  function wire(root) {
    var scope = root && root.querySelectorAll ? root : document;
    scope.querySelectorAll("details[data-gate-detail]").forEach(function (detail) {
      if (detail.dataset.wired === "true") return;
      detail.dataset.wired = "true";
      var form = document.getElementById("approve-form");
      if (!form) return;
      var button = form.querySelector("[data-approve]");
      var flag = form.querySelector("[data-detail-flag]");
      var hint = form.querySelector("[data-approve-hint]");
      function update() {
        var opened = detail.open || (flag && flag.value === "1");
        if (detail.open && flag) flag.value = "1";
        if (button) button.disabled = !opened;
        if (hint) hint.hidden = opened;
      }
      detail.addEventListener("toggle", update);
      // The hint and the graph's text alternative link to the detail: following one opens it.
      document.querySelectorAll('a[href="#' + detail.id + '"]').forEach(function (link) {
        link.addEventListener("click", function () { detail.open = true; });
      });
      update();
    });
  }

  // A refused decision (a wrong signing password) answers the POST with the gate page: show
  // the gate's own address, so a reload or a shared link opens the page, not the decide URL.
  var page = document.querySelector(".gate-page[data-url]");
  if (page && window.location.pathname !== page.dataset.url) {
    window.history.replaceState(null, "", page.dataset.url);
  }

  // With this script, opening the detail is enough: the no-script checkbox is not needed.
  document.querySelectorAll("[data-no-js-check]").forEach(function (label) { label.hidden = true; });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { wire(document); });
  } else {
    wire(document);
  }
})();
