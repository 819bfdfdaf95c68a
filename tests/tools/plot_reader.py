#!/usr/bin/python3
"""Checks an mt-plot SVG against the records it was drawn from, with Python's own XML parser.

  plot_reader.py training SVG RUN...    RUN = FILE[,FILE...] (a resumed run's logs in order)
  plot_reader.py memory SVG REPORT      REPORT = mt-memreport --from-log's JSONL

training: every panel's polyline of every run, mapped back through the panel's axis transform
(data-x-domain/-range, data-y-domain/-range), lands within half a pixel of the step records'
values (loss, learning rate, grad norm, tokens/s; the last record of an iteration wins), and the
tick labels sit where the transform puts their values. memory: each stacked segment is as tall
as its memory_check bytes (MiB) and stacked on the ones before it. Prints a JSON summary; exit 1
on a mismatch. Used by tests/tools/mt-plot.bats.
"""
import json
import math
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
CURVES = [("lm loss", "lm_loss"), ("learning rate", "lr"), ("grad norm", "grad_norm"), ("tokens/s", "tokens_per_s")]


def transform(panel):
    def pair(name):
        a, b = panel.get(name).split()
        return float(a), float(b)
    (x0, x1), (px0, px1) = pair("data-x-domain"), pair("data-x-range")
    (y0, y1), (py0, py1) = pair("data-y-domain"), pair("data-y-range")
    return (lambda x: px0 + (x - x0) / (x1 - x0) * (px1 - px0)), (lambda y: py0 + (y - y0) / (y1 - y0) * (py1 - py0))


def steps_of(run):
    steps = {}
    for path in run.split(","):
        for line in open(path):
            record = json.loads(line)
            if record.get("record") == "step":
                steps[record["iteration"]] = record
    return [steps[i] for i in sorted(steps)]


def check_ticks(panel, to_x, to_y, failures):
    for text in panel.iter(NS + "text"):
        kind = text.get("class")
        if kind == "y-tick" and abs(float(text.get("y")) - 4 - to_y(float(text.get("data-value")))) > 0.5:
            failures.append(f"{panel.get('data-title')}: y tick {text.text} off its value")
        if kind == "x-tick" and abs(float(text.get("x")) - to_x(float(text.get("data-value")))) > 0.5:
            failures.append(f"{panel.get('data-title')}: x tick {text.text} off its value")
        if kind in ("x-tick", "y-tick") and not math.isclose(float(text.text), float(text.get("data-value")),
                                                            rel_tol=1e-3, abs_tol=1e-12):
            failures.append(f"{panel.get('data-title')}: tick label {text.text} is not {text.get('data-value')}")


def check_training(svg, runs):
    root = ET.parse(svg).getroot()
    panels = {p.get("data-title"): p for p in root.iter(NS + "g") if p.get("class") == "panel"}
    failures, points = [], 0
    for title, key in CURVES:
        panel = panels.get(title)
        if panel is None:
            failures.append(f"no panel {title}")
            continue
        to_x, to_y = transform(panel)
        check_ticks(panel, to_x, to_y, failures)
        lines = panel.findall(NS + "polyline")
        if len(lines) != len(runs):
            failures.append(f"{title}: {len(lines)} lines for {len(runs)} runs")
            continue
        for line, run in zip(lines, runs):
            want = [(s["iteration"], s[key]) for s in steps_of(run)
                    if isinstance(s.get(key), (int, float)) and math.isfinite(s[key])]
            got = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
            if len(got) != len(want):
                failures.append(f"{title} {run}: {len(got)} points for {len(want)} records")
                continue
            for (px, py), (x, y) in zip(got, want):
                if abs(px - to_x(x)) > 0.5 or abs(py - to_y(y)) > 0.5:
                    failures.append(f"{title} {run}: ({px}, {py}) is not iteration {x} value {y}")
                points += 1
    return {"panels": len(panels), "points": points, "failures": failures}


def check_memory(svg, report):
    root = ET.parse(svg).getroot()
    panel = next(p for p in root.iter(NS + "g") if p.get("class") == "panel")
    _, to_y = transform(panel)
    checks = [json.loads(line) for line in open(report)]
    checks = [c for c in checks if c.get("record") == "memory_check"]
    segments = [r for r in panel.iter(NS + "rect") if r.get("class") == "segment"]
    failures, base = [], {}
    want = [(c["stage"], bar, c["category"], c[bar + "_bytes"]) for c in checks for bar in ("predicted", "measured")]
    got = [(s.get("data-group"), s.get("data-bar"), s.get("data-category"), float(s.get("data-value"))) for s in segments]
    if sorted((str(w[0]), w[1], w[2], float(w[3])) for w in want) != sorted(
            (g[0].split(",")[0].replace("stage ", ""), g[1], g[2], g[3]) for g in got):
        failures.append(f"segments {got} are not the report's {want}")
    for s in segments:
        key = (s.get("data-group"), s.get("data-bar"))
        mib = float(s.get("data-value")) / 2**20
        below = base.get(key, 0.0)
        top, bottom = to_y(below + mib), to_y(below)
        if abs(float(s.get("y")) - top) > 0.5 or abs(float(s.get("height")) - (bottom - top)) > 0.5:
            failures.append(f"{key} {s.get('data-category')}: drawn {s.get('y')}+{s.get('height')}, want {top}..{bottom}")
        base[key] = below + mib
    return {"segments": len(segments), "failures": failures}


def main():
    kind, svg, *inputs = sys.argv[1:]
    summary = check_training(svg, inputs) if kind == "training" else check_memory(svg, inputs[0])
    print(json.dumps(summary))
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
