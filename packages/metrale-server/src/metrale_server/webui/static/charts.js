// Line charts as SVG of our own: a rolling window of samples, one polyline per series, the
// y axis from 0 to a rounded maximum, the latest values in the legend.

import { el } from "./common.js";

const SVG = "http://www.w3.org/2000/svg";
const HEIGHT = 160;
const PAD = { left: 44, right: 8, top: 8, bottom: 18 };

function svg(tag, attributes = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  return node;
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * magnitude) return step * magnitude;
  return 10 * magnitude;
}

export class LineChart {
  // series: [{ name, format }]; the y axis runs to fixedMax, else to the window's largest
  // value rounded up (at least minMax).
  constructor(container, { title, series, windowSize = 90, fixedMax = null, minMax = 0, format = (v) => v.toFixed(1) }) {
    this.minMax = minMax;
    this.series = series;
    this.windowSize = windowSize;
    this.fixedMax = fixedMax;
    this.format = format;
    this.samples = []; // [values]
    this.values = el("div", { class: "chart-legend" });
    this.plot = svg("svg", { height: HEIGHT, role: "img", "aria-label": title });
    this.grid = svg("g", { class: "grid" });
    this.lines = series.map((_, index) => svg("polyline", { class: `line series-${index}`, fill: "none" }));
    this.plot.append(this.grid, ...this.lines);
    this.legendItems = series.map((s, index) =>
      el("span", { class: `legend-item series-${index}` }, el("span", { class: "swatch" }), `${s.name} `, el("b", { text: "–" })),
    );
    this.values.append(...this.legendItems);
    container.replaceChildren(el("h2", { text: title }), this.values, this.plot);
    this.container = container;
    this.render();
  }

  push(values) {
    this.samples.push(values);
    if (this.samples.length > this.windowSize) this.samples.shift();
    this.render();
  }

  render() {
    const finite = this.samples.flat().filter((v) => Number.isFinite(v));
    const max = this.fixedMax ?? niceMax(Math.max(this.minMax, ...finite.map((v) => v * 1.1)));
    // Drawn in CSS pixels of the chart's width now, so text keeps its shape.
    const width = Math.max(200, Math.round(this.container?.clientWidth || 600) - 28);
    this.plot.setAttribute("viewBox", `0 0 ${width} ${HEIGHT}`);
    const x = (i) => PAD.left + ((width - PAD.left - PAD.right) * (i + this.windowSize - this.samples.length)) / (this.windowSize - 1);
    const y = (v) => HEIGHT - PAD.bottom - ((HEIGHT - PAD.top - PAD.bottom) * Math.min(v, max)) / max;
    this.grid.replaceChildren(
      ...[0, 0.5, 1].flatMap((fraction) => {
        const value = max * fraction;
        return [
          svg("line", { x1: PAD.left, x2: width - PAD.right, y1: y(value), y2: y(value) }),
          Object.assign(svg("text", { x: PAD.left - 4, y: y(value) + 4, "text-anchor": "end" }), { textContent: this.format(value) }),
        ];
      }),
      Object.assign(svg("text", { x: PAD.left, y: HEIGHT - 4 }), { textContent: `${this.windowSize} s ago` }),
      Object.assign(svg("text", { x: width - PAD.right, y: HEIGHT - 4, "text-anchor": "end" }), { textContent: "now" }),
    );
    this.series.forEach((series, index) => {
      const points = [];
      this.samples.forEach((values, i) => {
        if (Number.isFinite(values[index])) points.push(`${x(i).toFixed(1)},${y(values[index]).toFixed(1)}`);
      });
      this.lines[index].setAttribute("points", points.join(" "));
      const latest = this.samples.at(-1)?.[index];
      this.legendItems[index].querySelector("b").textContent = Number.isFinite(latest) ? (series.format || this.format)(latest) : "–";
    });
    const latest = this.samples.at(-1) || [];
    this.container.dataset.latest = JSON.stringify(latest.map((v) => (Number.isFinite(v) ? v : null)));
    this.container.dataset.max = JSON.stringify(
      this.series.map((_, index) => Math.max(0, ...this.samples.map((s) => s[index]).filter(Number.isFinite))),
    );
  }
}
