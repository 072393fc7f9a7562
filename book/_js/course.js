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
})();
