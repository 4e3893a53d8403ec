// The demo page: loads the dpw-web wasm module and the bundled water data, creates a Trainer
// (WebGPU when the browser has an adapter, else the CPU in wasm), and trains while drawing the
// learning curve and the forces on one validation frame.
//
// URL parameters: ?backend=auto|webgpu|cpu  ?autostart=1  ?mock=1 (development: a fake trainer,
// dev/mock_dpw_web.js, instead of pkg/dpw_web.js).
//
// For tests and the curious, window.dpw holds the state:
//   {state: "loading"|"ready"|"training"|"paused"|"done"|"error", info, records: [...],
//    errors: [...], stepsPerSec, timing: {steps, wallSecs, trainSecs}, busy}
// Each record is a line of lcurve.out as returned by Trainer.train(), plus `t`: the seconds of
// training (pauses excluded) when it arrived.

import { LearningCurve } from './plot.js';
import { FrameViewer } from './viewer.js';

const params = new URLSearchParams(location.search);
const BACKENDS = ['auto', 'webgpu', 'cpu'];
const backendParam = params.get('backend') || 'auto';
const autostart = params.get('autostart') === '1';
const mock = params.get('mock') === '1';
// Seconds between two refreshes of the 3D frame while training (each costs a forward pass).
const FRAME_EVERY_S = 1.0;

const $ = (id) => document.getElementById(id);

const dpw = {
  state: 'loading',
  info: null,
  records: [],
  errors: [],
  stepsPerSec: null,
  timing: { steps: 0, wallSecs: 0, trainSecs: 0 },
  busy: false, // a call into the trainer is in flight (a pause takes effect when it returns)
};
window.dpw = dpw;

// ---------------------------------------------------------------- errors, shown on the page

function showError(message) {
  dpw.errors.push(message);
  const el = $('error');
  const p = document.createElement('p');
  p.textContent = message;
  el.appendChild(p);
  el.hidden = false;
  console.error(message);
}

function fail(message) {
  showError(message);
  setState('error');
}

function errText(e) {
  // A panic inside the wasm module reaches JavaScript as a bare RuntimeError ("unreachable");
  // the module kept its message.
  const panic = e instanceof WebAssembly.RuntimeError && mod?.lastPanic?.();
  if (panic) return panic;
  return e && typeof e === 'object' && 'message' in e ? e.message : String(e);
}

window.addEventListener('error', (e) => {
  showError(`Something went wrong in the page: ${e.message || errText(e.error)}`);
});
window.addEventListener('unhandledrejection', (e) => {
  showError(`Something went wrong in the page: ${errText(e.reason)}`);
});

// ---------------------------------------------------------------- page state

let mod = null; // the wasm module (or the mock)
let inputText = null;
let files = null; // Map path -> Uint8Array
let trainer = null;
let loop = null; // the promise of the running training loop, if any
let plot = null;
let viewer = null;
let recent = []; // [t, step] of the last records, for the live steps/s

function setState(s) {
  dpw.state = s;
  showState();
  $('start').disabled = !(s === 'ready' || s === 'paused');
  $('start').textContent = s === 'paused' ? 'Resume' : 'Start';
  $('pause').disabled = s !== 'training';
  $('reset').disabled = !(s === 'ready' || s === 'paused' || s === 'done' || (s === 'error' && trainer));
}

function showState() {
  const s = dpw.state;
  const el = $('state');
  el.textContent = {
    loading: 'loading…',
    ready: 'ready',
    training: 'training',
    // The steps up to the next display step finish first.
    paused: dpw.busy ? 'pausing…' : 'paused',
    done: 'done',
    error: 'stopped by an error',
  }[s];
  el.className = `state ${s}`;
}

/** Runs one call into the trainer, with dpw.busy set meanwhile. */
async function call(f) {
  dpw.busy = true;
  showState();
  try {
    return await f();
  } finally {
    dpw.busy = false;
    showState();
  }
}

const sci = (x) => (x == null || !isFinite(x) ? '–' : x.toExponential(2));

function showInfo(info) {
  const name = info.backend === 'webgpu' ? 'WebGPU' : 'CPU (WebAssembly)';
  $('backend').textContent = info.fallback ? `${name}, fallback` : name;
  $('adapter').textContent = info.adapter || (info.backend === 'cpu' ? 'none (CPU)' : '–');
  $('model').textContent = `se_e2_a, ${info.natoms} atoms, ${info.nparams.toLocaleString('en')} parameters, ${info.precision}`;
  $('note').textContent = info.note || '';
  $('numb-steps').textContent = info.numb_steps;
  $('disp-freq').textContent = info.disp_freq;
  if (info.fallback) {
    const n = $('notice');
    n.textContent =
      'WebGPU is not available in this browser, so the model trains on the CPU in WebAssembly instead ' +
      '(slower). The reason is below the backend. Chrome and Edge have WebGPU; elsewhere it may have to be enabled.';
    n.hidden = false;
  }
}

function showRecord(rec) {
  $('step').textContent = rec.step;
  $('lr').textContent = rec.lr.toExponential(1);
  $('trn-e').textContent = sci(rec.trn?.rmse_e);
  $('trn-f').textContent = sci(rec.trn?.rmse_f);
  $('val-e').textContent = sci(rec.val?.rmse_e);
  $('val-f').textContent = sci(rec.val?.rmse_f);
}

function showRate() {
  // Live rate over the last ~5 s of training; the overall average is in window.dpw.
  const last = recent[recent.length - 1];
  while (recent.length > 2 && last[0] - recent[0][0] > 5) recent.shift();
  const first = recent[0];
  let rate = dpw.stepsPerSec;
  if (last && first && last[0] > first[0]) rate = (last[1] - first[1]) / (last[0] - first[0]);
  $('rate').textContent = rate == null ? '–' : rate >= 100 ? rate.toFixed(0) : rate.toPrecision(3);
}

// ---------------------------------------------------------------- loading

async function fetchBytes(path) {
  let r;
  try {
    r = await fetch(path);
  } catch (e) {
    throw new Error(`could not fetch ${path} (${errText(e)})`);
  }
  if (!r.ok) throw new Error(`${path}: ${r.status} ${r.statusText}`.trim());
  return new Uint8Array(await r.arrayBuffer());
}

async function loadModule() {
  const url = mock ? './dev/mock_dpw_web.js' : './pkg/dpw_web.js';
  try {
    mod = await import(url);
  } catch (e) {
    throw new Error(
      `The page's WebAssembly part (${url.slice(2)}) could not be loaded: ${errText(e)}. ` +
        'If you serve this page yourself, build it first with web/build.sh.',
    );
  }
  try {
    await mod.default();
  } catch (e) {
    throw new Error(
      `The page's WebAssembly module could not be started: ${errText(e)}. ` +
        'The browser may not support WebAssembly, or the server may send .wasm files with the wrong type (it must be application/wasm).',
    );
  }
}

async function loadData() {
  try {
    const [inp, list] = await Promise.all([fetchBytes('input.json'), fetchBytes('data/files.json')]);
    inputText = new TextDecoder().decode(inp);
    const paths = JSON.parse(new TextDecoder().decode(list)).files;
    const bytes = await Promise.all(paths.map(fetchBytes));
    files = new Map(paths.map((p, i) => [p, bytes[i]]));
  } catch (e) {
    throw new Error(
      `The training data could not be loaded: ${errText(e)}. ` +
        'If you serve this page yourself, web/build.sh copies the data into web/data.',
    );
  }
}

async function createTrainer() {
  const backend = BACKENDS.includes(backendParam) ? backendParam : 'auto';
  try {
    trainer = await call(() => mod.Trainer.create(inputText, files, backend));
  } catch (e) {
    trainer = null;
    throw new Error(`The model could not be set up: ${errText(e)}`);
  }
  dpw.info = JSON.parse(trainer.info());
  if (dpw.info.backend === 'webgpu' && !dpw.info.adapter) dpw.info.adapter = await adapterName();
  showInfo(dpw.info);
  await refreshFrame();
}

/** The WebGPU adapter as the browser describes it (wgpu gives no name on the web). */
async function adapterName() {
  try {
    const a = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
    const i = a?.info;
    if (!i) return '';
    const name = [i.vendor, i.architecture, i.device, i.description].filter(Boolean).join(' ');
    return (name || 'unnamed adapter') + (a.isFallbackAdapter || i.isFallbackAdapter ? ' (software)' : '');
  } catch {
    return '';
  }
}

async function refreshFrame() {
  try {
    viewer.setFrame(JSON.parse(await call(() => trainer.frame())));
  } catch (e) {
    showError(`The water frame could not be shown: ${errText(e)}`);
  }
}

// ---------------------------------------------------------------- training

async function trainLoop() {
  let lastFrame = performance.now();
  while (dpw.state === 'training') {
    const t0 = performance.now();
    const s0 = trainer.step_count();
    let rec;
    try {
      rec = JSON.parse(await call(() => trainer.train()));
    } catch (e) {
      fail(`Training stopped: ${errText(e)}`);
      return;
    }
    const t1 = performance.now();
    const steps = trainer.step_count() - s0;
    dpw.timing.steps += steps;
    dpw.timing.trainSecs += (t1 - t0) / 1000;
    rec.t = dpw.timing.wallSecs + (t1 - t0) / 1000;
    dpw.records.push(rec);
    plot.push(rec);
    showRecord(rec);
    if (rec.done) setState('done');
    if (rec.done || t1 - lastFrame > FRAME_EVERY_S * 1000) {
      await refreshFrame();
      lastFrame = performance.now();
    }
    const t2 = performance.now();
    dpw.timing.wallSecs += (t2 - t0) / 1000;
    dpw.stepsPerSec = dpw.timing.steps / dpw.timing.wallSecs;
    recent.push([dpw.timing.wallSecs, trainer.step_count()]);
    showRate();
  }
  // Paused: show what the model predicts now.
  if (dpw.state === 'paused') await refreshFrame();
}

function start() {
  if (!trainer || !(dpw.state === 'ready' || dpw.state === 'paused')) return;
  setState('training');
  // A pause and a resume while a step is still running: the loop just goes on.
  if (!loop) {
    loop = trainLoop().finally(() => {
      loop = null;
    });
  }
}

function pause() {
  if (dpw.state === 'training') setState('paused');
}

async function reset() {
  if (!trainer) return;
  setState('loading');
  if (loop) await loop;
  trainer.free();
  trainer = null;
  dpw.info = null;
  dpw.records = [];
  dpw.stepsPerSec = null;
  dpw.timing = { steps: 0, wallSecs: 0, trainSecs: 0 };
  recent = [];
  plot.clear();
  viewer.reset();
  for (const id of ['step', 'lr', 'trn-e', 'trn-f', 'val-e', 'val-f', 'rate']) $(id).textContent = id === 'step' ? '0' : '–';
  try {
    await createTrainer();
    setState('ready');
  } catch (e) {
    fail(errText(e));
  }
}

// ---------------------------------------------------------------- wiring

function wire() {
  $('start').addEventListener('click', start);
  $('pause').addEventListener('click', pause);
  $('reset').addEventListener('click', () => reset());
  const sel = $('backend-choice');
  sel.value = BACKENDS.includes(backendParam) ? backendParam : 'auto';
  sel.addEventListener('change', () => {
    const p = new URLSearchParams(location.search);
    p.set('backend', sel.value);
    location.search = p.toString();
  });
  const vis = () => viewer.setVisible($('show-ref').checked, $('show-pred').checked);
  $('show-ref').addEventListener('change', vis);
  $('show-pred').addEventListener('change', vis);
}

async function main() {
  setState('loading');
  if (!BACKENDS.includes(backendParam)) {
    showError(`Unknown backend "${backendParam}" in the address; use auto, webgpu or cpu. Using auto.`);
  }
  plot = new LearningCurve($('plot'));
  viewer = new FrameViewer($('viewer'), {
    onInfo: ({ rmseF, arrowScale }) => {
      $('frame-info').textContent =
        `Force RMSE on this frame: ${sci(rmseF)} eV/Å. Arrows: 1 eV/Å is drawn ${arrowScale.toFixed(2)} Å long. ` +
        'Drag to rotate, scroll to zoom.';
    },
  });
  wire();
  try {
    await loadModule();
    await loadData();
    await createTrainer();
  } catch (e) {
    if (!dpw.info) $('backend').textContent = 'not started';
    fail(errText(e));
    return;
  }
  setState('ready');
  if (autostart) start();
}

main();
