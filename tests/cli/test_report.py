#!/usr/bin/env python3
"""End-to-end tests of `harmony-sim report`: the page of the bundled example sweep (one section per model titled
with it, ranked within the model; the best kind per (model, machine) and its speedup over the best baseline, as
a table and a heatmap, equal to what the rows say; throughput-vs-GPUs and cost-vs-time-to-train SVGs with the
expected series and Pareto front; machines by name; one timeline rect per op; one memory line per distinct
curve; each best plan's Chrome trace written beside the page and linked; no network references; the same bytes
twice), --model / --where / --rank-by / --top, a tiny hand-checkable sweep reported from other working folders,
a config's report, a plan on 80 GPUs (the first 64 drawn, the rest counted), bad input (exit 2, the file named, a hint), and a screenshot in headless Chromium whose pixels
show the timeline's forward and backward colours (SKIP, exit 77, when no Chromium is installed and CI is not set;
CI installs it)."""
import json
import csv
import html.parser
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

from clitest import PLAN_KINDS, ROOT, check, runner, summary

BIN = os.path.abspath(sys.argv[1])
EXAMPLE = os.path.join(ROOT, "configs/sweeps/example.yaml")
FWD_RGB = (0x4E, 0x79, 0xA7)  # sim/app/report.cpp kind_style: FWD and BWD fills
BWD_RGB = (0xF2, 0x8E, 0x2B)
run = runner(BIN, timeout=600)


class Page(html.parser.HTMLParser):
    """Collects what the checks need: section ids, table cells by table id, svg element counts."""

    def __init__(self):
        super().__init__()
        self.ids = set()
        self.tags = {}
        self.svg = None
        self.svg_counts = {}
        self.table = None
        self.tables = {}
        self.cell = None
        self.row = None
        self.resources = []
        self.elems = {}  # svg id -> [(tag, attrs)]
        self.h2 = None
        self.model_titles = []
        self.title = None
        self.in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if "id" in a:
            self.ids.add(a["id"])
        for k in ("src", "href"):
            if k in a and not a[k].startswith("#"):
                self.resources.append(f"{tag} {k}={a[k]}")
        if tag == "svg":
            self.svg = a.get("id")
        if self.svg:
            key = (self.svg, tag, a.get("class", ""))
            self.svg_counts[key] = self.svg_counts.get(key, 0) + 1
            self.elems.setdefault(self.svg, []).append((tag, a))
        if tag == "h2" and a.get("class") == "model-title":
            self.h2 = ""
        if tag == "title" and self.svg is None:
            self.in_title = True
            self.title = ""
        if tag == "table":
            self.table = a.get("id", "")
            self.tables.setdefault(self.table, [])
        if tag == "tr" and self.table is not None:
            self.row = []
        if tag in ("td", "th") and self.row is not None:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "h2" and self.h2 is not None:
            self.model_titles.append(self.h2)
            self.h2 = None
        if tag == "title":
            self.in_title = False
        if tag == "svg":
            self.svg = None
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(self.cell)
            self.cell = None
        if tag == "tr" and self.row is not None:
            self.tables[self.table].append(self.row)
            self.row = None
        if tag == "table":
            self.table = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data
        if self.h2 is not None:
            self.h2 += data
        if self.in_title:
            self.title += data


def parse(path):
    p = Page()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    p.feed(text)
    return p, text


def svg_elems(page, svg, tag, cls):
    """The attrs of the <tag> elements of svg `svg` whose class list has `cls`."""
    return [a for t, a in page.elems.get(svg, []) if t == tag and cls in a.get("class", "").split()]


def gpus_of(text):
    """'GPU0-3, GPU6' -> {0, 1, 2, 3, 6}."""
    out = set()
    for part in text.split(", "):
        m = re.fullmatch(r"GPU(\d+)(?:-(\d+))?", part)
        assert m, text
        lo = int(m.group(1))
        out |= set(range(lo, int(m.group(2) or lo) + 1))
    return out


def jsonl(folder):
    return [json.loads(x) for x in open(os.path.join(folder, "results.jsonl"))]


def kind_of(r):
    return r.get("plan_kind", r.get("kind"))


BASELINES = {"dp-swap", "pp-swap", "zero-infinity", "zero3-opt-offload", "fsdp-offload", "zero-offload", "l2l", "lohan", "zero2", "fsdp", "zero3"}


def expected_best_kinds(rows):
    """Per (model_name, machine_name), in order of appearance: (best kind, its N, best baseline, speedup text)."""
    groups = {}
    for r in rows:
        if r["model_name"] is None or r["machine_name"] is None:
            continue
        groups.setdefault((r["model_name"], r["machine_name"]), [])
        if r["status"] == "ok":
            groups[(r["model_name"], r["machine_name"])].append(r)
    out = {}
    for key, ok in groups.items():
        if not ok:
            out[key] = ("nothing fits", None, None, "-")
            continue
        best = max(ok, key=lambda r: r["throughput_samples_per_s"])  # the first of equals, like the report
        base = [r for r in ok if kind_of(r) in BASELINES]
        bb = max(base, key=lambda r: r["throughput_samples_per_s"]) if base else None
        sp = f'{best["throughput_samples_per_s"] / bb["throughput_samples_per_s"]:.2f}x' if bb else "no baseline fits"
        out[key] = (kind_of(best), best["gpus"], kind_of(bb) if bb else None, sp)
    return out


def pareto(points):
    """Indices of the (time, cost) points no other point beats on both (ties: the first)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def count(page, svg, tag, cls_prefix):
    return sum(n for (s, t, c), n in page.svg_counts.items() if s == svg and t == tag and c.startswith(cls_prefix))


def png_pixels(path):
    """Decodes an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes): (width, height, channels, rows)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            ch = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * ch
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        f = raw[i]
        line = bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - ch] if x >= ch else 0
            b = prev[x]
            c = prev[x - ch] if x >= ch else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pr) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, ch, rows


def color_counts(path, colors):
    w, h, ch, rows = png_pixels(path)
    want = {bytes(c): 0 for c in colors}
    for row in rows:
        for x in range(0, w * ch, ch):
            px = row[x : x + 3]
            if px in want:
                want[px] += 1
    return [want[bytes(c)] for c in colors]


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


def screenshot(browser, page, png, tmp):
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
            f"--user-data-dir={os.path.join(tmp, 'chromium-profile')}", "--window-size=1400,2600",
            f"--screenshot={png}", "file://" + os.path.abspath(page)]
    return subprocess.run(args, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "HOME": tmp})


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "example")
    # The sweep file as a relative path (run from the source folder): sweep.json records it so.
    r = run("sweep", "configs/sweeps/example.yaml", "--out", out, "--quiet")
    check("sweep exit 0", r.returncode == 0, r.stdout + r.stderr)
    rows = jsonl(out)
    ok = [x for x in rows if x["status"] == "ok"]
    models = list(dict.fromkeys(x["model_name"] for x in rows if x["model_name"]))
    machines = set(x["machine_name"] for x in rows if x["machine_name"])
    check("example: two models", len(models) == 2, models)

    # --- the default page of a sweep folder: one section per model
    r = run("report", out)
    page_path = os.path.join(out, "report.html")
    check("report exit 0", r.returncode == 0, r.stdout + r.stderr)
    check("report says where", page_path in r.stdout, r.stdout)
    best_lines = re.findall(r"^  (\S+): (\d+) ranked rows, best plan (.*) \(([0-9.]+) samples/s, (\d+) ops\), trace (.*)$",
                            r.stdout, re.M)
    check("report names each model's best plan", [b[0] for b in best_lines] == models, r.stdout)
    page, text = parse(page_path)
    for sec in ("overview", "best-kinds-table", "heatmap", "status", "status-table"):
        check(f"section {sec}", sec in page.ids, sorted(page.ids))
    check("page titles per model", page.model_titles == [f"Model: {m}" for m in models], page.model_titles)
    check("the page title names no single model", not any(m in page.title for m in models), page.title)
    check("self-contained: only links to the traces beside the page",
          all(re.fullmatch(r"a href=[\w.-]+\.trace\.json", x) for x in page.resources) and len(page.resources) == 2,
          page.resources)
    check("self-contained: no script, link, import or url()",
          not re.search(r"<script|<link|@import|url\(|<img|<iframe", text, re.I), "")
    check("no raw YAML anywhere in a table", not any("{" in c for t in page.tables.values() for row in t for c in row),
          [row for t in page.tables.values() for row in t if any("{" in c for c in row)][:3])
    by_point = {x["point"]: x for x in rows}
    for i, model in enumerate(models):
        for sec in (f"model-{i}", f"ranked-table-{i}", f"timeline-svg-{i}", f"memory-svg-{i}", f"cost-svg-{i}",
                    f"pareto-table-{i}", f"trace-link-{i}"):
            check(f"{model}: section {sec}", sec in page.ids, sorted(page.ids))
        mine = [x for x in ok if x["model_name"] == model]
        ranked = page.tables.get(f"ranked-table-{i}", [[]])
        head, body = ranked[0], ranked[1:]
        if not body:
            check(f"{model}: ranked rows", False, ranked)
            continue
        i_sps, i_point, i_machine = head.index("samples/s"), head.index("point"), head.index("machine")
        check(f"{model}: ranked rows = min(50, its ok rows)", len(body) == min(50, len(mine)), (len(body), len(mine)))
        check(f"{model}: ranked within the model",
              all(by_point[int(x[i_point])]["model_name"] == model for x in body), [x[i_point] for x in body])
        best = max(mine, key=lambda x: x["throughput_samples_per_s"])
        check(f"{model}: rank 1 = its highest throughput",
              abs(float(body[0][i_sps]) - best["throughput_samples_per_s"]) < 1e-3, (body[0], best))
        sps = [float(x[i_sps]) for x in body]
        check(f"{model}: highest first", sps == sorted(sps, reverse=True), sps)
        check(f"{model}: machine column by name",
              all(x[i_machine] == by_point[int(x[i_point])]["machine_name"] for x in body),
              [(x[i_machine], by_point[int(x[i_point])]["machine_name"]) for x in body][:5])
        bl = next((b for b in best_lines if b[0] == model), None)
        if bl:
            check(f"{model}: best plan throughput = rank 1's", abs(float(bl[3]) - float(body[0][i_sps])) < 1e-3,
                  (bl, body[0]))
            n_ops = int(bl[4])
            check(f"{model}: one timeline rect per op", count(page, f"timeline-svg-{i}", "rect", "op") == n_ops,
                  (count(page, f"timeline-svg-{i}", "rect", "op"), n_ops))
            check(f"{model}: critical path outlined", count(page, f"timeline-svg-{i}", "rect", "op crit") > 0, "")
            # the trace beside the page, linked, valid Chrome trace JSON with one X event per op
            link = re.search(rf'<a id="trace-link-{i}" class="trace" href="([^"]+)"', text)
            trace_path = os.path.join(out, link.group(1)) if link else ""
            check(f"{model}: trace linked and written", link is not None and os.path.isfile(trace_path)
                  and os.path.abspath(trace_path) == os.path.abspath(bl[5]), (link and link.group(1), bl[5]))
            if link and os.path.isfile(trace_path):
                try:
                    events = json.load(open(trace_path))["traceEvents"]
                    xs = [e for e in events if e.get("ph") == "X"]
                    check(f"{model}: trace has one X event per op", len(xs) == n_ops, (len(xs), n_ops))
                    check(f"{model}: trace has memory counters", any(e.get("ph") == "C" for e in events), "")
                except (ValueError, KeyError) as e:
                    check(f"{model}: trace is Chrome trace JSON", False, e)
        # memory: one line per distinct curve, every GPU of the best plan labelled once
        mem = svg_elems(page, f"memory-svg-{i}", "polyline", "mem")
        pts = [a["points"] for a in mem]
        check(f"{model}: no duplicate memory lines", len(pts) == len(set(pts)) and pts, len(pts) - len(set(pts)))
        labelled = [g for a in mem for g in sorted(gpus_of(a.get("data-gpus", "GPU999")))]
        check(f"{model}: each GPU on one memory line", sorted(labelled) == list(range(best["gpus"])),
              (labelled, best["gpus"]))
        # throughput vs GPUs: per machine one chart, one series per kind that fits there, one dot per GPU count
        mach = list(dict.fromkeys(x["machine_name"] for x in mine))
        for j, mn in enumerate(mach):
            svg = f"throughput-svg-{i}-{j}"
            series = [a.get("data-series") for a in svg_elems(page, svg, "polyline", "series")]
            want = list(dict.fromkeys(kind_of(x) for x in mine if x["machine_name"] == mn))
            check(f"{model} on {mn}: throughput series", series == want, (series, want))
            dots = len(svg_elems(page, svg, "circle", "pt"))
            want_dots = len(set((kind_of(x), x["gpus"]) for x in mine if x["machine_name"] == mn))
            check(f"{model} on {mn}: one dot per kind and GPU count", dots == want_dots, (dots, want_dots))
        # cost vs time to train: a dot per costed row; the Pareto front marked and tabled
        costed = [x for x in mine if x["cost"] and x["time_to_train_s"]]
        dots = svg_elems(page, f"cost-svg-{i}", "circle", "pt")
        front = pareto([(x["time_to_train_s"], x["cost"]) for x in costed])
        check(f"{model}: a cost dot per costed row", len(dots) == len(costed) > 0, (len(dots), len(costed)))
        check(f"{model}: Pareto front marked", len(svg_elems(page, f"cost-svg-{i}", "circle", "front")) == len(front),
              (len(svg_elems(page, f"cost-svg-{i}", "circle", "front")), len(front)))
        check(f"{model}: Pareto line", len(svg_elems(page, f"cost-svg-{i}", "polyline", "pareto")) == 1, "")
        pt = page.tables.get(f"pareto-table-{i}", [[]])
        check(f"{model}: Pareto table", sorted(int(x[-1]) for x in pt[1:]) == sorted(costed[k]["point"] for k in front),
              (pt, [costed[k]["point"] for k in front]))

    # best kind per (model, machine): table and heatmap equal to what the rows say
    want = expected_best_kinds(rows)
    table_rows = page.tables.get("best-kinds-table", [[]])[1:]
    check("best-kinds: one row per (model, machine)", len(table_rows) == len(want), (table_rows, want))
    for t in table_rows:
        w = want.get((t[0], t[1]))
        check(f"best-kinds {t[0]} on {t[1]}", w is not None and t[2] == f"{w[0]} (N={w[1]})" and t[4] == w[3],
              (t, w))
    heat = page.tables.get("heatmap", [[]])
    for row in heat[1:]:
        for mn, cell in zip(heat[0][1:], row[1:]):
            w = want.get((row[0], mn))
            check(f"heatmap {row[0]} on {mn}", w is not None and cell == f"{w[0]}{w[3]}", (cell, w))
    check("heatmap: models by machines", len(heat) == 1 + len(models) and len(heat[0]) == 1 + len(machines), heat)

    status = page.tables.get("status-table", [[]])[1:]
    check("feasibility: one row per plan kind", len(status) == 6, status)
    check("feasibility counts add up", sum(int(s[1]) + int(s[2]) + int(s[3]) for s in status) == len(rows), status)
    check("invalid reason shown", any("exceeds machine.gpus" in s[4] for s in status if s[3] != "0"), status)
    first = open(page_path, "rb").read()
    traces = {b[5]: open(b[5], "rb").read() for b in best_lines if os.path.isfile(b[5])}
    r = run("report", out)
    check("same inputs, same bytes", r.returncode == 0 and open(page_path, "rb").read() == first, r.stderr)
    check("same traces", all(open(p, "rb").read() == b for p, b in traces.items()), "")

    # --- --model: that model only, named in the title
    one = os.path.join(tmp, "one.html")
    r = run("report", out, "--model", models[1], "--out", one)
    check("--model exit 0", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        p1, _ = parse(one)
        check("--model: one section, its title", p1.model_titles == [f"Model: {models[1]}"], p1.model_titles)
        check("--model: the page title names it", models[1] in p1.title, p1.title)
        check("--model: trace beside --out", os.path.isfile(os.path.join(tmp, f"one.{models[1]}.trace.json")),
              os.listdir(tmp))

    # --- --where, --rank-by, --top
    small = os.path.join(tmp, "paper.html")
    r = run("report", out, "--where", "machine_name=paper-1080ti", "--top", "0", "--out", small)
    check("--where exit 0", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        p2, _ = parse(small)
        for i, model in enumerate(models):
            want_n = [x for x in ok if x["machine_name"] == "paper-1080ti" and x["model_name"] == model]
            check(f"--where keeps the matching ok rows ({model})",
                  len(p2.tables.get(f"ranked-table-{i}", [[]])) - 1 == len(want_n),
                  (len(p2.tables.get(f"ranked-table-{i}", [[]])) - 1, len(want_n)))
    r = run("report", out, "--rank-by", "cost", "--top", "5", "--model", models[0], "--out",
            os.path.join(tmp, "cost.html"))
    check("--rank-by cost exit 0", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        p3, _ = parse(os.path.join(tmp, "cost.html"))
        for i, model in enumerate(models[:1]):
            t = p3.tables.get(f"ranked-table-{i}", [["cost"]])
            costs = [float(x[t[0].index("cost")]) for x in t[1:]]
            cheapest = min(x["cost"] for x in ok if x["cost"] and x["model_name"] == model)
            check(f"--rank-by cost: cheapest first ({model})", costs == sorted(costs) and len(costs) > 0 and abs(costs[0] - cheapest) < 1,
                  (costs, cheapest))
            check(f"--top 5 ({model})", len(t) - 1 == 5, len(t))

    # --- a tiny sweep, hand-checkable, run and reported from other working folders
    proj = os.path.join(tmp, "proj")
    os.makedirs(os.path.join(proj, "sweeps"))
    shutil.copytree(os.path.join(ROOT, "configs/profiles"), os.path.join(proj, "profiles"))
    shutil.copy(os.path.join(ROOT, "configs/sweeps/example_base.yaml"), os.path.join(proj, "sweeps", "tiny_base.yaml"))
    with open(os.path.join(proj, "sweeps", "tiny.yaml"), "w") as f:
        f.write("base: tiny_base.yaml\n"
                "grid:\n"
                "  model.profile: [../profiles/gpt2_medium.json]\n"
                "  machine: [paper-1080ti, {preset: rtx4090-4x, price_per_hour: 2.4}]\n"
                "  plan.gpus: [1, 2]\n"
                "kinds: [harmony-pp, dp-swap]\n"
                "budget: {samples: 100000}\n")
    r = run("sweep", "sweeps/tiny.yaml", "--out", "runs/tiny", "--quiet", cwd=proj)
    check("tiny sweep", r.returncode == 0, r.stdout + r.stderr)
    tiny = os.path.join(proj, "runs", "tiny")
    trows = jsonl(tiny) if r.returncode == 0 else []
    check("tiny: 8 rows", len(trows) == 8, len(trows))
    # from another folder: the sweep file is found from the results folder's parents
    r = run("report", "proj/runs/tiny", cwd=tmp)
    check("report from another folder: exit 0", r.returncode == 0, r.stdout + r.stderr)
    check("report from another folder: no warning", "warning" not in r.stderr, r.stderr)
    if r.returncode == 0:
        pt, _ = parse(os.path.join(tiny, "report.html"))
        check("tiny: best plan re-simulated", count(pt, "timeline-svg-0", "rect", "op") > 0, sorted(pt.ids))
        check("tiny: trace beside the page", os.path.isfile(os.path.join(tiny, "report.gpt2_medium.trace.json")),
              os.listdir(tiny))
        # hand-checkable: 2 machines, each its best kind by throughput and the speedup over dp-swap
        want = expected_best_kinds(trows)
        got = {(t[0], t[1]): t for t in pt.tables.get("best-kinds-table", [[]])[1:]}
        check("tiny: best-kinds rows", set(got) == set(want) and len(want) == 2, (got, want))
        for key, w in want.items():
            t = got.get(key)
            ok_rows = [x for x in trows if x["status"] == "ok" and (x["model_name"], x["machine_name"]) == key]
            hp = max((x for x in ok_rows if kind_of(x) == "harmony-pp"), key=lambda x: x["throughput_samples_per_s"])
            ds = max((x for x in ok_rows if kind_of(x) == "dp-swap"), key=lambda x: x["throughput_samples_per_s"])
            win = hp if hp["throughput_samples_per_s"] > ds["throughput_samples_per_s"] else ds
            sp = f'{win["throughput_samples_per_s"] / ds["throughput_samples_per_s"]:.2f}x'
            check(f"tiny: best kind on {key[1]}", t is not None and t[2] == f'{kind_of(win)} (N={win["gpus"]})'
                  and t[4] == sp and t[5] == f'dp-swap (N={ds["gpus"]})', (t, kind_of(win), sp))
    # the in-memory ceiling is neither a baseline nor a Harmony kind: a sweep that lists it shows it as the best kind
    # when it wins, never in the best-Harmony column (before: every kind that was not a baseline went there)
    with open(os.path.join(proj, "sweeps", "ceiling.yaml"), "w") as f:
        f.write("base: tiny_base.yaml\n"
                "grid:\n"
                "  model.profile: [../profiles/gpt2_medium.json]\n"
                "  machine: [paper-1080ti]\n"
                "  plan.gpus: [2]\n"
                "kinds: [harmony-pp, resident]\n")
    r = run("sweep", "sweeps/ceiling.yaml", "--out", "runs/ceiling", "--quiet", cwd=proj)
    check("ceiling sweep", r.returncode == 0, r.stdout + r.stderr)
    crows = jsonl(os.path.join(proj, "runs", "ceiling")) if r.returncode == 0 else []
    r = run("report", "runs/ceiling", cwd=proj)
    check("ceiling report: exit 0", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0 and crows:
        pc, _ = parse(os.path.join(proj, "runs", "ceiling", "report.html"))
        rows_c = pc.tables.get("best-kinds-table", [[]])[1:]
        ok = {kind_of(x): x for x in crows if x["status"] == "ok"}
        check("ceiling: both kinds fit, resident the faster (on 2 GPUs)", set(ok) == {"harmony-pp", "resident"} and
              ok["resident"]["throughput_samples_per_s"] > ok["harmony-pp"]["throughput_samples_per_s"], ok)
        best = max(ok.values(), key=lambda x: x["throughput_samples_per_s"]) if ok else None
        check("ceiling: one best-kinds row, the best kind the faster, harmony-pp the best Harmony kind, no baseline",
              len(rows_c) == 1 and best is not None and rows_c[0][2] == f'{kind_of(best)} (N={best["gpus"]})' and
              rows_c[0][5] == "-" and rows_c[0][7] == f'harmony-pp (N={ok["harmony-pp"]["gpus"]})', (rows_c, best))
    # results outside the project: sweep.json records the sweep file's absolute path (sweep_file_absolute), so
    # the report finds it from any folder; without that key (a folder written elsewhere, the key removed) only
    # --sweep finds it, and the page has all but the re-simulation
    elsewhere = os.path.join(tmp, "elsewhere")
    r = run("sweep", "sweeps/tiny.yaml", "--out", elsewhere, "--quiet", cwd=proj)
    check("tiny sweep elsewhere", r.returncode == 0, r.stdout + r.stderr)
    meta = json.load(open(os.path.join(elsewhere, "sweep.json")))
    check("sweep.json: sweep_file_absolute", os.path.isabs(meta.get("sweep_file_absolute", "")) and os.path.realpath(
        meta["sweep_file_absolute"]) == os.path.realpath(os.path.join(proj, "sweeps", "tiny.yaml")), meta)
    r = run("report", elsewhere, cwd=tmp)
    check("sweep_file_absolute: found from another folder", r.returncode == 0 and "warning" not in r.stderr,
          r.stdout + r.stderr)
    if r.returncode == 0:
        pe, _ = parse(os.path.join(elsewhere, "report.html"))
        check("sweep_file_absolute: timeline", "timeline-svg-0" in pe.ids, sorted(pe.ids))
    del meta["sweep_file_absolute"]
    json.dump(meta, open(os.path.join(elsewhere, "sweep.json"), "w"))
    r = run("report", elsewhere, cwd=tmp)
    check("sweep file not found: exit 0", r.returncode == 0, r.stdout + r.stderr)
    check("sweep file not found: warning with the hint", "warning" in r.stderr and "--sweep" in r.stderr, r.stderr)
    if r.returncode == 0:
        pe, _ = parse(os.path.join(elsewhere, "report.html"))
        check("without the sweep file: overview and charts", "heatmap" in pe.ids and "throughput-svg-0-0" in pe.ids,
              sorted(pe.ids))
        check("without the sweep file: no timeline", "timeline-svg-0" not in pe.ids, "")
    r = run("report", elsewhere, "--sweep", "proj/sweeps/tiny.yaml", "--out", "elsewhere.html", cwd=tmp)
    check("--sweep from another folder", r.returncode == 0 and "warning" not in r.stderr, r.stdout + r.stderr)
    if r.returncode == 0:
        pe, _ = parse(os.path.join(tmp, "elsewhere.html"))
        check("--sweep: timeline", "timeline-svg-0" in pe.ids, sorted(pe.ids))
        check("--sweep: trace beside the relative --out", os.path.isfile(os.path.join(tmp,
              "elsewhere.gpt2_medium.trace.json")), os.listdir(tmp))

    # one preset at two prices: two machines, told apart by their grid values (without YAML braces)
    with open(os.path.join(proj, "sweeps", "prices.yaml"), "w") as f:
        f.write("base: tiny_base.yaml\n"
                "grid:\n"
                "  machine: [paper-1080ti, {preset: paper-1080ti, price_per_hour: 2.5}]\n"
                "kinds: [harmony-pp]\n")
    r = run("sweep", "sweeps/prices.yaml", "--out", "runs/prices", "--quiet", cwd=proj)
    check("prices sweep", r.returncode == 0, r.stdout + r.stderr)
    r = run("report", "runs/prices", cwd=proj)
    check("prices report", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        pp, _ = parse(os.path.join(proj, "runs", "prices", "report.html"))
        heads = pp.tables.get("heatmap", [[]])[0][1:]
        check("one preset at two prices: two labelled columns",
              heads == ["paper-1080ti", "paper-1080ti (preset: paper-1080ti, price_per_hour: 2.5)"], heads)

    # --- a config: every plan kind ranked, its best plan's trace beside the page
    cfg_page = os.path.join(tmp, "config.html")
    r = run("report", "configs/examples/gpt2_medium_search.yaml", "--out", cfg_page, "--set", "plan.gpus=2")
    check("config report exit 0", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        p4, _ = parse(cfg_page)
        check("config: every plan kind", sorted(row[1] for row in p4.tables.get("ranked-table-0", [])[1:]) == sorted(PLAN_KINDS),
              p4.tables.get("ranked-table-0"))
        check("config: a timeline", count(p4, "timeline-svg-0", "rect", "op") > 0, p4.svg_counts)
        check("config: trace", os.path.isfile(os.path.join(tmp, "config.trace.json")), os.listdir(tmp))

    # --- a plan on more GPUs than the page draws (80 dp-swap replicas, no topology): lanes, memory lines and
    # per-GPU rows of the first 64 GPUs and a note for the rest; the trace keeps every GPU's ops
    wide_dir = os.path.join(tmp, "wide")
    os.mkdir(wide_dir)
    wide_sweep = os.path.join(wide_dir, "wide.yaml")
    with open(wide_sweep, "w") as f:
        f.write(f"base: {os.path.join(ROOT, 'configs/default.yaml')}\nset: {{machine.gpus: 80, machine.topology: none}}\n"
                "grid: {plan.gpus: [80], plan.minibatch: [80]}\nkinds: [dp-swap]\n")
    wide_out = os.path.join(wide_dir, "out")
    r = run("sweep", wide_sweep, "--out", wide_out, "--quiet")
    check("80 GPUs: sweep", r.returncode == 0, r.stdout + r.stderr)
    r = run("report", wide_out)
    check("80 GPUs: report", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        page = open(os.path.join(wide_out, "report.html"), encoding="utf-8").read()
        lanes = re.findall(r'class="label" text-anchor="end">GPU(\d+) ', page)
        check("80 GPUs: lanes of GPU0-63 only", lanes and max(map(int, lanes)) == 63 and "0" in lanes, sorted(set(lanes)))
        check("80 GPUs: the others counted in notes",
              page.count("GPU64-79 (16 of 80 GPUs) are not drawn") == 2 and
              page.count("GPU64-79 (16 of 80 GPUs) are not listed") == 1, re.findall(r"GPU64-79[^<]*", page))
        trace = json.load(open(os.path.join(wide_out, "report.bert_large_seqlen512.trace.json")))
        pids = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
        check("80 GPUs: the trace has every GPU's ops", pids == set(range(80)), sorted(pids)[-3:])

    # --- bad input: exit 2, the file or flag named, a hint; never a half-written page
    def bad(name, args, *needles, cwd=ROOT):
        r = run("report", *args, cwd=cwd)
        msg = r.stderr
        check(f"{name}: exit 2", r.returncode == 2, (r.returncode, r.stdout, msg))
        for n in needles:
            check(f"{name}: says {n!r}", n in msg, msg)
        check(f"{name}: hint", "hint" in msg or "use " in msg or "give " in msg, msg)

    bad("missing", [os.path.join(tmp, "nope")], "no such file or folder")
    bad("config without --out", ["configs/examples/gpt2_medium_search.yaml"], "--out")
    bad("unknown column", [out, "--where", "colour=red"], "--where", "colour", "throughput_samples_per_s")
    bad("not KEY=VALUE", [out, "--where", "kind"], "KEY=VALUE")
    bad("unknown ranking", [out, "--rank-by", "speed"], "speed", "time_to_train")
    bad("unknown model", [out, "--model", "gpt5"], "--model", "gpt5", models[0], models[1])
    empty = os.path.join(tmp, "empty")
    os.mkdir(empty)
    bad("not a sweep folder", [empty], "sweep.json")
    bad("--where on a config", ["configs/examples/gpt2_medium_search.yaml", "--out", cfg_page, "--where", "a=b"],
        "--where")
    # results whose sweep file changed since: refused, the page left as it was
    sw_dir = os.path.join(tmp, "sw")
    os.mkdir(sw_dir)
    shutil.copy(EXAMPLE, os.path.join(sw_dir, "example.yaml"))
    shutil.copy(os.path.join(ROOT, "configs/sweeps/example_base.yaml"), os.path.join(sw_dir, "example_base.yaml"))
    shutil.copytree(os.path.join(ROOT, "configs/profiles"), os.path.join(tmp, "profiles"))
    sw_out = os.path.join(tmp, "sw-out")
    r = run("sweep", os.path.join(sw_dir, "example.yaml"), "--out", sw_out, "--quiet")
    check("copied sweep runs", r.returncode == 0, r.stdout + r.stderr)
    r = run("report", sw_out, "--model", models[0])
    check("copied sweep report", r.returncode == 0, r.stdout + r.stderr)
    before = open(os.path.join(sw_out, "report.html"), "rb").read()
    with open(os.path.join(sw_dir, "example.yaml")) as f:
        edited = f.read().replace("samples: 1000000", "samples: 2000000")
    with open(os.path.join(sw_dir, "example.yaml"), "w") as f:
        f.write(edited)
    bad("changed sweep file", [sw_out], "example.yaml", "not the one these results came from", "--sweep")
    check("refused report keeps the old page", open(os.path.join(sw_out, "report.html"), "rb").read() == before, "")
    bad("--sweep elsewhere", [sw_out, "--sweep", os.path.join(tmp, "none.yaml")], "none.yaml", "not found")
    # a corrupt row
    lines = open(os.path.join(out, "results.jsonl")).read().splitlines(keepends=True)
    corrupt = os.path.join(tmp, "corrupt")
    shutil.copytree(out, corrupt)
    lines[3] = lines[3][: len(lines[3]) // 2] + "\n"
    open(os.path.join(corrupt, "results.jsonl"), "w").writelines(lines)
    # the one recovery, as `sweep` names it: the sweep again on this folder with --repair (keeps the good rows)
    bad("corrupt row", [corrupt], "results.jsonl:4", f"--out {corrupt} --repair")

    # --- headless Chromium: the page renders and its timeline is drawn
    browser = find_chromium()
    skipped = False
    if browser is None:
        if os.environ.get("CI"):
            check("chromium installed (CI)", False, "no chromium on PATH: scripts/install-deps.sh installs it")
        else:
            skipped = True
    else:
        shot_page = os.path.join(tmp, "shot.html")
        r = run("report", out, "--model", models[0], "--top", "5", "--out", shot_page)
        check("screenshot page", r.returncode == 0, r.stderr)
        png = os.path.join(tmp, "shot.png")
        s = screenshot(browser, shot_page, png, tmp)
        check("chromium screenshot", s.returncode == 0 and os.path.exists(png), s.stdout + s.stderr)
        # The same page without its timeline: the forward/backward colours only in the legend.
        no_tl = os.path.join(tmp, "no-timeline.html")
        t = open(shot_page, encoding="utf-8").read()
        t = re.sub(r'<svg id="timeline-svg-[^"]*".*?</svg>', "", t, flags=re.S)
        open(no_tl, "w", encoding="utf-8").write(t)
        png2 = os.path.join(tmp, "no-timeline.png")
        s2 = screenshot(browser, no_tl, png2, tmp)
        check("chromium screenshot without timeline", s2.returncode == 0 and os.path.exists(png2), s2.stderr)
        if os.path.exists(png) and os.path.exists(png2):
            fwd, bwd = color_counts(png, [FWD_RGB, BWD_RGB])
            fwd0, bwd0 = color_counts(png2, [FWD_RGB, BWD_RGB])
            keep = os.environ.get("HARMONY_KEEP_SCREENSHOT")
            if keep:
                shutil.copy(png, keep)
            check("timeline drawn: forward pixels", fwd > 2000 and fwd > 5 * max(fwd0, 1), (fwd, fwd0))
            check("timeline drawn: backward pixels", bwd > 2000 and bwd > 5 * max(bwd0, 1), (bwd, bwd0))

if summary():
    sys.exit(1)
if skipped:
    print("SKIP: no Chromium on PATH (apt-get install chromium); the screenshot check did not run")
    sys.exit(77)
