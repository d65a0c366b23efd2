// The menu button of narrow screens: it shows and hides the navigation (#nav-panel). Without
// this script the button stays hidden and the navigation stays open, wrapped under the brand.
(function () {
  "use strict";

  function wire() {
    var button = document.querySelector("[data-menu-toggle]");
    var panel = button && document.getElementById(button.getAttribute("aria-controls"));
    if (!button || !panel) return;
    function set(open) {
      button.setAttribute("aria-expanded", open ? "true" : "false");
      panel.classList.toggle("open", open);
    }
    document.documentElement.classList.add("has-menu");
    button.hidden = false;
    button.addEventListener("click", function () {
      set(button.getAttribute("aria-expanded") !== "true");
    });
    // Escape closes an open menu and gives the focus back to its button.
    document.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && button.getAttribute("aria-expanded") === "true") {
        set(false);
        button.focus();
      }
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", wire);
  else wire();
})();
