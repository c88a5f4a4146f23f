"""mk-plan's report: the PNG plots of plan.json (plan_report.py writes the page around them).

Every variant gets its own colour AND line style and marker (Okabe-Ito's colour-blind-safe palette), so that the
lines can be told apart in grey print and by readers who do not see every colour.
"""
import os

PARTS = [("compute", "compute", "#0072B2"), ("tp", "TP exposed", "#E69F00"), ("ep", "EP exposed", "#CC79A7"),
         ("pp", "PP exposed", "#8B5A2B"), ("dp", "DP exposed", "#D55E00"), ("cp", "CP exposed", "#009E73"),
         ("bubble", "pipeline bubble", "#999999")]
# Okabe & Ito, "Color Universal Design" (2008): distinguishable under the common colour-vision deficiencies.
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
LINES = ["-", "--", "-.", ":"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def variant_style(i):
    """Colour, line style and marker of the i-th variant: no two of the first 32 variants share all three."""
    return {"color": COLOURS[i % len(COLOURS)], "linestyle": LINES[(i // len(COLOURS) + i) % len(LINES)],
            "marker": MARKERS[i % len(MARKERS)], "ms": 4}


def part_us(layered, key):
    if key == "compute":
        return layered["compute_us"]
    if key == "bubble":
        return layered["bubble_us"]
    return layered.get(key, {"exposed_us": 0})["exposed_us"]


def feasible(scales):
    return [s for s in scales if s["feasible"]]


def step_shown(s):
    """The step time the tables show: the mean step under noise where the variant has a noise what-if."""
    return s["noise"]["mean_step_us"] if "noise" in s else s["layered"]["step_us"]


# ---- plots ----------------------------------------------------------------------------------------------------

def gpu_axis(ax, gpus):
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus)
    ax.set_xticklabels([str(g) for g in gpus], rotation=45)
    ax.set_xlabel("GPUs")
    ax.grid(True, which="both", alpha=0.3)


def save(plt, fig, out, name):
    """Lay out, write `name` under `out`, close the figure; the name the page links to."""
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=100)
    plt.close(fig)
    return name


def plot_step_time(plt, doc, out):
    """Every variant's step as its table shows it (the mean step under noise), fused dashed in the same colour."""
    fig, ax = plt.subplots(figsize=(8, 5))
    gpus = doc["inputs"]["gpus"]
    any_fused = False
    for i, v in enumerate(doc["variants"]):
        ss = feasible(v["scales"])
        st = variant_style(i)
        noisy = any("noise" in s for s in ss)
        ax.plot([s["gpus"] for s in ss], [step_shown(s) / 1e6 for s in ss], **st,
                label=f"{v['name']} (layered{', mean step with noise' if noisy else ''})")
        fs = [s for s in ss if s["fused"]["available"]]
        if fs:
            any_fused = True
            ax.plot([s["gpus"] for s in fs], [s["fused"]["step_us"] / 1e6 for s in fs], color=st["color"],
                    linestyle=(0, (1, 1)), marker=st["marker"], mfc="none", ms=4, label=f"{v['name']} (fused)")
    if not any_fused:
        ax.text(0.02, 0.03, "fused: " + doc["fused"]["status"], transform=ax.transAxes, fontsize=8, color="#b00")
    ax.set_yscale("log")
    gpu_axis(ax, gpus)
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{doc['inputs']['workload']['name']}: training step time")
    ax.legend(fontsize=8)
    return save(plt, fig, out, "step-time.png")


def plot_breakdown(plt, doc, out):
    base = feasible(doc["variants"][0]["scales"])
    fig, (ax_abs, ax_rel) = plt.subplots(1, 2, figsize=(13, 5))
    gpus = [s["gpus"] for s in base]
    for key, label, color in PARTS:
        vals = [part_us(s["layered"], key) / 1e3 for s in base]
        if any(vals):
            ax_abs.plot(gpus, vals, **dict(variant_style(PARTS.index((key, label, color))), color=color),
                        label=label)
    ax_abs.plot(gpus, [s["layered"]["step_us"] / 1e3 for s in base], "k--", lw=1, label="step")
    ax_abs.set_yscale("log")
    gpu_axis(ax_abs, doc["inputs"]["gpus"])
    ax_abs.set_ylabel("ms per step")
    ax_abs.set_title("step time by part (baseline, layered)")
    ax_abs.legend(fontsize=8)
    x = list(range(len(base)))
    bottom = [0.0] * len(base)
    for key, label, color in PARTS:
        rel = [100 * part_us(s["layered"], key) / s["layered"]["step_us"] for s in base]
        ax_rel.bar(x, rel, bottom=bottom, color=color, label=label)
        bottom = [a + b for a, b in zip(bottom, rel)]
    ax_rel.set_xticks(x)
    ax_rel.set_xticklabels([str(g) for g in gpus], rotation=45)
    ax_rel.set_xlabel("GPUs")
    ax_rel.grid(True, axis="y", alpha=0.3)
    ax_rel.set_ylabel("share of the step (%)")
    ax_rel.set_title("share of the step")
    ax_rel.legend(fontsize=8, loc="lower left")
    return save(plt, fig, out, "breakdown.png")


def plot_comm(plt, doc, out):
    base = feasible(doc["variants"][0]["scales"])
    gpus = [s["gpus"] for s in base]
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, label, color in PARTS[1:6]:
        exp = [s["layered"].get(key, {}).get("exposed_us", 0) / 1e3 for s in base]
        hid = [s["layered"].get(key, {}).get("hidden_us", 0) / 1e3 for s in base]
        if any(exp):
            ax.plot(gpus, exp, color=color, linestyle="-", marker=MARKERS[PARTS.index((key, label, color))], ms=4,
                    label=f"{label}")
        if any(hid):
            ax.plot(gpus, hid, color=color, linestyle=":", marker=MARKERS[PARTS.index((key, label, color))], mfc="none",
                    ms=4, label=f"{label.split()[0]} hidden by overlap")
    ax.set_yscale("symlog", linthresh=0.01)
    gpu_axis(ax, doc["inputs"]["gpus"])
    ax.set_ylabel("communication per step (ms)")
    ax.set_title("communication per parallel dimension (baseline)")
    ax.legend(fontsize=8)
    return save(plt, fig, out, "comm.png")


def plot_throughput(plt, doc, out):
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(13, 5))
    for i, v in enumerate(doc["variants"]):
        ss = feasible(v["scales"])
        g = [s["gpus"] for s in ss]
        st = variant_style(i)
        ax_t.plot(g, [s["tokens_per_s"] for s in ss], **st, label=v["name"])
        ax_e.plot(g, [100 * s["scaling_efficiency"] for s in ss], **st, label=f"{v['name']}: scaling")
        ax_e.plot(g, [100 * s["mfu"] for s in ss], color=st["color"], linestyle=(0, (1, 1)), marker=st["marker"],
                  mfc="none", ms=3, label=f"{v['name']}: MFU")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("tokens / s")
    ax_t.set_title("throughput")
    ax_e.set_ylabel("%")
    ax_e.set_ylim(0, 105)
    ax_e.set_title("scaling efficiency (the variant's line) and MFU (dotted, open markers)")
    for ax in (ax_t, ax_e):
        gpu_axis(ax, doc["inputs"]["gpus"])
        ax.legend(fontsize=7)
    return save(plt, fig, out, "throughput.png")


def relative(base, s):
    """Throughput of `s` relative to the baseline at the same GPU count (goodput included)."""
    if not (s["feasible"] and base["feasible"]):
        return None
    r = base["layered"]["step_us"] / s["layered"]["step_us"]
    return r * s["noise"]["goodput"] if "noise" in s else r


def plot_what_ifs(plt, doc, out):
    base = doc["variants"][0]["scales"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, v in enumerate(doc["variants"][1:], start=1):
        pts = [(b["gpus"], relative(b, s)) for b, s in zip(base, v["scales"])]
        pts = [p for p in pts if p[1] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], **variant_style(i), label=v["name"])
    ax.axhline(1.0, color="black", lw=0.8)
    gpu_axis(ax, doc["inputs"]["gpus"])
    ax.set_ylabel("tokens/s relative to the baseline")
    ax.set_title("what-ifs")
    ax.legend(fontsize=8)
    return save(plt, fig, out, "what-ifs.png")


def plot_goodput(plt, doc, out):
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, v in enumerate(doc["variants"]):
        ss = [s for s in feasible(v["scales"]) if "noise" in s]
        if ss:
            ax.plot([s["gpus"] for s in ss], [100 * s["noise"]["goodput"] for s in ss], **variant_style(i),
                    label=v["name"])
    gpu_axis(ax, doc["inputs"]["gpus"])
    ax.set_ylabel("goodput (% of the noiseless throughput)")
    ax.set_title("stragglers and noise: every step waits for its slowest GPU")
    ax.legend(fontsize=8)
    return save(plt, fig, out, "goodput.png")


