// The demo page in headless Chromium: trains on WebGPU (SwiftShader) and on the CPU fallback,
// checks that the validation force RMSE falls, that nothing went wrong, that pause / resume /
// reset work, and that the page's first steps give the losses of the native CPU backend.
//
//   node --test --test-concurrency=1 web/tests/
//
// Environment:
//   DPW_TEST_STEPS   steps to train on each backend (default: 40 on WebGPU, which is slow on
//                    SwiftShader, 200 on the CPU; at least 3·disp_freq for the parity test)
//   DPW_TEST_MOCK=1  test the page against dev/mock_dpw_web.js (no wasm build; no parity test)
//   DPW_BIN          the native dpw binary (default target/release/dpw, built if missing)
//   DPW_CHROMIUM     the browser (default /usr/bin/chromium)
// Writes web/test-results/{screenshot-webgpu.png, screenshot-cpu.png, timings.json}.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { serve, launch, watch, ROOT, WEB, RESULTS } from './helpers.mjs';

const STEPS = {
  webgpu: Number(process.env.DPW_TEST_STEPS || 40),
  cpu: Number(process.env.DPW_TEST_STEPS || 200),
};
const MOCK = process.env.DPW_TEST_MOCK === '1';
const TIMEOUT_MS = 30 * 60 * 1000;
const input = JSON.parse(fs.readFileSync(path.join(WEB, 'input.json'), 'utf8'));
const DISP = input.training.disp_freq;

let server;
const runs = {}; // backend -> {info, records, stepsPerSec, timing, ...}

before(async () => {
  for (const p of ['data/files.json', 'vendor/uPlot.esm.js', ...(MOCK ? [] : ['pkg/dpw_web.js', 'pkg/dpw_web_bg.wasm'])]) {
    assert.ok(fs.existsSync(path.join(WEB, p)), `web/${p} is missing: run web/build.sh first`);
  }
  fs.mkdirSync(RESULTS, { recursive: true });
  server = await serve();
});

after(async () => {
  await server?.close();
});

const query = (backend) => `?backend=${backend}&autostart=1${MOCK ? '&mock=1' : ''}`;
const state = (page) =>
  page.evaluate(() => ({
    state: window.dpw.state,
    info: window.dpw.info,
    records: window.dpw.records,
    errors: window.dpw.errors,
    stepsPerSec: window.dpw.stepsPerSec,
    timing: window.dpw.timing,
  }));

/** Event-loop latency now: how long a setTimeout(0) takes to run (the page must stay responsive). */
const latency = (page) =>
  page.evaluate(
    () =>
      new Promise((r) => {
        const t0 = performance.now();
        setTimeout(() => r(performance.now() - t0), 0);
      }),
  );

const pausedAndIdle = (page) =>
  page.waitForFunction(() => window.dpw.state === 'paused' && !window.dpw.busy, null, { timeout: TIMEOUT_MS, polling: 100 });

async function trainOnPage(backend, steps, label) {
  const b = await launch();
  const problems = watch(b.page);
  try {
    const { page } = b;
    await page.goto(server.url + query(backend));
    await page.waitForFunction(() => window.dpw && window.dpw.state !== 'loading', null, { timeout: 120_000, polling: 200 });
    let s = await state(page);
    assert.notEqual(s.state, 'error', `the page stopped with an error: ${s.errors.join(' | ')}`);

    // Responsiveness while training: sample the event-loop latency a few times.
    const lat = [];
    await page.waitForFunction(() => window.dpw.records.length >= 1 || window.dpw.state === 'error', null, { timeout: TIMEOUT_MS, polling: 200 });
    for (let i = 0; i < 5; i++) {
      lat.push(await latency(page));
      await page.waitForTimeout(200);
    }

    await page.waitForFunction(
      (n) => {
        const d = window.dpw;
        return d.state === 'error' || d.state === 'done' || (d.records.length > 0 && d.records[d.records.length - 1].step >= n);
      },
      steps,
      { timeout: TIMEOUT_MS, polling: 250 },
    );
    s = await state(page);
    assert.notEqual(s.state, 'error', `the page stopped with an error: ${s.errors.join(' | ')}`);

    // Pause: the state says so at once; the train() call in flight finishes, then nothing more.
    await page.click('#pause');
    await page.waitForFunction(() => window.dpw.state === 'paused', null, { timeout: 5_000 });
    await pausedAndIdle(page);
    const n1 = (await state(page)).records.length;
    await page.waitForTimeout(1500);
    const paused = await state(page);
    assert.equal(paused.records.length, n1, 'records kept coming while paused');
    assert.equal(await page.textContent('#state'), 'paused');

    await page.screenshot({ path: path.join(RESULTS, `screenshot-${label}.png`) });

    // Resume, pause, then reset and check that the first record comes back the same.
    await page.click('#start');
    await page.waitForFunction(() => window.dpw.state === 'training', null, { timeout: 5_000 });
    await page.waitForTimeout(300);
    await page.click('#pause');
    await pausedAndIdle(page);
    await page.click('#reset');
    await page.waitForFunction(() => window.dpw.state === 'ready' || window.dpw.state === 'error', null, { timeout: TIMEOUT_MS, polling: 100 });
    let r = await state(page);
    assert.equal(r.state, 'ready', `reset failed: ${r.errors.join(' | ')}`);
    assert.equal(r.records.length, 0);
    await page.click('#start');
    await page.waitForFunction(() => window.dpw.records.length >= 1 || window.dpw.state === 'error', null, { timeout: TIMEOUT_MS, polling: 100 });
    await page.click('#pause');
    r = await state(page);
    assert.equal(r.state, 'paused', `after reset: ${r.errors.join(' | ')}`);

    const errorVisible = await page.locator('#error').isVisible();
    const cdp = await b.context.newCDPSession(page);
    const browserVersion = (await cdp.send('Browser.getVersion')).product;
    return { ...paused, browserVersion, afterReset: r.records[0], latencyMs: lat, problems, errorVisible };
  } finally {
    await b.close();
  }
}

function checkRun(backend, run, steps) {
  assert.deepEqual(run.problems, [], `page problems: ${run.problems.join('\n')}`);
  assert.deepEqual(run.errors, [], `errors shown on the page: ${run.errors.join('\n')}`);
  assert.equal(run.errorVisible, false, 'the error box is visible');
  const recs = run.records;
  assert.ok(recs.length >= 3, `only ${recs.length} records`);
  assert.ok(recs[recs.length - 1].step >= steps, `stopped at step ${recs[recs.length - 1].step}`);
  assert.equal(recs[0].step, 1, 'the first record is step 1');
  for (const r of recs) {
    assert.ok(r.val, `no validation at step ${r.step}`);
    for (const x of [r.trn.rmse, r.trn.rmse_e, r.trn.rmse_f, r.val.rmse, r.val.rmse_e, r.val.rmse_f]) {
      assert.ok(Number.isFinite(x) && x >= 0, `a non-finite loss at step ${r.step}`);
    }
  }
  // The validation force RMSE fell: the last records against the first.
  const first = recs[0].val.rmse_f;
  const tail = recs.slice(-3).map((r) => r.val.rmse_f);
  const tailMean = tail.reduce((a, b) => a + b, 0) / tail.length;
  assert.ok(tailMean < 0.8 * first, `validation force RMSE did not fall: ${first} at step 1, ${tail.join(', ')} at the end`);
  // Reset gives the same first step (same seed).
  assert.ok(run.afterReset, 'no record after reset');
  assert.ok(
    Math.abs(run.afterReset.trn.rmse - recs[0].trn.rmse) <= 1e-6 * recs[0].trn.rmse,
    `after reset step 1 gave rmse ${run.afterReset.trn.rmse}, first run ${recs[0].trn.rmse}`,
  );
  // Responsive: an event fired within a second while training.
  assert.ok(Math.max(...run.latencyMs) < 1000, `event-loop latency while training: ${run.latencyMs.map((x) => x.toFixed(0)).join(', ')} ms`);
}

/** Steady steps/s: from the first record (which includes start-up, e.g. shader compilation) to the last. */
function steadyRate(records) {
  const a = records[0], b = records[records.length - 1];
  return (b.step - a.step) / (b.t - a.t);
}

function report(t, backend, run) {
  const line =
    `steps/s on the page, ${backend} (${backend === 'cpu' ? 'wasm' : `${run.info.adapter}, dense kernels ${run.info.dense_kernels}`}): ` +
    `${steadyRate(run.records).toFixed(2)} steady (steps ${run.records[0].step}–${run.records[run.records.length - 1].step}), ` +
    `${run.stepsPerSec.toFixed(2)} overall incl. start-up and frame refreshes; ` +
    `time in train(): ${run.timing.trainSecs.toFixed(1)} s of ${run.timing.wallSecs.toFixed(1)} s; ` +
    `event-loop latency ${Math.max(...run.latencyMs).toFixed(0)} ms max`;
  console.log(line + (run.browserVersion ? ` [${run.browserVersion}]` : ''));
  if (MOCK) return;
  const file = path.join(RESULTS, 'timings.json');
  const all = fs.existsSync(file) ? JSON.parse(fs.readFileSync(file, 'utf8')) : {};
  all[backend] = {
    adapter: run.info.adapter,
    dense_kernels: run.info.dense_kernels,
    steps: run.records[run.records.length - 1].step,
    steady_steps_per_s: steadyRate(run.records),
    overall_steps_per_s: run.stepsPerSec,
    train_secs: run.timing.trainSecs,
    wall_secs: run.timing.wallSecs,
    max_event_loop_latency_ms: Math.max(...run.latencyMs),
    chromium: run.browserVersion,
    date: new Date().toISOString(),
  };
  fs.writeFileSync(file, JSON.stringify(all, null, 2) + '\n');
}

test('WebGPU: trains on the WebGPU adapter (SwiftShader here) and the validation force RMSE falls', { timeout: TIMEOUT_MS }, async (t) => {
  const run = await trainOnPage('auto', STEPS.webgpu, 'webgpu');
  runs.webgpu = run;
  if (run.info.backend === 'webgpu' && run.records.length >= 2) report(t, 'webgpu', run);
  assert.equal(run.info.backend, 'webgpu', `the page used ${run.info.backend}: ${run.info.note}`);
  assert.equal(run.info.fallback, false);
  assert.ok(run.info.adapter, 'no adapter name');
  // Software adapters get the dense kernels without workgroup barriers (5× faster here).
  if (/swiftshader/i.test(run.info.adapter)) assert.equal(run.info.dense_kernels, 'flat');
  assert.equal(run.info.precision, 'float32');
  checkRun('webgpu', run, STEPS.webgpu);
});

test('CPU fallback (?backend=cpu): trains in wasm and the validation force RMSE falls', { timeout: TIMEOUT_MS }, async (t) => {
  const run = await trainOnPage('cpu', STEPS.cpu, 'cpu');
  runs.cpu = run;
  if (run.info.backend === 'cpu' && run.records.length >= 2) report(t, 'cpu', run);
  assert.equal(run.info.backend, 'cpu', `the page used ${run.info.backend}: ${run.info.note}`);
  checkRun('cpu', run, STEPS.cpu);
});

// ---------------------------------------------------------------- parity

/** Python's %.{d}e of x, parsed back: the value as lcurve.out shows it. */
const printed = (x, d) => Number(x.toExponential(d));

/** a and b agree to the printed digits: equal, or one unit of the last printed digit apart. */
function closePrinted(a, b, d) {
  if (a === b) return true;
  const m = Math.max(Math.abs(a), Math.abs(b));
  const ulp = 10 ** (Math.floor(Math.log10(m)) - d);
  return Math.abs(a - b) <= ulp * (1 + 1e-9);
}

function readLcurve(file) {
  const lines = fs.readFileSync(file, 'utf8').split('\n');
  const header = lines[0].replace(/^#/, '').trim().split(/\s+/);
  const rows = [];
  for (const l of lines) {
    if (!l.trim() || l.trim().startsWith('#')) continue;
    const v = l.trim().split(/\s+/);
    rows.push(Object.fromEntries(header.map((h, i) => [h, v[i]])));
  }
  return rows;
}

function nativeDpw() {
  const bin = process.env.DPW_BIN || path.join(process.env.CARGO_TARGET_DIR || path.join(ROOT, 'target'), 'release', 'dpw');
  if (!fs.existsSync(bin)) {
    console.log(`${bin} missing: cargo build --release`);
    const r = spawnSync('cargo', ['build', '--release'], { cwd: ROOT, stdio: 'inherit' });
    assert.equal(r.status, 0, 'cargo build --release failed');
  }
  return bin;
}

test('parity: the page\'s first steps give the native CPU backend\'s losses (f32, same data and seed)', { timeout: TIMEOUT_MS, skip: MOCK && 'mock trainer' }, () => {
  assert.ok(runs.cpu && runs.webgpu, 'the two page runs must have succeeded');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dpw-parity-'));
  try {
    const inp = structuredClone(input);
    const abs = (s) => path.join(WEB, s);
    inp.training.training_data.systems = inp.training.training_data.systems.map(abs);
    inp.training.validation_data.systems = inp.training.validation_data.systems.map(abs);
    inp.training.numb_steps = 3 * DISP;
    fs.writeFileSync(path.join(dir, 'input.json'), JSON.stringify(inp, null, 2));
    const bin = nativeDpw();
    const r = spawnSync(bin, ['train', 'input.json', '--backend', 'cpu'], {
      cwd: dir,
      encoding: 'utf8',
      env: { ...process.env, RAYON_NUM_THREADS: '1' },
    });
    assert.equal(r.status, 0, `dpw train failed:\n${r.stdout}\n${r.stderr}`);
    const rows = readLcurve(path.join(dir, 'lcurve.out'));
    assert.ok(rows.length >= 3, `lcurve.out has ${rows.length} lines`);

    const byStep = new Map(runs.cpu.records.map((x) => [x.step, x]));
    const cols = [
      ['rmse_val', (x) => x.val.rmse], ['rmse_trn', (x) => x.trn.rmse],
      ['rmse_e_val', (x) => x.val.rmse_e], ['rmse_e_trn', (x) => x.trn.rmse_e],
      ['rmse_f_val', (x) => x.val.rmse_f], ['rmse_f_trn', (x) => x.trn.rmse_f],
    ];
    const bad = [];
    for (const row of rows) {
      const rec = byStep.get(Number(row.step));
      assert.ok(rec, `the page has no record for step ${row.step}`);
      for (const [k, get] of cols) {
        const page = printed(get(rec), 2);
        if (!closePrinted(page, Number(row[k]), 2)) bad.push(`step ${row.step} ${k}: native ${row[k]}, page ${get(rec).toExponential(2)}`);
      }
      if (!closePrinted(printed(rec.lr, 1), Number(row.lr), 1)) bad.push(`step ${row.step} lr: native ${row.lr}, page ${rec.lr.toExponential(1)}`);
    }
    assert.deepEqual(bad, [], `page (CPU) against native lcurve.out:\n${bad.join('\n')}`);
    console.log(`parity: page CPU = native CPU on steps ${rows.map((x) => x.step).join(', ')} (to the printed digits)`);

    // WebGPU against CPU on the page, at full precision.
    const gpu = new Map(runs.webgpu.records.map((x) => [x.step, x]));
    const worst = [];
    const worst1 = [];
    for (const c of runs.cpu.records.filter((x) => x.step <= 3 * DISP)) {
      const g = gpu.get(c.step);
      assert.ok(g, `no WebGPU record at step ${c.step}`);
      const tol = c.step === 1 ? 1e-4 : 1e-3;
      for (const [k, get] of cols) {
        const rel = Math.abs(get(g) - get(c)) / Math.abs(get(c));
        (c.step === 1 ? worst1 : worst).push(rel);
        assert.ok(rel <= tol, `step ${c.step} ${k}: WebGPU ${get(g)}, CPU ${get(c)} (relative ${rel.toExponential(1)} > ${tol})`);
      }
    }
    console.log(
      `parity: WebGPU against CPU on the page, worst relative difference ${Math.max(...worst1).toExponential(2)} at step 1, ` +
        `${Math.max(...worst).toExponential(2)} on steps 2–${3 * DISP}`,
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
