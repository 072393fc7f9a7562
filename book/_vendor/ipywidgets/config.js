// Written by scripts/vendor-widgets.sh. Loaded after require.js, before embed-amd.js.
// 1. The widget manager's fonts resolve against require.js's baseUrl: this folder (they are here).
require.config({baseUrl: document.currentScript.src.replace(/[^/]*$/, "")});
// 2. Widget labels are typeset with MathJax 2's API; the book loads MathJax 3 (deferred, so it
//    exists by DOMContentLoaded; widgets render at window load).
document.addEventListener("DOMContentLoaded", function () {
  var M = window.MathJax;
  if (M && M.version && !M.Hub) {
    M.Hub = {Queue: function (job) {
      var el = job && job[2];
      M.startup.promise.then(function () { return M.typesetPromise(el ? [el] : undefined); });
    }};
  }
});
// 3. Accessibility (axe-core in tests/browser): the manager's sliders have no accessible name and
//    the images it draws no alt text. A slider is named after its widget's label; a widget's image
//    is the live twin of the static figure (with its own alt text) that the chapter shows beside it.
(function () {
  function name(root) {
    root.querySelectorAll('[role="slider"]:not([aria-label])').forEach(function (s) {
      var w = s.closest('.widget-inline-hbox') || s.parentElement;
      var label = w && w.querySelector('.widget-label');
      var text = label && (label.textContent || label.title || '').trim();
      s.setAttribute('aria-label', text || 'slider');
    });
    root.querySelectorAll('.widget-subarea img:not([alt])').forEach(function (i) {
      i.setAttribute('alt', 'Figure drawn by the interactive widget; the static figure beside it ' +
                            'shows the same computation and describes it.');
    });
  }
  new MutationObserver(function () { name(document); })
    .observe(document.documentElement, {childList: true, subtree: true});
})();
