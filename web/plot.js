// The learning curve: energy and force RMSE (training batch and validation) against the step,
// on two log axes (forces left, energies right), drawn with uPlot.
import uPlot from './vendor/uPlot.esm.js';

const fmt = (u, v) => (v == null ? '–' : v.toExponential(2));

export class LearningCurve {
  constructor(el) {
    this.el = el;
    this.data = [[], [], [], [], []];
    const css = getComputedStyle(document.documentElement);
    const force = css.getPropertyValue('--force').trim() || '#2563eb';
    const energy = css.getPropertyValue('--energy').trim() || '#d97706';
    const opts = {
      legend: { live: false },
      width: this.width(),
      height: 340,
      scales: {
        x: { time: false },
        f: { distr: 3 },
        e: { distr: 3 },
      },
      axes: [
        { label: 'step' },
        { scale: 'f', label: 'force RMSE (eV/Å)', stroke: force, size: 62 },
        { scale: 'e', side: 1, label: 'energy RMSE (eV/atom)', stroke: energy, size: 62, grid: { show: false } },
      ],
      series: [
        { label: 'step', value: (u, v) => (v == null ? '–' : String(v)) },
        { label: 'force, validation', scale: 'f', stroke: force, width: 2, value: fmt, spanGaps: true },
        { label: 'force, training', scale: 'f', stroke: force, width: 1, dash: [4, 4], value: fmt },
        { label: 'energy, validation', scale: 'e', stroke: energy, width: 2, value: fmt, spanGaps: true },
        { label: 'energy, training', scale: 'e', stroke: energy, width: 1, dash: [4, 4], value: fmt },
      ],
    };
    this.u = new uPlot(opts, this.data, el);
    if (typeof ResizeObserver !== 'undefined') {
      let w = this.width();
      new ResizeObserver(() => {
        const nw = this.width();
        if (nw !== w) {
          w = nw;
          this.u.setSize({ width: nw, height: 340 });
        }
      }).observe(el);
    }
  }

  width() {
    return Math.max(280, Math.floor(this.el.clientWidth || 600));
  }

  /** Adds one lcurve record ({step, trn: {rmse_e, rmse_f}, val: {...} | null}). */
  push(rec) {
    const pos = (x) => (x != null && isFinite(x) && x > 0 ? x : null);
    this.data[0].push(rec.step);
    this.data[1].push(pos(rec.val?.rmse_f));
    this.data[2].push(pos(rec.trn?.rmse_f));
    this.data[3].push(pos(rec.val?.rmse_e));
    this.data[4].push(pos(rec.trn?.rmse_e));
    this.u.setData(this.data);
  }

  clear() {
    this.data = [[], [], [], [], []];
    this.u.setData(this.data);
  }
}
