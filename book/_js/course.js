/* The course's page script (_config.yml: html_static_path book/_js, html_js_files course.js).

   The menu buttons. sphinx-book-theme 1.3.0 with pydata-sphinx-theme 0.17.1 writes two
   `.primary-toggle` buttons (one in the header, hidden; one in the article's header, the one
   a reader sees) and two `.secondary-toggle`, but both themes' scripts bind only the FIRST of
   each (`document.querySelector(".primary-toggle")`): the hidden one. The visible buttons do
   nothing, at any width; on a phone the chapter menu never opens. A blank Jupyter Book with the
   same pins does the same (NOTES.md, "Upstream bugs"). Fix: a click on any other toggle of the
   same kind is handed to the bound one, so the themes' own code opens the drawer (narrow
   screens) or folds the sidebar (wide ones). tests/browser/test_navigation.py taps the visible
   button at phone width and finds the menu under the finger. */
(function () {
  "use strict";
  function forward(selector) {
    document.addEventListener("click", function (event) {
      var target = event.target instanceof Element ? event.target : null;
      var clicked = target && target.closest(selector);
      var bound = document.querySelector(selector);
      if (!clicked || !bound || clicked === bound) return;
      event.preventDefault();
      event.stopPropagation();
      bound.click();
    }, true);
  }
  forward(".primary-toggle");
  forward(".secondary-toggle");

  /* The page's Contents drawer on a phone (the theme's <dialog>): a tap on one of its links
     scrolls the page to the section, but the theme leaves the drawer open over the text. The
     tap closes it (the dialog's own close: the theme's close handler runs as on Escape).
     tests/browser/test_navigation.py taps a link and looks at what is under the finger. */
  document.addEventListener("click", function (event) {
    var target = event.target instanceof Element ? event.target : null;
    var link = target && target.closest("a[href]");
    var dialog = link && link.closest("dialog#pst-secondary-sidebar-modal, " +
                                      "dialog#pst-primary-sidebar-modal");
    if (dialog && dialog.open && typeof dialog.close === "function") dialog.close();
  });

  /* The toggles' tooltips (Bootstrap's, which pydata-sphinx-theme puts on every button with a
     title). On a touch screen a tap focuses the button and its tooltip shows on focus; when the
     Contents drawer closes, focus returns to its toggle and "Toggle secondary sidebar" stays
     over the header's buttons, catching the next tap (the search button's) until the reader taps
     the text. On a screen that cannot hover, no tooltip is shown: the ones the theme made are
     disposed of, a later one is refused, and a toggle is blurred when its drawer closes. The
     toggles get names a reader knows ("Contents", "Chapters") instead of the theme's developer
     words. tests/browser/test_navigation.py taps a section, then the search button. */
  var NO_HOVER = !!(window.matchMedia && window.matchMedia("(hover: none)").matches);
  var NAMES = {".secondary-toggle": "Contents", ".primary-toggle": "Chapters"};
  function rename(el, name) {
    if (el.getAttribute("data-bs-toggle") !== "tooltip") return;   // the theme's own labels stay
    el.setAttribute("aria-label", name);
    if (el.hasAttribute("title")) el.setAttribute("title", name);
    if (el.hasAttribute("data-bs-original-title")) el.setAttribute("data-bs-original-title", name);
  }
  function quietTooltips() {
    var Tooltip = window.bootstrap && window.bootstrap.Tooltip;
    document.querySelectorAll('[data-bs-toggle="tooltip"]').forEach(function (el) {
      var tip = Tooltip && Tooltip.getInstance(el);
      if (tip) tip.dispose();
    });
  }
  function ready() {
    Object.keys(NAMES).forEach(function (selector) {
      document.querySelectorAll(selector).forEach(function (el) { rename(el, NAMES[selector]); });
    });
    if (NO_HOVER) quietTooltips();
  }

  /* Search results: Sphinx's snippet under each hit is the text of the page's [role=main]
     (searchtools.js, Search.htmlToText), which in this theme holds the article's header too:
     the buttons' hidden labels ("Color mode") and the print-only title and "Contents" came
     before the page's text ("...Color mode DDP from scratch: hooks, buckets and overlap
     Contents..."). The snippet is taken from the article alone. tests/browser/test_pages.py
     (test_search_works_offline) reads the snippets. */
  function articleOnly() {
    if (typeof Search === "undefined" || !Search || typeof Search.htmlToText !== "function" ||
        Search.htmlToText.courseArticleOnly) return;
    var original = Search.htmlToText;
    var wrapped = function (htmlString, anchor) {
      try {
        var doc = new DOMParser().parseFromString(htmlString, "text/html");
        var main = doc.querySelector('[role="main"]');
        var article = main && main.querySelector("article.bd-article");
        if (article) {
          main.replaceChildren(article);
          htmlString = doc.documentElement.outerHTML;
        }
      } catch (e) { /* the page as it is */ }
      return original.call(this, htmlString, anchor);
    };
    wrapped.courseArticleOnly = true;
    Search.htmlToText = wrapped;
  }

  function start() {
    ready();
    articleOnly();
  }
  // The theme makes its tooltips when bootstrap.js (deferred) runs, before DOMContentLoaded;
  // searchtools.js (after this script) defines Search before it.
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
  document.addEventListener("show.bs.tooltip", function (event) {
    if (NO_HOVER) event.preventDefault();
  }, true);
  // "close" does not bubble: caught on its way down to the dialog
  document.addEventListener("close", function (event) {
    var dialog = event.target;
    if (!NO_HOVER || !(dialog instanceof Element) || !dialog.matches("dialog")) return;
    window.setTimeout(function () {   // after the dialog has handed focus back
      var el = document.activeElement;
      if (el && el.closest && el.closest(".primary-toggle, .secondary-toggle")) el.blur();
      document.querySelectorAll(".tooltip.show").forEach(function (t) { t.remove(); });
    }, 0);
  }, true);
})();
