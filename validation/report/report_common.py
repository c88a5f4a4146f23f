"""What the judge's HTML reports share (mk-validate's and mk-plan's): the look (jinja2 templates and one
stylesheet in templates/), tables, number formats, order statistics, the matplotlib and jinja2 imports, and a
check that runs in the browser and marks every image that did not load.

Imported by validation_report.py and plan_report.py from their own directory.
"""
import html
import math
import os
import sys

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")

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


def import_jinja(tool):
    """A jinja2 Environment on templates/ (HTML autoescaped), or exit 3 saying how to get jinja2."""
    try:
        import jinja2
    except ImportError:
        fail(tool, f"jinja2 is not available to {sys.executable} (Debian: apt install python3-jinja2; scripts/setup "
                   "installs it)", 3)
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def render(env, template, **context):
    """The page `template` renders to, with the browser check in its head."""
    return env.get_template(template).render(check_script=CHECK_SCRIPT, **context)


def median(values):
    """The middle value, or the mean of the two middle ones; 0 for none (as mk::median, mk/util/stats.hpp)."""
    return quantile(values, 0.5)


def quantile(values, q):
    """Linear interpolation between order statistics (as mk::quantile); 0 for none."""
    a = sorted(values)
    if not a:
        return 0.0
    pos = min(max(q, 0.0), 1.0) * (len(a) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(a) - 1)
    return a[lo] + (pos - lo) * (a[hi] - a[lo])


def abs_stats(errs):
    """n, median, p90, max of |errs|: as mk::errorStats."""
    a = [abs(e) for e in errs]
    if not a:
        return 0, 0.0, 0.0, 0.0
    return len(a), median(a), quantile(a, 0.9), max(a)


def esc(x):
    return html.escape(str(x))


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def table(head, rows, left=0, row_classes=None):
    """An HTML table; the first `left` columns are text (left-aligned), the others numbers (right-aligned);
    cells may be (text, css class) pairs."""
    def cell(tag, c, i):
        cls = [] if i < left else ["n"]
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


def page(title, parts, tool="report"):
    """A whole HTML document around `parts` (already HTML), in the shared base template and stylesheet."""
    from markupsafe import Markup  # jinja2's own dependency
    return render(import_jinja(tool), "page.html.j2", title=title, body=Markup("\n".join(parts)), footer="") + "\n"
