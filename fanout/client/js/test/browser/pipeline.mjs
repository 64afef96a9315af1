// The driver of TestBrowserPipeline (fanout/sync/pipeline_browser_test.go),
// started with the whole pipeline running behind WALCAST_BASE: the sync node
// (console at /console/, this directory at /test/, tokens at /token) and the
// test's workload at POST /control/workload, which commits the changes in
// SQL and answers when they are committed, with the n of the last one.
// Each step waits for the page's state with a deadline, never a sleep.
// It prints one JSON line: what the page received and holds, for the Go
// test to check against the table and the workload.
import { chromium } from 'playwright-core';

const base = process.env.WALCAST_BASE;
const topic = process.env.WALCAST_TOPIC;
const consoleToken = process.env.WALCAST_CONSOLE_TOKEN;
const shot = process.env.WALCAST_SCREENSHOT;
const deadline = 30_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
// waitPage waits for fn on the page; on a timeout it says what the page had.
const waitPage = async (page, what, fn, arg) => {
  try {
    await page.waitForFunction(fn, arg, { timeout: deadline });
  } catch (e) {
    const st = await page.evaluate(() => ({ state: window.client.state, ...window.short, changes: window.stream.length, maxN: window.maxN,
      errors: window.errors, long: { state: window.longClient.state, ...window.long, stream: window.long.stream.length } }));
    throw new Error(`${what}: ${e.message}; the page: ${JSON.stringify(st)}`);
  }
};

// sortRows orders rows by id and each row's columns by name, for comparing
// two pages' tables.
const sortRows = (rows) =>
  [...rows].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)).map((r) => Object.keys(r).sort().map((k) => [k, r[k]]));

let out;
try {
  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  page.on('pageerror', (e) => console.error('page error:', e.message));

  // 1. The page connects with a short-lived token and receives the
  // table's rows (snapshot).
  await page.goto(`${base}/test/pipeline.html?topic=${encodeURIComponent(topic)}`);
  await waitPage(page, 'the snapshot and the second subscription', () => window.ready === true && window.long.subscribed === true);

  // 2. The console, connected before the workload, shows it arriving.
  const c = await ctx.newPage();
  await c.goto(`${base}/console/`);
  await c.fill('#token', consoleToken);
  await c.fill('#topics', topic);
  await c.click('#connect');
  await c.waitForFunction(() => document.getElementById('state').textContent === 'open', null, { timeout: deadline });

  // 3. The workload: changes committed in SQL over several token lives.
  const r = await fetch(`${base}/control/workload`, { method: 'POST' });
  if (!r.ok) throw new Error(`workload: ${r.status} ${await r.text()}`);
  const { last } = await r.json();
  // (or a client gave up: the Go test says what went wrong)
  await waitPage(page, `the last change (n=${last})`, (n) => (window.maxN >= n && window.long.stream.some((c) => c.n === n)) ||
    window.client.state === 'failed' || window.longClient.state === 'failed', last);
  await c.waitForFunction(() => document.querySelectorAll('tr.change').length >= 10, null, { timeout: deadline });
  await c.waitForFunction(() => /sockets_open/.test(document.getElementById('counters').textContent), null, { timeout: deadline });
  const consoleRows = await c.evaluate(() => document.querySelectorAll('tr.change').length);
  if (shot) await c.screenshot({ path: shot, fullPage: true });

  // A token may be mid-refresh at this moment: the reading waits (in the
  // page, so nothing runs between the wait and the reading) until every
  // refresh frame sent has had its answer, or the deadline passes and the
  // Go test reports the unanswered one.
  out = await page.evaluate(async (ms) => {
    const end = Date.now() + ms;
    while (window.short.refreshes !== window.short.refreshed && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    return {
      stream: window.stream,
      rows: window.rows(),
      ...window.short,
      errors: window.errors,
      long: window.long,
    };
  }, deadline);
  out.consoleRows = consoleRows;

  // 4. live() over Server-Sent Events: the table's rows, and again after a
  // reload that resumes with the cursor kept in localStorage (the stream
  // must ask for the snapshot without it); a second live() of the topic
  // gets the rows too.
  const sse = await ctx.newPage();
  sse.on('pageerror', (e) => console.error('page error:', e.message));
  const want = JSON.stringify(sortRows(out.rows));
  const sseRows = async (what) => {
    try {
      await sse.waitForFunction(() => window.ready[0] && window.ready[1], null, { timeout: deadline });
    } catch (e) {
      const st = await sse.evaluate(() => ({ state: window.client.state, transport: window.client.transport, ready: window.ready,
        rows: [window.rows(0).length, window.rows(1).length], errors: window.errors }));
      throw new Error(`live() over SSE, ${what}: ${e.message}; the page: ${JSON.stringify(st)}`);
    }
    const got = await sse.evaluate(() => ({ a: window.rows(0), b: window.rows(1), transport: window.client.transport, stored: window.stored, errors: window.errors }));
    for (const [name, rows] of [['the first table', got.a], ['the second table', got.b]]) {
      if (JSON.stringify(sortRows(rows)) !== want) {
        throw new Error(`live() over SSE, ${what}: ${name} holds ${rows.length} rows, not the ${out.rows.length} of the WebSocket page`);
      }
    }
    if (got.transport !== 'sse') throw new Error(`live() over SSE, ${what}: transport ${got.transport}`);
    if (got.errors.length > 0) throw new Error(`live() over SSE, ${what}: the client reported ${JSON.stringify(got.errors)}`);
    return got;
  };
  await sse.goto(`${base}/test/livesse.html?topic=${encodeURIComponent(topic)}`);
  await sseRows('first load');
  await sse.reload();
  const reloaded = await sseRows('after a reload');
  if (!reloaded.stored) throw new Error('live() over SSE: the reloaded page had no stored cursor, so the reload proved nothing');
  out.sseRows = reloaded.a.length;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
