// A small 3D viewer for one water frame on a 2D canvas: atoms (wrapped into the periodic box),
// O–H bonds, the box, and two arrows per atom: the reference (DFT) force and the model's
// predicted force. Drag to rotate, wheel to zoom. No WebGL: 192 atoms draw in well under a
// millisecond, and the GPU stays free for training.

const RADIUS = [0.36, 0.22]; // Å, by type (O, H)
const COLOR = [
  ['#ff8a8d', '#c4282e'],
  ['#ffffff', '#9aa4b2'],
];

function inv3(m) {
  const [a, b, c, d, e, f, g, h, i] = m;
  const A = e * i - f * h, B = -(d * i - f * g), C = d * h - e * g;
  const det = a * A + b * B + c * C;
  if (!det) return null;
  return [
    A / det, -(b * i - c * h) / det, (b * f - c * e) / det,
    B / det, (a * i - c * g) / det, -(a * f - c * d) / det,
    C / det, -(a * h - b * g) / det, (a * e - b * d) / det,
  ];
}

export class FrameViewer {
  constructor(canvas, { onInfo } = {}) {
    this.canvas = canvas;
    this.ctx = canvas.getContext('2d');
    this.onInfo = onInfo || (() => {});
    this.yaw = 0.55;
    this.pitch = 0.35;
    this.zoom = 1;
    this.showRef = true;
    this.showPred = true;
    this.frame = null;
    this.arrowScale = null; // Å of arrow per eV/Å, fixed from the first frame shown
    this.raf = 0;
    this.installInput();
    if (typeof ResizeObserver !== 'undefined') {
      new ResizeObserver(() => this.request()).observe(canvas);
    }
  }

  installInput() {
    const c = this.canvas;
    let drag = null;
    c.addEventListener('pointerdown', (e) => {
      drag = { x: e.clientX, y: e.clientY, yaw: this.yaw, pitch: this.pitch };
      c.setPointerCapture(e.pointerId);
      c.style.cursor = 'grabbing';
    });
    c.addEventListener('pointermove', (e) => {
      if (!drag) return;
      this.yaw = drag.yaw + (e.clientX - drag.x) * 0.01;
      this.pitch = Math.max(-1.5, Math.min(1.5, drag.pitch + (e.clientY - drag.y) * 0.01));
      this.request();
    });
    const end = () => {
      drag = null;
      c.style.cursor = '';
    };
    c.addEventListener('pointerup', end);
    c.addEventListener('pointercancel', end);
    c.addEventListener(
      'wheel',
      (e) => {
        e.preventDefault();
        this.zoom = Math.max(0.4, Math.min(4, this.zoom * Math.exp(-e.deltaY * 0.001)));
        this.request();
      },
      { passive: false },
    );
  }

  /** Forgets the arrow scale (a new trainer). */
  reset() {
    this.arrowScale = null;
    this.frame = null;
    this.request();
  }

  /** fr: {type_map, types, box[9], coord[3N], force_ref[3N], force_pred[3N]} */
  setFrame(fr) {
    const n = fr.types.length;
    const box = fr.box;
    const inv = inv3(box);
    const pos = new Float64Array(3 * n);
    for (let i = 0; i < n; i++) {
      const x = fr.coord[3 * i], y = fr.coord[3 * i + 1], z = fr.coord[3 * i + 2];
      let s = [0, 1, 2].map((k) => x * (inv ? inv[k] : 0) + y * (inv ? inv[3 + k] : 0) + z * (inv ? inv[6 + k] : 0));
      if (inv) s = s.map((v) => v - Math.floor(v));
      for (let k = 0; k < 3; k++) {
        pos[3 * i + k] = inv ? s[0] * box[k] + s[1] * box[3 + k] + s[2] * box[6 + k] : fr.coord[3 * i + k];
      }
    }
    const bonds = [];
    for (let i = 0; i < n; i++) {
      if (fr.types[i] !== 0) continue;
      for (let j = 0; j < n; j++) {
        if (fr.types[j] === 0) continue;
        const dx = pos[3 * i] - pos[3 * j], dy = pos[3 * i + 1] - pos[3 * j + 1], dz = pos[3 * i + 2] - pos[3 * j + 2];
        if (dx * dx + dy * dy + dz * dz < 1.25 * 1.25) bonds.push([i, j]);
      }
    }
    let ss = 0, se = 0;
    for (let i = 0; i < 3 * n; i++) {
      ss += fr.force_ref[i] * fr.force_ref[i];
      const d = (fr.force_pred?.[i] ?? 0) - fr.force_ref[i];
      se += d * d;
    }
    // An atom's typical (root-mean-square) reference force is drawn 1.2 Å long.
    const frms = Math.sqrt(ss / n);
    if (this.arrowScale == null) this.arrowScale = frms > 0 ? 1.2 / frms : 1;
    const center = [0, 1, 2].map((k) => 0.5 * (box[k] + box[3 + k] + box[6 + k]));
    this.frame = { fr, n, pos, bonds, center, rmseF: Math.sqrt(se / (3 * n)) };
    this.onInfo({ rmseF: this.frame.rmseF, arrowScale: this.arrowScale, natoms: n });
    this.request();
  }

  setVisible(ref, pred) {
    this.showRef = ref;
    this.showPred = pred;
    this.request();
  }

  request() {
    if (this.raf) return;
    this.raf = requestAnimationFrame(() => {
      this.raf = 0;
      this.render();
    });
  }

  render() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(c.clientWidth * dpr)), h = Math.max(1, Math.round(c.clientHeight * dpr));
    if (c.width !== w || c.height !== h) {
      c.width = w;
      c.height = h;
    }
    const ctx = this.ctx;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const F = this.frame;
    if (!F) {
      ctx.fillStyle = '#8b95a7';
      ctx.font = `${14 * dpr}px system-ui, sans-serif`;
      ctx.textAlign = 'center';
      ctx.fillText('waiting for the model…', w / 2, h / 2);
      return;
    }
    const box = F.fr.box;
    const diag = Math.hypot(box[0] + box[3] + box[6], box[1] + box[4] + box[7], box[2] + box[5] + box[8]);
    const cy = Math.cos(this.yaw), sy = Math.sin(this.yaw), cp = Math.cos(this.pitch), sp = Math.sin(this.pitch);
    const dist = 2.2 * diag;
    const focal = (0.5 * Math.min(w, h) * this.zoom * dist) / (0.62 * diag);
    const proj = (x, y, z) => {
      x -= F.center[0];
      y -= F.center[1];
      z -= F.center[2];
      const x1 = cy * x + sy * z, z1 = -sy * x + cy * z;
      const y2 = cp * y - sp * z1, z2 = sp * y + cp * z1;
      const s = focal / (dist - z2);
      return [w / 2 + x1 * s, h / 2 - y2 * s, z2, s];
    };

    // Box edges.
    ctx.lineWidth = 1 * dpr;
    ctx.strokeStyle = 'rgba(148,163,184,0.45)';
    const corner = (i, j, k) => proj(i * box[0] + j * box[3] + k * box[6], i * box[1] + j * box[4] + k * box[7], i * box[2] + j * box[5] + k * box[8]);
    ctx.beginPath();
    for (const [a, b] of [
      [[0, 0, 0], [1, 0, 0]], [[0, 0, 0], [0, 1, 0]], [[0, 0, 0], [0, 0, 1]],
      [[1, 1, 1], [0, 1, 1]], [[1, 1, 1], [1, 0, 1]], [[1, 1, 1], [1, 1, 0]],
      [[1, 0, 0], [1, 1, 0]], [[1, 0, 0], [1, 0, 1]], [[0, 1, 0], [1, 1, 0]],
      [[0, 1, 0], [0, 1, 1]], [[0, 0, 1], [1, 0, 1]], [[0, 0, 1], [0, 1, 1]],
    ]) {
      const p = corner(...a), q = corner(...b);
      ctx.moveTo(p[0], p[1]);
      ctx.lineTo(q[0], q[1]);
    }
    ctx.stroke();

    const P = [];
    for (let i = 0; i < F.n; i++) P.push(proj(F.pos[3 * i], F.pos[3 * i + 1], F.pos[3 * i + 2]));

    // Bonds.
    ctx.strokeStyle = 'rgba(203,213,225,0.55)';
    ctx.lineWidth = 2 * dpr;
    ctx.beginPath();
    for (const [i, j] of F.bonds) {
      ctx.moveTo(P[i][0], P[i][1]);
      ctx.lineTo(P[j][0], P[j][1]);
    }
    ctx.stroke();

    // Atoms, far to near.
    const order = [...P.keys()].sort((a, b) => P[a][2] - P[b][2]);
    for (const i of order) {
      const t = Math.min(1, F.fr.types[i]);
      const r = RADIUS[t] * P[i][3];
      const g = ctx.createRadialGradient(P[i][0] - 0.35 * r, P[i][1] - 0.35 * r, 0.1 * r, P[i][0], P[i][1], r);
      g.addColorStop(0, COLOR[t][0]);
      g.addColorStop(1, COLOR[t][1]);
      ctx.fillStyle = g;
      ctx.beginPath();
      ctx.arc(P[i][0], P[i][1], Math.max(1, r), 0, 2 * Math.PI);
      ctx.fill();
    }

    // Force arrows on top.
    const css = getComputedStyle(document.documentElement);
    const arrows = (forces, color) => {
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.6 * dpr;
      ctx.beginPath();
      const k = this.arrowScale;
      for (let i = 0; i < F.n; i++) {
        const x = F.pos[3 * i], y = F.pos[3 * i + 1], z = F.pos[3 * i + 2];
        const a = P[i];
        const b = proj(x + k * forces[3 * i], y + k * forces[3 * i + 1], z + k * forces[3 * i + 2]);
        const dx = b[0] - a[0], dy = b[1] - a[1];
        const len = Math.hypot(dx, dy);
        if (len < 0.5) continue;
        ctx.moveTo(a[0], a[1]);
        ctx.lineTo(b[0], b[1]);
        const hl = Math.min(7 * dpr, 0.4 * len), ux = dx / len, uy = dy / len;
        ctx.moveTo(b[0], b[1]);
        ctx.lineTo(b[0] - hl * (ux - 0.5 * uy), b[1] - hl * (uy + 0.5 * ux));
        ctx.moveTo(b[0], b[1]);
        ctx.lineTo(b[0] - hl * (ux + 0.5 * uy), b[1] - hl * (uy - 0.5 * ux));
      }
      ctx.stroke();
    };
    if (this.showRef) arrows(F.fr.force_ref, css.getPropertyValue('--ref').trim() || '#22c55e');
    if (this.showPred && F.fr.force_pred) arrows(F.fr.force_pred, css.getPropertyValue('--pred').trim() || '#f43f5e');
  }
}
