"""Open the shipped examples' reports in headless Chromium: load times, screenshots, errors.

    python tests/bench/bench_report.py [--runs 5] [--out /tmp/reports] [--examples NAME ...]

Needs Debian's `chromium` (apt-get install -y chromium) and node with playwright-core:
`cd /tmp/pw && npm install playwright-core`, then pass --node-modules /tmp/pw/node_modules
(default: $NODE_PATH, else ./node_modules).

For each example it simulates the step, renders the report (timed), and loads the page
--runs times in a fresh tab, timing from navigation to the moment every figure is drawn (the
page sets body[data-rendered]); then it zooms the time axes to a tenth of the step (timed:
the binned figures re-bin) and checks the page's binning against
`sim.report.binned.binned_z`, and the pipeline's micro-batch labels (at the default zoom and
zoomed) against `sim.report.labels.label_plan`; last, it zooms the lanes onto the longest op
of a communication lane and hovers it with the mouse, printing the hover text (bytes, bus
bandwidth) next to the bandwidth worked out by hand. It writes step.html, a full-page
screenshot, one per figure, zoomed.png, hover.png and warmup.png (after the pipeline's
warm-up button) under --out, and prints one row per
example: size, render time, load time (median, min, max), zoom time, DOM elements, console
errors.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sim.config import EXAMPLES, example_path, load_experiment
from sim.report import read_payload, render_report
from sim.report.binned import binned_z
from sim.report.labels import label_plan
from sim.simulate import predict

DRIVER = r"""
const { chromium } = require('playwright-core');
async function labelsNow(page) { // the pipeline's labels as drawn, and the range and width
  return page.evaluate(() => {
    const div = document.getElementById('parasim-pipeline'), xa = div._fullLayout.xaxis;
    const t = div.data.find((d) => d.meta && d.meta.labels);
    return { x: Array.from(t.x), y: Array.from(t.y), text: Array.from(t.text),
             range: xa.range, width: xa._length };
  });
}
(async () => {
  const [file, outDir, runs, chromiumPath] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath: chromiumPath, args: [
    '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
  const result = { loads: [], marks: [], errors: [] };
  for (let i = 0; i < Number(runs); i++) {
    const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
    page.on('console', (m) => { if (m.type() === 'error') result.errors.push(m.text()); });
    page.on('pageerror', (e) => result.errors.push(String(e)));
    const t0 = Date.now();
    await page.goto('file://' + file);
    await page.waitForFunction(() => document.body.dataset.rendered === 'yes', null,
                               { timeout: 120000 });
    result.loads.push((Date.now() - t0) / 1000);
    result.marks.push(await page.evaluate(() => Object.fromEntries(
      performance.getEntriesByType('mark').map((m) => [m.name, Math.round(m.startTime)]))));
    if (i === 0) result.labels = await labelsNow(page);
    if (i === 0) {
      result.nodes = await page.evaluate(() => document.getElementsByTagName('*').length);
      await page.screenshot({ path: outDir + '/page.png', fullPage: true });
      for (const id of await page.evaluate(() => Array.from(
          document.querySelectorAll('.figure')).map((d) => d.id))) {
        await page.locator('#' + id).screenshot({ path: outDir + '/' + id + '.png' });
      }
      // zoom every time axis to a tenth of the step around its middle, re-binning
      result.zoom = await page.evaluate(async () => {
        const spec = Object.values(window.parasim.specs)[0], T = spec.step_s;
        const t = performance.now();
        await window.parasim.zoom(null, [0.45 * T, 0.55 * T]);
        const seconds = (performance.now() - t) / 1000;
        const full = window.parasim.binned(spec, 0, T);
        return { seconds, z: full.update.z[0], indices: full.indices };
      });
      await page.waitForTimeout(500);
      await page.locator('#parasim-pipeline').screenshot({ path: outDir + '/zoomed.png' });
      result.zoomedLabels = await labelsNow(page);
      // hover a communication op with the mouse: the lanes zoomed to the longest op of the
      // first communication lane, the pointer on its middle
      const target = await page.evaluate(async () => {
        const spec = window.parasim.specs['parasim-lanes'];
        const trace = spec.traces.find((t) => t.rows[0].w);
        if (!trace) return null;
        const row = trace.rows[0];
        let i = 0;
        for (let j = 1; j < row.s.length; j++) if (row.e[j] - row.s[j] > row.e[i] - row.s[i]) i = j;
        const s = row.s[i] / 1e9, e = row.e[i] / 1e9, d = e - s;
        await window.parasim.zoom(null, [Math.max(0, s - d), e + d]);
        const div = document.getElementById('parasim-lanes');
        const xa = div._fullLayout.xaxis, ya = div._fullLayout.yaxis;
        div.scrollIntoView();
        const box = div.getBoundingClientRect();
        return { x: box.left + xa._offset + xa.l2p((s + e) / 2),
                 y: box.top + ya._offset + ya.l2p(trace.index), start: row.s[i],
                 end: row.e[i], what: spec.what[row.w[i]] };
      });
      if (target) {
        await page.mouse.move(target.x, target.y);
        await page.waitForTimeout(500);
        target.hover = await page.evaluate(() =>
          document.querySelector('#parasim-lanes .hoverlayer').textContent);
        await page.locator('#parasim-lanes').screenshot({ path: outDir + '/hover.png' });
      }
      result.hover = target;
      // the pipeline's warm-up button zooms every time axis onto the staircase
      const button = page.locator('#parasim-pipeline .updatemenu-button', { hasText: 'warm-up' });
      if (await button.count()) {
        await page.locator('#parasim-pipeline').scrollIntoViewIfNeeded();
        await button.click();
        await page.waitForTimeout(1500);
        result.warmRanges = await page.evaluate(() => ['parasim-pipeline', 'parasim-lanes',
          'parasim-memory-time'].map((id) => document.getElementById(id)._fullLayout.xaxis.range));
        result.warmLabels = await labelsNow(page);
        await page.locator('#parasim-pipeline').screenshot({ path: outDir + '/warmup.png' });
      }
    }
    await page.close();
  }
  await browser.close();
  console.log(JSON.stringify(result));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--examples", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--node-modules", type=Path,
                        default=Path(os.environ.get("NODE_PATH", "node_modules")))
    args = parser.parse_args()
    if not (args.node_modules / "playwright-core").is_dir():
        print(f"no playwright-core under {args.node_modules}: run `npm install playwright-core` "
              "in a folder and pass its node_modules as --node-modules", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="parasim-reports-"))
    driver = out / "driver.js"
    out.mkdir(parents=True, exist_ok=True)
    driver.write_text(DRIVER)
    print(f"reports and screenshots under {out}")
    print(f"{'example':<32} {'MB':>5} {'render s':>8} {'load s (median, min-max)':>26} "
          f"{'zoom s':>7} {'DOM':>6}  errors")
    for name in args.examples:
        exp = load_experiment(example_path(name))
        summary, times = predict(exp)
        start = time.perf_counter()
        page = render_report(exp, summary, times)
        render_s = time.perf_counter() - start
        folder = out / Path(name).stem
        folder.mkdir(exist_ok=True)
        html = folder / "step.html"
        html.write_text(page, encoding="utf-8")
        env = {**os.environ, "NODE_PATH": str(args.node_modules)}
        proc = subprocess.run(["node", str(driver), str(html.resolve()), str(folder),
                               str(args.runs), args.chromium], capture_output=True, text=True,
                              env=env, timeout=1200)
        if proc.returncode != 0:
            print(f"{name}: the browser run failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        loads = result["loads"]
        _check_binning(page, result["zoom"])
        payload = read_payload(page)
        drawn = result["labels"]
        _check_labels(payload, drawn)
        _check_labels(payload, result["zoomedLabels"])
        if "warmLabels" in result:
            _check_labels(payload, result["warmLabels"])
            ranges = result["warmRanges"]
            assert all(r == ranges[0] for r in ranges), f"time axes apart: {ranges}"
        print(f"{name:<32} {len(page.encode()) / 1e6:>5.2f} {render_s:>8.1f} "
              f"{statistics.median(loads):>10.2f} ({min(loads):.2f}-{max(loads):.2f})"
              f"{'':>6} {result['zoom']['seconds']:>7.2f} {result['nodes']:>6}  "
              f"{len(result['errors'])}{': ' + result['errors'][0] if result['errors'] else ''}")
        print(f"    marks of the first load (ms): {result['marks'][0]}")
        print(f"    micro-batch labels at the default zoom ({drawn['width']} px): "
              f"{len(drawn['text'])}, first row {_first_row(drawn)}; zoomed to a tenth: "
              f"{len(result['zoomedLabels']['text'])}")
        if "warmLabels" in result:
            a, b = result["warmRanges"][0]
            print(f"    warm-up button: every time axis at {a:.3f}-{b:.3f} s, "
                  f"{len(result['warmLabels']['text'])} labels")
        hover = result.get("hover")
        if hover:
            seconds = (hover["end"] - hover["start"]) / 1e9
            print(f"    hover on {hover['what'][0]} ({seconds * 1e3:.4g} ms, bus bandwidth "
                  f"by hand {hover['what'][1] / seconds / 1e9:.1f} GB/s): "
                  f"{hover['hover']!r}")
    return 0


def _check_labels(payload: dict, drawn: dict) -> None:
    """The page's labels against `sim.report.labels.label_plan` at the page's range and width."""
    figure = payload["figures"]["parasim-pipeline"]
    meta = next(t["meta"] for t in figure["data"] if (t.get("meta") or {}).get("labels"))
    rows: list[list[tuple[float, float, str, str]]] = [[] for _ in figure["layout"]["yaxis"]
                                                       ["tickvals"]]
    for trace in figure["data"]:
        kind = (trace.get("meta") or {}).get("passes")
        if not kind:
            continue
        data, ys = _typed(trace["customdata"]), _typed(trace["y"])
        for i, row in enumerate(ys):
            rows[int(row)].append((float(data[i, 0]), float(data[i, 1]), trace["text"][i], kind))
    for bars in rows:
        bars.sort()
    a, b = drawn["range"]
    plan = label_plan(rows, a, b, drawn["width"] / (b - a), meta["gap_s"])
    assert [(p.row, p.text) for p in plan] == list(zip(drawn["y"], drawn["text"], strict=True)), \
        "the page labels other passes than sim.report.labels"
    assert np.allclose([p.x for p in plan], drawn["x"], rtol=0, atol=1e-9)


def _first_row(drawn: dict) -> str:
    texts = [t for y, t in zip(drawn["y"], drawn["text"], strict=True) if y == 0]
    return " ".join(texts[:12]) + (" ..." if len(texts) > 12 else "")


def _typed(value: object) -> np.ndarray:
    if not isinstance(value, dict):
        return np.asarray(value)
    array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    if "shape" in value:
        array = array.reshape([int(n) for n in str(value["shape"]).split(",")])
    return array


def _check_binning(page: str, zoom: dict) -> None:
    """The page's binning of the first binned trace, over the whole step, against numpy's."""
    spec = read_payload(page)["binned"][0]
    rows = spec["traces"][0]["rows"]
    for row, drawn in zip(rows, zoom["z"], strict=True):
        expected = binned_z(row, 0.0, spec["step_s"], spec["bins"])
        assert np.allclose(drawn, expected, atol=1e-9), "page and numpy bin differently"


if __name__ == "__main__":
    raise SystemExit(main())
