#!/usr/bin/env bash
# Regenerate book/_vendor/: the JavaScript the rendered book would otherwise fetch from public
# CDNs, so that the pages work offline (a classroom, a cluster login node, a laptop on a train):
#   ipywidgets/  the widget manager (@jupyter-widgets/html-manager) and its loader (require.js);
#                myst-nb's default loads both from cdnjs/jsdelivr, and offline widgets are blank.
#   mathjax/     MathJax 3 (Sphinx's default mathjax_path is jsdelivr): the combined TeX+CHTML
#                component, the TeX extensions it autoloads (\boldsymbol, \cancel, ...) and fonts.
# _config.yml points at these files (sphinx.config: html_static_path, nb_ipywidgets_js,
# mathjax_path). The versions and their integrity hashes are those of scripts/vendor/package.json
# and package-lock.json (`npm ci` refuses a tarball whose hash differs); to bump one, edit
# package.json there, run `npm install --package-lock-only` in that folder, then this script.
# SOURCES.txt records the sha256 of every vendored file. Needs npm and the npm registry.
# Usage: scripts/vendor-widgets.sh   (from anywhere)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/book/_vendor"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp "$root/scripts/vendor/package.json" "$root/scripts/vendor/package-lock.json" "$tmp/"
(cd "$tmp" && npm ci --silent --ignore-scripts --no-audit --no-fund)
version() { node -p "require('$tmp/node_modules/$1/package.json').version"; }
HTML_MANAGER=@jupyter-widgets/html-manager@$(version @jupyter-widgets/html-manager)
REQUIREJS=requirejs@$(version requirejs)
MATHJAX=mathjax@$(version mathjax)
ln -s "$tmp/node_modules/@jupyter-widgets/html-manager" "$tmp/hm"
ln -s "$tmp/node_modules/requirejs" "$tmp/rq"
ln -s "$tmp/node_modules/mathjax" "$tmp/mj"
rm -rf "$dest"
mkdir -p "$dest/ipywidgets" "$dest/mathjax/input/tex" "$dest/mathjax/output/chtml/fonts"
# embed-amd.js bundles @jupyter-widgets/base, controls and output (everything ipywidgets makes);
# the other dist files (embed.js and its chunks, fonts, source maps) are not used by it.
cp "$tmp/hm/dist/embed-amd.js" "$dest/ipywidgets/embed-amd.js"
cp "$tmp/hm/LICENSE" "$dest/ipywidgets/LICENSE-html-manager.txt"
cp "$tmp/rq/require.js" "$dest/ipywidgets/require.js"     # MIT licence in the file's header
# config.js, loaded between require.js and embed-amd.js, fixes two things the manager does on a
# Sphinx page: (1) its CSS asks for its Font Awesome fonts at <require.js baseUrl>/@jupyter-widgets/
# [html-manager/dist/] (page-relative by default: 404s on every widget page), so baseUrl becomes
# this folder and the fonts are copied where the CSS looks; (2) @jupyter-widgets/controls 2.0
# typesets widget labels with MathJax 2's MathJax.Hub.Queue, which MathJax 3 lacks: a TypeError on
# every page with math and widgets. The shim hands the label to MathJax 3 instead.
for d in "@jupyter-widgets" "@jupyter-widgets/html-manager/dist"; do
  mkdir -p "$dest/ipywidgets/$d"
  cp "$tmp"/hm/dist/*.woff2 "$dest/ipywidgets/$d/"
done
cat > "$dest/ipywidgets/config.js" <<'JS'
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
JS
cp "$tmp/mj/es5/tex-mml-chtml.js" "$dest/mathjax/"
cp -r "$tmp/mj/es5/input/tex/extensions" "$dest/mathjax/input/tex/"
cp -r "$tmp/mj/es5/output/chtml/fonts/woff-v2" "$dest/mathjax/output/chtml/fonts/"
cp "$tmp/mj/LICENSE" "$dest/mathjax/LICENSE-mathjax.txt"
{
  echo "Vendored by scripts/vendor-widgets.sh on $(date -u +%Y-%m-%d) with npm ci (scripts/vendor/package-lock.json):"
  echo "  $HTML_MANAGER  dist/embed-amd.js, LICENSE   -> ipywidgets/"
  echo "  $REQUIREJS  require.js                     -> ipywidgets/"
  echo "  $MATHJAX  es5/tex-mml-chtml.js, es5/input/tex/extensions/, es5/output/chtml/fonts/woff-v2/ -> mathjax/"
  echo "sha256:"
  (cd "$dest" && find . -type f ! -name SOURCES.txt | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum | sed 's/^/  /')
} > "$dest/SOURCES.txt"
echo "wrote ${dest#$root/}/ ($(du -sh "$dest" | cut -f1))"
