// A stand-in for pkg/dpw_web.js (the dpw-web crate) with the same API, for developing the page
// without the wasm build: fake decaying losses, fake predicted forces. Used only with ?mock=1.
//
//   import init, { Trainer } from './dev/mock_dpw_web.js';
//   await init();
//   const t = await Trainer.create(inputJsonText, files, backend);

export default async function init() {}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Minimal .npy reader: little-endian f4/f8 arrays (what deepmd/npy sets hold). */
function readNpy(bytes, name) {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes[0] !== 0x93 || String.fromCharCode(...bytes.subarray(1, 6)) !== 'NUMPY') {
    throw new Error(`${name} is not a .npy file`);
  }
  const major = bytes[6];
  const hlen = major === 1 ? dv.getUint16(8, true) : dv.getUint32(8, true);
  const hstart = major === 1 ? 10 : 12;
  const header = new TextDecoder().decode(bytes.subarray(hstart, hstart + hlen));
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').filter((s) => s.trim()).map(Number);
  const off = hstart + hlen;
  const n = shape.reduce((a, b) => a * b, 1);
  const out = new Float64Array(n);
  if (descr === '<f4') for (let i = 0; i < n; i++) out[i] = dv.getFloat32(off + 4 * i, true);
  else if (descr === '<f8') for (let i = 0; i < n; i++) out[i] = dv.getFloat64(off + 8 * i, true);
  else throw new Error(`${name}: unsupported dtype ${descr}`);
  return { shape, data: out };
}

function mulberry32(a) {
  return () => {
    a |= 0; a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export class Trainer {
  constructor(input, files, info) {
    this.input = input;
    this.files = files;
    this._info = info;
    this.steps = 0;
    this.rand = mulberry32(10);
    this.freed = false;
  }

  static async create(inputJsonText, files, backend) {
    let input;
    try {
      input = JSON.parse(inputJsonText);
    } catch (e) {
      throw new Error(`The input file is not valid JSON: ${e.message}`);
    }
    const need = (p) => {
      if (!files.has(p)) throw new Error(`The data file ${p} is missing.`);
      return files.get(p);
    };
    const valid = input.training.validation_data.systems[0];
    const typeMap = new TextDecoder().decode(need(`${valid}/type_map.raw`)).split(/\s+/).filter(Boolean);
    const types = new TextDecoder().decode(need(`${valid}/type.raw`)).split(/\s+/).filter(Boolean).map(Number);
    const coord = readNpy(need(`${valid}/set.000/coord.npy`), 'coord.npy');
    const force = readNpy(need(`${valid}/set.000/force.npy`), 'force.npy');
    const box = readNpy(need(`${valid}/set.000/box.npy`), 'box.npy');
    const natoms = types.length;

    let info;
    const wantGpu = backend === 'auto' || backend === 'webgpu';
    let adapter = null;
    let why = '';
    if (wantGpu) {
      if (!navigator.gpu) why = 'this browser has no WebGPU (navigator.gpu is missing)';
      else {
        adapter = await navigator.gpu.requestAdapter();
        if (!adapter) why = 'WebGPU gave no adapter';
      }
    }
    if (backend === 'webgpu' && !adapter) throw new Error(`WebGPU was asked for, but ${why}.`);
    if (adapter) {
      const ai = adapter.info || {};
      info = { backend: 'webgpu', adapter: `mock: ${ai.vendor || '?'} ${ai.architecture || ''}`.trim(), fallback: false, note: 'mock trainer: WebGPU adapter found' };
    } else if (backend === 'cpu') {
      info = { backend: 'cpu', adapter: '', fallback: false, note: 'mock trainer: CPU asked for (?backend=cpu)' };
    } else {
      info = { backend: 'cpu', adapter: '', fallback: true, note: `mock trainer: ${why}; training on the CPU in WebAssembly instead` };
    }
    Object.assign(info, {
      precision: 'float32',
      natoms,
      nparams: 4321,
      numb_steps: input.training.numb_steps,
      disp_freq: input.training.disp_freq,
    });
    const t = new Trainer(input, files, info);
    t.frame0 = {
      type_map: typeMap,
      types,
      box: Array.from(box.data.subarray(0, 9)),
      coord: Array.from(coord.data.subarray(0, 3 * natoms)),
      force_ref: Array.from(force.data.subarray(0, 3 * natoms)),
    };
    return t;
  }

  info() {
    return JSON.stringify(this._info);
  }

  step_count() {
    return this.steps;
  }

  _metrics(step, noise) {
    const r = () => 1 + noise * (this.rand() - 0.5);
    const rmse_e = (0.02 * Math.exp(-step / 400) + 0.002) * r();
    const rmse_f = (0.9 * Math.exp(-step / 300) + 0.08) * r();
    return { rmse: Math.sqrt(rmse_e ** 2 * 192 + rmse_f ** 2), rmse_e, rmse_f };
  }

  async train() {
    if (this.freed) throw new Error('The trainer was freed.');
    const { numb_steps, disp_freq } = this._info;
    if (this.steps >= numb_steps) {
      throw new Error('Training is finished.');
    }
    const target = this.steps === 0 ? 1 : Math.min(numb_steps, (Math.floor(this.steps / disp_freq) + 1) * disp_freq);
    while (this.steps < target) {
      await sleep(this._info.backend === 'webgpu' ? 3 : 6);
      this.steps++;
    }
    const step = this.steps;
    const lr = 0.005 * Math.pow(0.9, Math.floor(step / 100));
    return JSON.stringify({
      step,
      lr,
      trn: this._metrics(step, 0.6),
      val: this._metrics(step, 0.3),
      done: step >= numb_steps,
    });
  }

  async frame() {
    const s = this.steps;
    const a = 1 - Math.exp(-s / 300);
    const f = this.frame0.force_ref;
    const pred = f.map((x, i) => a * x + (1 - a) * 0.8 * Math.sin(i * 1.7 + 0.3));
    return JSON.stringify({ ...this.frame0, force_pred: pred });
  }

  free() {
    this.freed = true;
  }
}
