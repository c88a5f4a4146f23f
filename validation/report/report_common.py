"""What the judge's HTML reports share (mk-validate's and mk-plan's): the look, tables, number formats, the
matplotlib import, and a check that runs in the browser and marks every image that did not load.

Imported by validation_report.py and plan_report.py from their own directory.
"""
import html
import sys

CSS = ("body{font-family:sans-serif;margin:2em;max-width:1600px} table{border-collapse:collapse;margin:1em 0;"
       "font-size:90%} td,th{border:1px solid #ccc;padding:2px 8px;text-align:right} th{background:#eee}"
       "td{white-space:nowrap} td.w{white-space:normal;text-align:left}"
       "td.l,th.l{text-align:left} code,pre{background:#f6f6f6} .bad{color:#b00} img{max-width:100%}"
       ".nv{background:#fff1d6} .ex{background:#eef4ff} .ok{background:#eaf7ea} .na{color:#777}"
       ".note{color:#555;font-size:90%} .box{border:1px solid #ccc;padding:0.5em 1em;background:#fafafa}")

# Runs in the reader's browser: counts the images, marks each one that did not load with a visible line, and
# records script errors, on <body data-images, data-images-missing, data-js-errors, data-checked> (the headless
# browser test reads them).
CHECK_SCRIPT = """<script>
window.mkErrors = [];
window.addEventListener('error', function (e) {
  window.mkErrors.push(String(e.message || (e.target && (e.target.src || e.target.href)) || 'error'));
}, true);
window.addEventListener('load', function () {
  var missing = 0;
  Array.prototype.forEach.call(document.images, function (img) {
    if (img.complete && img.naturalWidth > 0) { img.dataset.loaded = '1'; return; }
    missing++;
    var p = document.createElement('p');
    p.className = 'bad';
    p.textContent = 'image missing: ' + img.getAttribute('src');
    img.parentNode.insertBefore(p, img);
  });
  document.body.dataset.images = document.images.length;
  document.body.dataset.imagesMissing = missing;
  document.body.dataset.jsErrors = window.mkErrors.length;
  document.body.dataset.checked = 'yes';
});
</script>"""


def fail(tool, msg, code=2):
    print(f"{tool}: error: {msg}", file=sys.stderr)
    sys.exit(code)


def import_pyplot(tool, option_hint):
    """matplotlib's pyplot on the Agg backend, or exit 3 saying how to get it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(tool, f"matplotlib is not available to {sys.executable} (Debian: apt install python3-matplotlib; "
                   f"{option_hint} selects the interpreter)", 3)
    return plt


def esc(x):
    return html.escape(str(x))


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def table(head, rows, left=0, row_classes=None):
    """An HTML table; the first `left` columns are left-aligned; cells may be (text, css class) pairs."""
    def cell(tag, c, i):
        cls = ["l"] if i < left else []
        if isinstance(c, tuple):
            c, extra = c
            cls.append(extra)
        attr = f" class='{' '.join(cls)}'" if cls else ""
        return f"<{tag}{attr}>{esc(c)}</{tag}>"
    out = ["<table><tr>" + "".join(cell("th", h, i) for i, h in enumerate(head)) + "</tr>"]
    for k, r in enumerate(rows):
        rc = f" class='{row_classes[k]}'" if row_classes and row_classes[k] else ""
        out.append(f"<tr{rc}>" + "".join(cell("td", c, i) for i, c in enumerate(r)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def page(title, parts):
    """A whole HTML document around `parts` (already HTML)."""
    return "\n".join(["<!DOCTYPE html><html><head><meta charset='utf-8'>", f"<title>{esc(title)}</title>",
                      f"<style>{CSS}</style>", CHECK_SCRIPT, "</head><body>"] + parts + ["</body></html>"]) + "\n"
