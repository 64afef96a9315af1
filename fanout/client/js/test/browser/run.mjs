// The browser test's driver, started by the Go test TestBrowser
// (fanout/sync/console_browser_test.go) with a live sync node behind
// WALCAST_BASE, a blocking proxy (WebSockets refused) at WALCAST_BLOCKED,
// and the test's control server at WALCAST_CONTROL (POST /commit?n= journals
// and publishes n changes and answers their seqs; POST /restart restarts
// the node on the same address with n changes journaled while it is down).
// Each step waits for the page's state with a deadline, never a sleep.
// It prints one JSON line: what each page received, for the Go test to
// validate against the journal.
import { chromium } from 'playwright-core';

const base = process.env.WALCAST_BASE;
const blocked = process.env.WALCAST_BLOCKED;
const control = process.env.WALCAST_CONTROL;
const token = process.env.WALCAST_TOKEN;
const topic = process.env.WALCAST_TOPIC;
const shot = process.env.WALCAST_SCREENSHOT;
const deadline = 30_000;

const post = async (path) => {
  const r = await fetch(control + path, { method: 'POST' });
  if (!r.ok) throw new Error(`control ${path}: ${r.status} ${await r.text()}`);
  return r.json();
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const out = { ws: [], reload: [], sse: [], transportSSE: '', expected: { ws: [], reload: [], sse: [] } };
try {
  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  page.on('pageerror', (e) => console.error('page error:', e.message));
  const url = (origin, store) => `${origin}/test/page.html?topic=${encodeURIComponent(topic)}&token=${encodeURIComponent(token)}&store=${store}`;
  const received = (p, n) => p.waitForFunction((n) => window.received.length >= n, n, { timeout: deadline });

  // 1. Connect over WebSocket and receive changes written to the journal.
  await page.goto(url(base, 'ws'));
  await page.waitForFunction(() => window.subscribed === true, null, { timeout: deadline });
  out.expected.ws.push(...(await post('/commit?n=5')).seqs);
  await received(page, 5);

  // 2. The node restarts (3 changes journaled while it is down): the page
  // resumes from its cursor, nothing missed, nothing twice.
  out.expected.ws.push(...(await post('/restart?n=3')).seqs);
  await received(page, 8);
  out.expected.ws.push(...(await post('/commit?n=2')).seqs);
  await received(page, 10);
  out.ws = await page.evaluate(() => window.received);

  // 3. A reload resumes from the cursor in localStorage.
  await page.reload();
  await page.waitForFunction(() => window.subscribed === true, null, { timeout: deadline });
  out.expected.reload.push(...(await post('/commit?n=2')).seqs);
  await received(page, 2);
  out.reload = await page.evaluate(() => window.received);

  // 4. Behind a proxy that refuses WebSockets the page falls back to SSE.
  const p2 = await ctx.newPage();
  await p2.goto(url(blocked, 'sse'));
  await p2.waitForFunction(() => window.subscribed === true, null, { timeout: deadline });
  out.transportSSE = await p2.evaluate(() => window.client.transport);
  out.expected.sse.push(...(await post('/commit?n=3')).seqs);
  await received(p2, 3);
  out.sse = await p2.evaluate(() => window.received);

  // 5. The console with live rows, kept as a screenshot.
  const c = await ctx.newPage();
  await c.goto(`${base}/console/`);
  await c.fill('#token', token);
  await c.fill('#topics', topic);
  await c.click('#connect');
  await c.waitForFunction(() => document.getElementById('state').textContent === 'open', null, { timeout: deadline });
  await c.waitForFunction(() => /sockets_open/.test(document.getElementById('counters').textContent), null, { timeout: deadline });
  await post('/commit?n=4');
  await c.waitForFunction(() => document.querySelectorAll('tr.change').length >= 4, null, { timeout: deadline });
  out.consoleRows = await c.evaluate(() => document.querySelectorAll('tr.change').length);
  if (shot) await c.screenshot({ path: shot, fullPage: true });
  out.errors = await page.evaluate(() => window.errors);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
