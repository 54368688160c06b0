#!/usr/bin/env python3
"""End-to-end tests of `harmony-sim report`: the page of the bundled example sweep (sections, ranked table equal
to the CSV's best rows, one timeline rect per op, one memory line per GPU, no network references, the same bytes
twice), --where / --rank-by / --top, a config's report, bad input (exit 2, the file named, a hint), and a
screenshot in headless Chromium whose pixels show the timeline's forward and backward colours (SKIP, exit 77,
when no Chromium is installed and CI is not set; CI installs it)."""
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

BIN = sys.argv[1]
ROOT = os.path.abspath(os.environ.get("HARMONY_SOURCE_DIR", "."))
EXAMPLE = os.path.join(ROOT, "configs/sweeps/example.yaml")
failures = []
passed = 0
FWD_RGB = (0x4E, 0x79, 0xA7)  # sim/report.cpp kind_style: FWD and BWD fills
BWD_RGB = (0xF2, 0x8E, 0x2B)


def run(*args, timeout=600):
    return subprocess.run([BIN, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(f"{name}: {str(detail)[:2000]}")


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
        if tag == "table":
            self.table = a.get("id", "")
            self.tables.setdefault(self.table, [])
        if tag == "tr" and self.table is not None:
            self.row = []
        if tag in ("td", "th") and self.row is not None:
            self.cell = ""

    def handle_endtag(self, tag):
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


def parse(path):
    p = Page()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    p.feed(text)
    return p, text


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
    r = run("sweep", EXAMPLE, "--out", out, "--quiet")
    check("sweep exit 0", r.returncode == 0, r.stdout + r.stderr)
    rows = list(csv.DictReader(open(os.path.join(out, "results.csv"), newline="")))
    ok = [x for x in rows if x["status"] == "ok"]

    # --- the default page of a sweep folder
    r = run("report", out)
    page_path = os.path.join(out, "report.html")
    check("report exit 0", r.returncode == 0, r.stdout + r.stderr)
    check("report says where", page_path in r.stdout and "best plan" in r.stdout, r.stdout)
    m = re.search(r"best plan (.*) \(([0-9.]+) samples/s, (\d+) ops\)", r.stdout)
    check("report names the best plan", m is not None, r.stdout)
    page, text = parse(page_path)
    for sec in ("ranked", "best", "timeline", "memory", "ledger", "bottleneck", "status", "timeline-svg",
                "memory-svg", "ranked-table", "status-table"):
        check(f"section {sec}", sec in page.ids, sorted(page.ids))
    check("self-contained: no src/href out of the page", page.resources == [], page.resources)
    check("self-contained: no script, link, import or url()",
          not re.search(r"<script|<link|@import|url\(|<img|<iframe", text, re.I), "")
    ranked = page.tables["ranked-table"]
    head, body = ranked[0], ranked[1:]
    check("ranked rows = min(50, ok rows)", len(body) == min(50, len(ok)), (len(body), len(ok)))
    best_csv = max(ok, key=lambda x: float(x["throughput_samples_per_s"]))
    i_sps = head.index("samples/s")
    i_point = head.index("point")
    check("rank 1 = the CSV's highest throughput",
          abs(float(body[0][i_sps]) - float(best_csv["throughput_samples_per_s"])) < 1e-3,
          (body[0], best_csv["throughput_samples_per_s"]))
    sps = [float(x[i_sps]) for x in body]
    check("ranked by throughput, highest first", sps == sorted(sps, reverse=True), sps)
    if m:
        check("best plan throughput = rank 1's", abs(float(m.group(2)) - float(body[0][i_sps])) < 1e-3,
              (m.group(2), body[0][i_sps]))
        n_ops = int(m.group(3))
        check("one timeline rect per op", count(page, "timeline-svg", "rect", "op") == n_ops,
              (count(page, "timeline-svg", "rect", "op"), n_ops))
        check("critical path outlined", count(page, "timeline-svg", "rect", "op crit") > 0, page.svg_counts)
        best_row = next(x for x in rows if x["point"] == body[0][i_point])
        check("one memory line per GPU used", count(page, "memory-svg", "polyline", "mem") >= int(best_row["gpus"]),
              (count(page, "memory-svg", "polyline", "mem"), best_row["gpus"]))
    status = page.tables["status-table"][1:]
    check("feasibility: one row per plan kind", len(status) == 6, status)
    check("feasibility counts add up", sum(int(s[1]) + int(s[2]) + int(s[3]) for s in status) == len(rows), status)
    check("invalid reason shown", any("exceeds machine.gpus" in s[4] for s in status if s[3] != "0"), status)
    first = open(page_path, "rb").read()
    r = run("report", out)
    check("same inputs, same bytes", r.returncode == 0 and open(page_path, "rb").read() == first, r.stderr)

    # --- --where, --rank-by, --top
    small = os.path.join(tmp, "paper.html")
    r = run("report", out, "--where", "machine_name=paper-1080ti", "--top", "0", "--out", small)
    check("--where exit 0", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        p2, _ = parse(small)
        want = [x for x in ok if x["machine_name"] == "paper-1080ti"]
        check("--where keeps the matching ok rows", len(p2.tables["ranked-table"]) - 1 == len(want),
              (len(p2.tables["ranked-table"]) - 1, len(want)))
    r = run("report", out, "--rank-by", "cost", "--top", "5", "--out", os.path.join(tmp, "cost.html"))
    check("--rank-by cost exit 0", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        p3, _ = parse(os.path.join(tmp, "cost.html"))
        t = p3.tables["ranked-table"]
        costs = [float(x[t[0].index("cost")]) for x in t[1:]]
        cheapest = min(float(x["cost"]) for x in ok if x["cost"])
        check("--rank-by cost: cheapest first", costs == sorted(costs) and abs(costs[0] - cheapest) < 1, (costs, cheapest))
        check("--top 5", len(t) - 1 == 5, len(t))

    # --- a config: every plan kind ranked
    cfg_page = os.path.join(tmp, "config.html")
    r = run("report", "configs/examples/gpt2_medium_search.yaml", "--out", cfg_page, "--set", "plan.gpus=2")
    check("config report exit 0", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        p4, _ = parse(cfg_page)
        check("config: six plan kinds", len(p4.tables["ranked-table"]) - 1 == 6, p4.tables["ranked-table"])
        check("config: a timeline", count(p4, "timeline-svg", "rect", "op") > 0, p4.svg_counts)

    # --- bad input: exit 2, the file or flag named, a hint; never a half-written page
    def bad(name, args, *needles):
        r = run("report", *args)
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
    r = run("report", sw_out)
    check("copied sweep report", r.returncode == 0, r.stdout + r.stderr)
    before = open(os.path.join(sw_out, "report.html"), "rb").read()
    with open(os.path.join(sw_dir, "example.yaml"), "a") as f:
        f.write("# edited\n")
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
    bad("corrupt row", [corrupt], "results.jsonl:4")

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
        r = run("report", out, "--top", "5", "--out", shot_page)
        check("screenshot page", r.returncode == 0, r.stderr)
        png = os.path.join(tmp, "shot.png")
        s = screenshot(browser, shot_page, png, tmp)
        check("chromium screenshot", s.returncode == 0 and os.path.exists(png), s.stdout + s.stderr)
        # The same page without its timeline: the forward/backward colours only in the legend.
        no_tl = os.path.join(tmp, "no-timeline.html")
        t = open(shot_page, encoding="utf-8").read()
        t = re.sub(r'<svg id="timeline-svg".*?</svg>', "", t, flags=re.S)
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

for f in failures:
    print("FAIL", f)
print(f"{passed} passed, {len(failures)} failed")
if failures:
    sys.exit(1)
if skipped:
    print("SKIP: no Chromium on PATH (apt-get install chromium); the screenshot check did not run")
    sys.exit(77)
