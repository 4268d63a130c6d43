// MathJax reads the math pymdownx.arithmatex marks (generic output: \( \) and \[ \]);
// tex-svg.js is served with the site (docs/hooks/mathjax.py), never from a CDN.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};

// Material's instant navigation swaps pages without a reload: typeset each new one
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && window.MathJax.typesetPromise) {
      window.MathJax.typesetClear && window.MathJax.typesetClear();
      window.MathJax.typesetPromise();
    }
  });
}
