"""The plots of mk-validate's report, also the ones docs/img/validation/ shows (scripts/doc-plots): measured and
predicted time over size, and the error over size, per op and algorithm, from mk-validate's JSON rows.

Readable at the size a page shows them: binary size ticks on powers of 2, 4 or 16 (at most 9 per axis), time
ticks at 1-2-5 per decade, legends at the axes' font size.
"""
import os

TIME_COLOURS = {"measured": "black", "simulated": "tab:blue", "closed form": "tab:orange"}


def size_label(b):
    """8 B, 64 KiB, 1 GiB: the largest binary unit that divides `b`."""
    b = int(b)
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def _style(plt):
    plt.rcParams.update({"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 10,
                         "xtick.labelsize": 9.5, "ytick.labelsize": 10, "figure.dpi": 110})


def _size_axis(ax, xs):
    """A log2 size axis with labelled ticks on powers of 2, 4 or 16 that the data spans (at most 9)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    lo, hi = min(xs), max(xs)
    e_lo, e_hi = int(lo).bit_length() - 1, max(int(hi - 1).bit_length(), 0)
    step = 2 if e_hi - e_lo > 6 else 1
    ticks = [1 << e for e in range(e_lo - e_lo % step, e_hi + 1, step)] or [lo]
    if step == 2 and len(ticks) > 9:
        ticks = ticks[::2]
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_label(v)))
    ax.set_xlim(lo / 1.3, hi * 1.3)
    for t in ax.get_xticklabels():
        t.set_rotation(35)
        t.set_ha("right")


def _time_axis(ax):
    """A log10 time axis with 1-2-5 ticks per decade, labelled in plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=30))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0), numticks=30))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def plot_op(plt, op, algos, out):
    """time-<op>.png and error-<op>.png in `out` from `algos` (algo -> rows of one op); returns their names."""
    _style(plt)
    names = list(algos)
    ncols = min(3, len(names))
    nrows = (len(names) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.4 * ncols, 4.3 * nrows), squeeze=False)
    for k, algo in enumerate(names):
        ax = axes[k // ncols][k % ncols]
        rows = sorted(algos[algo], key=lambda r: r["bytes"])
        xs = [r["bytes"] for r in rows]
        ax.plot(xs, [r["measured_us"] for r in rows], "o", color=TIME_COLOURS["measured"], ms=4.5, label="measured")
        ax.plot(xs, [r["sim_us"] for r in rows], "-", color=TIME_COLOURS["simulated"], lw=1.8, label="simulated")
        cf = [(r["bytes"], r["closed_us"]) for r in rows if r["closed_us"] is not None]
        if cf:
            ax.plot([c[0] for c in cf], [c[1] for c in cf], "--", color=TIME_COLOURS["closed form"], lw=1.5,
                    label="closed form")
        _size_axis(ax, xs)
        _time_axis(ax)
        ax.set_title(f"{op} {algo}")
        ax.set_xlabel("size (bytes, nccl-tests convention)")
        ax.set_ylabel("time (µs)")
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", alpha=0.12)
        ax.legend(loc="upper left", framealpha=0.9)
    for k in range(len(names), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    fig.tight_layout()
    time_png = f"time-{op}.png"
    fig.savefig(os.path.join(out, time_png))
    plt.close(fig)

    fig, (ax_sim, ax_cf) = plt.subplots(1, 2, figsize=(13.5, 4.8), sharey=True)
    all_x = []
    for algo in names:
        rows = sorted(algos[algo], key=lambda r: r["bytes"])
        xs = [r["bytes"] for r in rows]
        all_x += xs
        line, = ax_sim.plot(xs, [r["sim_err_pct"] for r in rows], "o-", ms=3.5, label=algo)
        cf = [(r["bytes"], r["closed_err_pct"]) for r in rows if r["closed_err_pct"] is not None]
        if cf:
            ax_cf.plot([c[0] for c in cf], [c[1] for c in cf], "o--", ms=3.5, color=line.get_color(), label=algo)
    for ax, what in ((ax_sim, "simulator"), (ax_cf, "closed form")):
        ax.axhline(0, color="black", lw=0.8)
        ax.axhspan(-5, 5, color="tab:green", alpha=0.12, label="±5 %")
        _size_axis(ax, all_x)
        ax.set_title(f"{op}: {what} error over size")
        ax.set_xlabel("size (bytes, nccl-tests convention)")
        ax.grid(True, which="major", alpha=0.35)
        ax.legend(loc="best", framealpha=0.9, ncol=2 if len(names) > 4 else 1)
    ax_sim.set_ylabel("error: (predicted − measured) / measured (%)")
    fig.tight_layout()
    err_png = f"error-{op}.png"
    fig.savefig(os.path.join(out, err_png))
    plt.close(fig)
    return time_png, err_png
