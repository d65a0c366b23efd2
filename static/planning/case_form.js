// A field's error described the value that was sent: once the field is changed, it goes (the
// server checks the new value on the next submission and says so again if it must).
(() => {
  "use strict";
  function clearError(event) {
    const field = event.target.closest && event.target.closest("#case-form .field.has-error");
    if (!field) return;
    field.classList.remove("has-error");
    for (const list of field.querySelectorAll(".errorlist")) {
      for (const control of field.querySelectorAll("[aria-describedby]")) {
        const ids = control.getAttribute("aria-describedby").split(" ").filter((id) => id && id !== list.id);
        if (ids.length) control.setAttribute("aria-describedby", ids.join(" "));
        else control.removeAttribute("aria-describedby");
      }
      list.remove();
    }
    for (const control of field.querySelectorAll("[aria-invalid]")) control.removeAttribute("aria-invalid");
  }
  document.addEventListener("input", clearError);
  document.addEventListener("change", clearError);
})();

// A live count under a box with a limit (the description): how many characters of how many.
(() => {
  "use strict";
  function counted(box) {
    const limit = Number(box.dataset.limit);
    let count = document.getElementById(`${box.id}_count`);
    if (!count) {
      count = document.createElement("p");
      count.id = `${box.id}_count`;
      count.className = "char-count muted small";
      count.setAttribute("aria-live", "polite");
      box.after(count);
    }
    const length = box.value.length;
    count.textContent = `${length.toLocaleString("en")} of ${limit.toLocaleString("en")} characters`;
    count.classList.toggle("over-limit", length > limit);
  }
  function countAll() {
    for (const box of document.querySelectorAll("#case-form [data-limit]")) counted(box);
  }
  document.addEventListener("input", (event) => {
    if (event.target.matches && event.target.matches("#case-form [data-limit]")) counted(event.target);
  });
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", countAll);
  else countAll();
})();
