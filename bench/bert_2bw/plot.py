#!/usr/bin/env python3
"""Plot the training loss of a 1f1b and a 2bw run (metrics JSON Lines) in one SVG.

Written by hand (no plotting library, so the script runs anywhere): the loss of every step
faint, its 25-step moving average bold, the validation losses as dots, and the final figures
(mean of the last 50 steps, last validation loss) in the legend below the axes (inside the
picture), which the script also prints. The y-axis spans the moving averages and validation
losses (a robust range): a step whose loss lies outside it is drawn at the edge and marked
with its value, so one spike does not flatten the curves.

Usage: plot.py 1F1B.jsonl 2BW.jsonl OUT.svg [PEAK_LR]   (PEAK_LR: for the title)
"""
import json
import sys


def read(path):
    steps, losses, vals = [], [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            steps.append(r["iter"])
            losses.append(r["loss"])
            if "val_loss" in r:
                vals.append((r["iter"], r["val_loss"]))
    return steps, losses, vals


def moving_average(xs, n):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= n:
            acc -= xs[i - n]
        out.append(acc / min(i + 1, n))
    return out


def main():
    a_path, b_path, out_path = sys.argv[1:4]
    lr = sys.argv[4] if len(sys.argv) > 4 else "1e-3"
    runs = [("1f1b (flush every step)", "#1f77b4", read(a_path)),
            ("2bw (weights one batch stale)", "#d62728", read(b_path))]
    W, left, right, top = 760, 70, 20, 40
    plot_h, bottom = 340, 60  # the axes' height; below them the x-axis title
    legend_h = 18 * (len(runs) + 1) + 10
    H = top + plot_h + bottom  # the axes' frame and their title; the legend below
    all_steps = [s for _, _, (st, _, _) in runs for s in st]
    x0, x1 = 0, max(all_steps)
    # The robust range: what the moving averages and validation losses span, and a margin.
    smooth = [x for _, _, (_, ls, _) in runs for x in moving_average(ls, 25)]
    smooth += [v for _, _, (_, _, vs) in runs for _, v in vs]
    margin = 0.05 * (max(smooth) - min(smooth))
    y0, y1 = min(smooth) - margin, max(smooth) + margin
    sx = lambda x: left + (x - x0) / (x1 - x0) * (W - left - right)
    sy = lambda y: top + (y1 - min(max(y, y0), y1)) / (y1 - y0) * plot_h
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (W, H + legend_h),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="14">BERT (4 layers, hidden 128) on tiny Shakespeare, '
           'pipeline 4, peak lr %s: 1f1b vs 2bw</text>' % (left, lr)]
    # Axes, ticks and grid.
    svg.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, H - bottom, W - right, H - bottom))
    svg.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, top, left, H - bottom))
    step = max(1, round((x1 - x0) / 6 / 50) * 50)
    for t in range(0, x1 + 1, step):
        svg.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (sx(t), top, sx(t), H - bottom))
        svg.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (sx(t), H - bottom + 16, t))
    y = int(y0 * 2 + 1) / 2
    while y <= y1:
        svg.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (left, sy(y), W - right, sy(y)))
        svg.append('<text x="%d" y="%.1f" text-anchor="end">%.1f</text>' % (left - 6, sy(y) + 4, y))
        y += 0.5
    svg.append('<text x="%d" y="%d" text-anchor="middle">iteration</text>' % ((left + W - right) // 2, H - 20))
    svg.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">loss '
               '(masked LM + next sentence)</text>' % ((top + H - bottom) // 2, (top + H - bottom) // 2))
    summary = []
    for i, (name, color, (steps, losses, vals)) in enumerate(runs):
        raw = " ".join("%.1f,%.1f" % (sx(s), sy(l)) for s, l in zip(steps, losses))
        svg.append('<polyline points="%s" fill="none" stroke="%s" stroke-opacity="0.25" '
                   'stroke-width="1"/>' % (raw, color))
        avg = moving_average(losses, 25)
        smooth = " ".join("%.1f,%.1f" % (sx(s), sy(l)) for s, l in zip(steps, avg))
        svg.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>' % (smooth, color))
        for s, v in vals:
            svg.append('<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>' % (sx(s), sy(v), color))
        # Steps outside the range: a triangle at the edge and the value, one per run of steps.
        outside = [(s, l) for s, l in zip(steps, losses) if l > y1 or l < y0]
        runs_out = []
        for s, l in outside:
            if runs_out and s - runs_out[-1][-1][0] <= 10:
                runs_out[-1].append((s, l))
            else:
                runs_out.append([(s, l)])
        for group in runs_out:
            s, l = max(group, key=lambda p: abs(p[1] - (y0 + y1) / 2))
            high = l > y1
            ey = top if high else top + plot_h
            d = 7 if high else -7
            svg.append('<path d="M %.1f %.1f l -5 %d l 10 0 z" fill="%s"/>' % (
                sx(s), ey, d, color))
            svg.append('<text x="%.1f" y="%.1f" fill="%s" font-size="11">%.2f at step %d '
                       '(off the scale)</text>' % (sx(s) + 8, ey + (10 if high else -3), color, l, s))
        last = losses[-50:]
        final = sum(last) / len(last)
        val = vals[-1][1] if vals else float("nan")
        text = "%s: last 50 steps %.4f, final val %.4f" % (name, final, val)
        summary.append(text)
        ly = H + 12 + 18 * i  # the legend, below the axes' title
        svg.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>' % (
            left, ly - 4, left + 20, ly - 4, color))
        svg.append('<text x="%d" y="%d">%s</text>' % (left + 26, ly, text))
    svg.append('<text x="%d" y="%d" fill="#555">faint: every step; bold: 25-step mean; dots: '
               'validation; the y-axis spans the means and validation losses</text>'
               % (left, H + 12 + 18 * len(runs)))
    svg.append('</svg>')
    with open(out_path, "w") as f:
        f.write("\n".join(svg) + "\n")
    for t in summary:
        print(t)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
