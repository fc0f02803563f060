#!/usr/bin/env python3
"""Draws a Chrome trace written by hwqueue (chrome_trace, the demo's --trace)
as an SVG timeline: one row per track, one box per complete event, coloured
by category. Standard library only.

    cargo run --release --example demo -- --iterations 3 --trace /tmp/t.json
    python3 docs/trace_svg.py /tmp/t.json docs/trace.svg
"""

import json
import sys
from xml.sax.saxutils import escape

COLOURS = {
    "kernel": "#4c78a8",
    "copy": "#f58518",
    "signal": "#54a24b",
    "barrier": "#b279a2",
    "wait": "#e45756",
    "host": "#9d9da1",
}
ROW = 34
BOX = 24
LEFT = 210
WIDTH = 1400
TOP = 40


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    names = {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    if not events:
        sys.exit("no complete events in the trace")
    tids = sorted({e["tid"] for e in events}, key=lambda t: names.get(t, str(t)))
    start = min(float(e["ts"]) for e in events)
    end = max(float(e["ts"]) + float(e["dur"]) for e in events)
    span = max(end - start, 1e-3)
    scale = (WIDTH - LEFT - 20) / span
    height = TOP + ROW * len(tids) + 60
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="10" y="22" font-size="15">hwqueue timeline: {len(events)} events, '
        f"{span / 1000:.2f} ms</text>",
    ]
    for row, tid in enumerate(tids):
        y = TOP + row * ROW
        out.append(
            f'<text x="10" y="{y + BOX * 0.7:.1f}">{escape(names.get(tid, str(tid)))}</text>'
        )
        out.append(
            f'<line x1="{LEFT}" y1="{y + BOX + 4}" x2="{WIDTH - 20}" y2="{y + BOX + 4}" '
            f'stroke="#eee"/>'
        )
        for e in (e for e in events if e["tid"] == tid):
            x = LEFT + (float(e["ts"]) - start) * scale
            w = max(float(e["dur"]) * scale, 1.0)
            colour = COLOURS.get(e.get("cat"), "#333")
            title = f'{e["name"]} ({e.get("cat")}): {float(e["dur"]):.1f} µs'
            out.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{BOX}" fill="{colour}">'
                f"<title>{escape(title)}</title></rect>"
            )
            if w > 60:
                out.append(
                    f'<text x="{x + 3:.2f}" y="{y + BOX * 0.7:.1f}" fill="white">'
                    f'{escape(e["name"])}</text>'
                )
    # Time axis.
    y = TOP + ROW * len(tids) + 10
    out.append(f'<line x1="{LEFT}" y1="{y}" x2="{WIDTH - 20}" y2="{y}" stroke="#333"/>')
    ticks = 10
    for i in range(ticks + 1):
        x = LEFT + (WIDTH - LEFT - 20) * i / ticks
        ms = span * i / ticks / 1000
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 5}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 18}" text-anchor="middle">{ms:.2f} ms</text>')
    # Legend.
    x = LEFT
    for cat, colour in COLOURS.items():
        out.append(f'<rect x="{x}" y="{y + 28}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 16}" y="{y + 39}">{cat}</text>')
        x += 90
    out.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"{sys.argv[2]}: {len(events)} events on {len(tids)} tracks, {span / 1000:.2f} ms")


if __name__ == "__main__":
    main()
