// Shared by the page tests: a static server for web/ on 127.0.0.1 and Debian's Chromium,
// headless with WebGPU, through playwright-core.
import http from 'node:http';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const WEB = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const ROOT = path.resolve(WEB, '..');
export const RESULTS = path.join(WEB, 'test-results');

export const CHROMIUM = process.env.DPW_CHROMIUM || '/usr/bin/chromium';

// What it takes to get WebGPU (on SwiftShader, Chromium's software Vulkan) in headless Chromium
// here: --enable-unsafe-webgpu; the rest keeps it off the network and out of the way.
export const CHROMIUM_ARGS = [
  '--headless=new',
  '--enable-unsafe-webgpu',
  '--no-sandbox',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

const MIME = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.png': 'image/png',
  '.svg': 'image/svg+xml',
};

/** Serves web/ on 127.0.0.1 (a free port). Returns {url, close()}. */
export async function serve(dir = WEB) {
  const server = http.createServer((req, res) => {
    const u = new URL(req.url, 'http://127.0.0.1');
    let p = path.normalize(decodeURIComponent(u.pathname));
    if (p.endsWith('/')) p += 'index.html';
    const file = path.join(dir, p);
    if (!file.startsWith(dir + path.sep)) {
      res.writeHead(403).end();
      return;
    }
    fs.readFile(file, (err, data) => {
      if (err) {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
        return;
      }
      res.writeHead(200, {
        'content-type': MIME[path.extname(file)] || 'application/octet-stream',
        'cache-control': 'no-store',
      });
      res.end(data);
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}/`,
    close: () => new Promise((r) => server.close(r)),
  };
}

/** Launches headless Chromium with a fresh profile. Returns {context, page, close()}. */
export async function launch() {
  if (!fs.existsSync(CHROMIUM)) {
    throw new Error(`${CHROMIUM} not found: install Debian's chromium (apt-get install chromium)`);
  }
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'dpw-chromium-'));
  // launchPersistentContext: playwright takes the fresh --user-data-dir this way.
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: false, // --headless=new is in the args
    args: CHROMIUM_ARGS,
    viewport: { width: 1280, height: 900 },
  });
  const page = context.pages()[0] || (await context.newPage());
  return {
    context,
    page,
    close: async () => {
      await context.close();
      fs.rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** Collects what a visitor would not want: page errors, console errors, failed requests. */
export function watch(page) {
  const problems = [];
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console.error: ${m.text()}`);
  });
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.on('response', (r) => {
    if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`);
  });
  return problems;
}
