// parasim report: unpack plotly.js and the figures (deflated, base64, inlined so the page
// works offline), bin the interval rows of the binned figures (sim/report/binned.py), draw,
// re-bin on zoom, keep the time axes zoomed together, and label the pipeline's passes.
(async function () {
  "use strict";

  function bytesOf(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return bytes;
  }

  async function inflate(id) {
    const bytes = bytesOf(document.getElementById(id).textContent.trim());
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new TextDecoder().decode(await new Response(stream).arrayBuffer());
  }

  const TYPES = { f8: Float64Array, f4: Float32Array, u2: Uint16Array, i1: Int8Array,
    i2: Int16Array, i4: Int32Array, u1: Uint8Array };

  function decode(spec) { // a typed array as plotly.py writes numpy arrays, or a plain list
    if (Array.isArray(spec)) return spec;
    return new TYPES[spec.dtype](bytesOf(spec.bdata).buffer);
  }

  // --- binned figures: busy fraction per bin from each row's intervals (whole ns) ----------
  function prepare(spec) {
    for (const trace of spec.traces) {
      for (const row of trace.rows) {
        const gap = decode(row.gap), dur = decode(row.dur), n = gap.length;
        row.s = new Float64Array(n);
        row.e = new Float64Array(n);
        row.cum = new Float64Array(n + 1);
        let t = 0;
        for (let i = 0; i < n; i++) {
          row.s[i] = t + gap[i];
          row.e[i] = row.s[i] + dur[i];
          t = row.e[i];
          row.cum[i + 1] = row.cum[i] + dur[i];
        }
        row.w = row.what ? decode(row.what) : null;
      }
    }
  }

  function upperBound(values, x) { // the first index whose value is > x
    let lo = 0, hi = values.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (values[mid] <= x) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  function busyBefore(row, t) { // intervals ended by t, and the part before t of the next one
    const i = upperBound(row.e, t);
    return row.cum[i] + (i < row.s.length ? Math.max(0, t - row.s[i]) : 0);
  }

  function seconds(ns) {
    const s = ns / 1e9;
    if (s >= 1) return s.toPrecision(4) + " s";
    if (s >= 1e-3) return (s * 1e3).toPrecision(4) + " ms";
    return (s * 1e6).toPrecision(4) + " µs";
  }

  function describe(row, what, lo, hi, busy) {
    let text = (lo / 1e9).toFixed(6) + "–" + (hi / 1e9).toFixed(6) + " s: busy " +
      (100 * busy).toFixed(busy > 0 && busy < 0.01 ? 2 : 0) + "%";
    const centre = (lo + hi) / 2, i = upperBound(row.e, centre);
    if (i < row.s.length && row.s[i] <= centre && row.e[i] - row.s[i] >= hi - lo) {
      const dur = row.e[i] - row.s[i];
      text += "<br>" + (row.w ? what[row.w[i]][0] : "kernels, back to back") +
        "<br>start " + (row.s[i] / 1e9).toFixed(6) + " s, duration " + seconds(dur);
      if (row.w && dur > 0) text += ", bus bandwidth " +
        (what[row.w[i]][1] / (dur / 1e9) / 1e9).toFixed(1) + " GB/s";
    }
    return text;
  }

  // x, z (and text where asked) of every binned trace for the range [a, b] seconds
  function binned(spec, a, b) {
    const n = spec.bins, lo = a * 1e9, width = (b - a) * 1e9 / n;
    const x = new Array(n);
    for (let k = 0; k < n; k++) x[k] = (lo + (k + 0.5) * width) / 1e9;
    const update = { x: [], z: [], text: [] }, indices = [];
    for (const trace of spec.traces) {
      const texts = spec.describe.includes(trace.index);
      const z = [], text = [];
      for (const row of trace.rows) {
        const zr = new Array(n), tr = texts ? new Array(n) : null;
        let before = busyBefore(row, lo);
        for (let k = 0; k < n; k++) {
          const right = lo + (k + 1) * width, next = busyBefore(row, right);
          zr[k] = (next - before) / width;
          if (tr) tr[k] = describe(row, spec.what, right - width, right, zr[k]);
          before = next;
        }
        z.push(zr);
        text.push(tr);
      }
      update.x.push(x);
      update.z.push(z);
      update.text.push(texts ? text : null);
      indices.push(trace.index);
    }
    return { update, indices };
  }

  // --- pipeline: the passes per row (from the data traces), hover and labels -------------
  function passRows(fig) {
    const rows = fig.layout.yaxis.tickvals.map(() => []);
    for (const trace of fig.data) {
      if (!(trace.meta && trace.meta.passes)) continue;
      const data = decode(trace.customdata), y = decode(trace.y);
      for (let i = 0; i < y.length; i++) {
        rows[y[i]].push({
          s: data[3 * i], e: data[3 * i + 1], d: data[3 * i + 2], mb: trace.text[i],
          kind: trace.meta.passes,
          title: trace.name + (trace.text[i] === "" ? "" : " " + trace.text[i]),
          details: trace.hovertext[i] });
      }
    }
    rows.forEach((list) => list.sort((p, q) => p.s - q.s));
    return rows;
  }

  function passAt(list, t) { // the pass running at t, if any
    let lo = 0, hi = list.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (list[mid].s <= t) lo = mid + 1; else hi = mid;
    }
    return lo > 0 && t < list[lo - 1].e ? list[lo - 1] : null;
  }

  function inside(row, ns) { // whether an interval of a binned row holds the time ns
    const i = upperBound(row.e, ns);
    return i < row.s.length && row.s[i] <= ns;
  }

  // x, z, text of the invisible hover heatmap: the pass under each bin's centre, or what
  // the rank does there instead (layers 0 and 1 of the spec: idle, communication)
  function passHover(rows, spec, a, b) {
    const n = spec.bins, width = (b - a) / n, x = new Array(n), z = [], text = [];
    for (let k = 0; k < n; k++) x[k] = a + (k + 0.5) * width;
    rows.forEach((list, r) => {
      const zr = new Array(n).fill(0), tr = new Array(n);
      for (let k = 0; k < n; k++) {
        const p = passAt(list, x[k]), at = x[k].toFixed(6) + " s: ";
        if (p) {
          tr[k] = "<b>" + p.title + "</b><br>start " + p.s.toFixed(6) + " s, end " +
            p.e.toFixed(6) + " s<br>duration " + seconds(p.d * 1e9) + "<br>" + p.details;
        } else if (inside(spec.traces[0].rows[r], x[k] * 1e9)) {
          tr[k] = at + "idle (bubble)";
        } else if (inside(spec.traces[1].rows[r], x[k] * 1e9)) {
          tr[k] = at + "communication outside the passes";
        } else {
          tr[k] = at + "between passes";
        }
      }
      z.push(zr);
      text.push(tr);
    });
    return { x, z, text };
  }

  // Micro-batch numbers for the visible range: the rule of sim/report/labels.py (label_plan)
  // — inside the passes wide enough to hold them (white on blue, dark on orange), else every
  // n-th micro-batch (dark, over its neighbours), n in 1, 2, 5, 10, ... so that n micro-batches span two labels.
  const PAD = 4, DIGIT = 6, GAP = 2;
  function labelPlan(rows, a, b, px, gap) {
    let widest = 0;
    for (const list of rows) for (const p of list) {
      if (p.mb !== "") widest = Math.max(widest, PAD + DIGIT * p.mb.length);
    }
    let n = 1;
    while (n * gap * px < 2 * (widest + GAP) && n < 1e9) n = String(n)[0] === "2" ? n * 5 / 2 : n * 2;
    const x = [], y = [], text = [], light = [];
    rows.forEach((list, row) => {
      const cands = [];
      for (const p of list) {
        if (p.mb === "" || p.e <= a || p.s >= b) continue; // nothing of it visible
        const lo = Math.max(p.s, a), hi = Math.min(p.e, b), width = PAD + DIGIT * p.mb.length;
        const fits = (hi - lo) * px >= width;
        if (fits || Number(p.mb) % n === 0) {
          cands.push([(lo + hi) / 2, width / 2, p.mb, fits, fits && p.kind === "F"]);
        }
      }
      const nextInside = new Array(cands.length + 1).fill(Infinity);
      for (let i = cands.length - 1; i >= 0; i--) {
        const [cx, half, , fits] = cands[i];
        nextInside[i] = fits ? (cx - a) * px - half : nextInside[i + 1];
      }
      let right = -Infinity;
      cands.forEach(([cx, half, mb, fits, white], i) => {
        const at = (cx - a) * px;
        if (!fits && (at - half < right + GAP || at + half + GAP > nextInside[i + 1])) return;
        x.push(cx); y.push(row); text.push(mb); light.push(white);
        right = at + half;
      });
    });
    return { x, y, text, light };
  }

  function labels(div, rows) {
    const xa = div._fullLayout.xaxis, [a, b] = xa.range, px = xa._length / (b - a);
    const index = div.data.findIndex((t) => t.meta && t.meta.labels), meta = div.data[index].meta;
    const plan = labelPlan(rows, a, b, px, meta.gap_s);
    const colour = plan.light.map((white) => meta.colours[white ? 1 : 0]);
    return Plotly.restyle(div, { x: [plan.x], y: [plan.y], text: [plan.text],
      "textfont.color": [colour] }, [index]);
  }

  // The update of a binned figure for [a, b], with the pipeline's hover layer.
  function rebin(fig, spec, a, b) {
    const { update, indices } = binned(spec, a, b);
    if (spec.div === payload.pipeline) {
      const hover = passHover(passes, spec, a, b);
      update.x.push(hover.x);
      update.z.push(hover.z);
      update.text.push(hover.text);
      indices.push(fig.data.findIndex((t) => t.meta && t.meta.hover));
    }
    return { update, indices };
  }

  // --- draw ---------------------------------------------------------------------------------
  const unpacking = inflate("parasim-data");
  const library = await inflate("parasim-plotly");
  performance.mark("parasim-unpacked");
  // As a script of its own (a blob URL) the browser parses and compiles it off the main
  // thread, while this one decodes and bins the figures' data.
  const url = URL.createObjectURL(new Blob([library], { type: "text/javascript" }));
  const plotlyLoaded = new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.onload = resolve;
    script.onerror = () => reject(new Error("plotly.js did not load"));
    script.src = url;
    document.head.appendChild(script);
  });
  const payload = JSON.parse(await unpacking);
  const passes = passRows(payload.figures[payload.pipeline]);
  const specs = {};
  for (const spec of payload.binned) {
    prepare(spec);
    const fig = payload.figures[spec.div], { update, indices } = rebin(fig, spec, 0, spec.step_s);
    indices.forEach((index, j) => {
      Object.assign(fig.data[index], { x: update.x[j], z: update.z[j] });
      if (update.text[j]) fig.data[index].text = update.text[j];
    });
    specs[spec.div] = spec;
  }
  performance.mark("parasim-binned");
  await plotlyLoaded;
  URL.revokeObjectURL(url);
  performance.mark("parasim-plotly-loaded");
  const config = { displaylogo: false, responsive: true };
  const pipeline = document.getElementById(payload.pipeline);
  {
    // The passes' points are data, drawn as nothing: `passes` holds them; plotting 6,000 of
    // them cost 0.1 s. The labels go in with the first draw, at the width the plot will have
    // (its margins are fixed: sim/report/pipeline.py), not as a second draw after it.
    const fig = payload.figures[payload.pipeline], m = fig.layout.margin;
    fig.data = fig.data.filter((trace) => !(trace.meta && trace.meta.passes));
    const trace = fig.data.find((t) => t.meta && t.meta.labels), [a, b] = fig.layout.xaxis.range;
    const plan = labelPlan(passes, a, b, (pipeline.clientWidth - m.l - m.r) / (b - a),
      trace.meta.gap_s);
    Object.assign(trace, { x: plan.x, y: plan.y, text: plan.text });
    trace.textfont.color = plan.light.map((white) => trace.meta.colours[white ? 1 : 0]);
    trace.meta.width = pipeline.clientWidth - m.l - m.r;
  }
  for (const [id, fig] of Object.entries(payload.figures)) {
    await Plotly.newPlot(id, fig.data, fig.layout, config);
    performance.mark("parasim-drawn-" + id);
  }
  const drawn = pipeline.data.find((t) => t.meta && t.meta.labels).meta.width;
  if (pipeline._fullLayout.xaxis._length !== drawn) await labels(pipeline, passes);
  performance.mark("parasim-labelled");

  // Zoom one time axis, zoom them all; binned figures re-bin the visible range.
  const step = payload.binned[0].step_s;
  const timed = payload.timed.map((id) => document.getElementById(id));
  const rangeOf = (ev) => {
    if (ev["xaxis.autorange"]) return [0, step];
    if ("xaxis.range[0]" in ev) return [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
    if (ev["xaxis.range"]) return ev["xaxis.range"];
    return null;
  };
  let syncing = false;
  async function zoom(source, range) {
    for (const div of timed) {
      const layout = { "xaxis.range": [range[0], range[1]] };
      const spec = specs[div.id];
      if (spec) {
        const { update, indices } = rebin(div, spec, range[0], range[1]);
        await Plotly.update(div, update, layout, indices);
      } else if (div !== source) {
        await Plotly.relayout(div, layout);
      }
      if (div === pipeline) await labels(pipeline, passes);
    }
  }
  for (const div of timed) {
    div.on("plotly_relayout", async (ev) => {
      const range = rangeOf(ev);
      if (syncing || !range) return;
      syncing = true;
      try { await zoom(div, range); } finally { syncing = false; }
    });
  }
  window.parasim = { specs, binned, zoom, labelPlan, passes };
  document.body.dataset.rendered = "yes";
})().catch((err) => {
  document.body.insertAdjacentHTML("afterbegin",
    "<p class='warn'>This report needs a browser with DecompressionStream (Chrome 80, " +
    "Firefox 113, Safari 16.4 or later): " + String(err) + "</p>");
  throw err;
});
