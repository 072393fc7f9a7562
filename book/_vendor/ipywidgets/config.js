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
