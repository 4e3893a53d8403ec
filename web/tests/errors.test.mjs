// What a visitor sees when something is missing: the page says it in plain words, on the page.
//
//   node --test --test-concurrency=1 web/tests/
// (DPW_TEST_MOCK=1: against dev/mock_dpw_web.js.)

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { serve, launch, watch } from './helpers.mjs';

const MOCK = process.env.DPW_TEST_MOCK === '1';
let server;

before(async () => {
  server = await serve();
});
after(async () => {
  await server?.close();
});

/** Opens the page (optionally with navigator.gpu hidden and some paths answering 404) and waits until it has loaded. */
async function open(query, { noWebGPU = false, missing = [] } = {}) {
  const b = await launch();
  const problems = watch(b.page);
  if (noWebGPU) {
    await b.page.addInitScript(() => {
      Object.defineProperty(Navigator.prototype, 'gpu', { get: () => undefined, configurable: true });
    });
  }
  for (const m of missing) {
    await b.page.route(`**/${m}`, (route) => route.fulfill({ status: 404, body: 'not found' }));
  }
  await b.page.goto(server.url + query + (MOCK ? '&mock=1' : ''));
  await b.page.waitForFunction(() => window.dpw && window.dpw.state !== 'loading', null, { timeout: 120_000, polling: 100 });
  const s = await b.page.evaluate(() => ({ state: window.dpw.state, info: window.dpw.info, errors: window.dpw.errors }));
  return { ...b, problems, s };
}

test('no WebGPU in the browser: ?backend=auto falls back to the CPU and says so on the page', async () => {
  const b = await open('?backend=auto', { noWebGPU: true });
  try {
    assert.equal(b.s.state, 'ready', `state ${b.s.state}: ${b.s.errors.join(' | ')}`);
    assert.equal(b.s.info.backend, 'cpu');
    assert.equal(b.s.info.fallback, true);
    assert.ok(await b.page.locator('#notice').isVisible(), 'no fallback notice on the page');
    assert.match(await b.page.textContent('#notice'), /WebGPU is not available/);
    assert.match(await b.page.textContent('#backend'), /CPU.*fallback/);
    assert.deepEqual(b.s.errors, []);
  } finally {
    await b.close();
  }
});

test('no WebGPU in the browser: ?backend=webgpu shows an error in plain words', async () => {
  const b = await open('?backend=webgpu', { noWebGPU: true });
  try {
    assert.equal(b.s.state, 'error');
    assert.ok(await b.page.locator('#error').isVisible(), 'the error box is hidden');
    const text = await b.page.textContent('#error');
    assert.match(text, /WebGPU/);
    assert.match(text, /could not be set up/);
    assert.ok(await b.page.locator('#start').isDisabled());
  } finally {
    await b.close();
  }
});

test('training data not found: the page says which file and what to do', async () => {
  const b = await open('?backend=cpu', { missing: ['data/train/set.000/coord.npy'] });
  try {
    assert.equal(b.s.state, 'error');
    assert.ok(await b.page.locator('#error').isVisible(), 'the error box is hidden');
    const text = await b.page.textContent('#error');
    assert.match(text, /training data could not be loaded/);
    assert.match(text, /data\/train\/set\.000\/coord\.npy: 404/);
    assert.match(text, /build\.sh/);
  } finally {
    await b.close();
  }
});

test('the wasm module not found: the page says to build it', async () => {
  const b = await open('?backend=cpu', { missing: ['pkg/dpw_web.js', 'dev/mock_dpw_web.js'] });
  try {
    assert.equal(b.s.state, 'error');
    assert.match(await b.page.textContent('#error'), /WebAssembly part .* could not be loaded.*build\.sh/s);
  } finally {
    await b.close();
  }
});
