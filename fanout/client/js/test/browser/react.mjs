// The driver of TestBrowserReact (fanout/sync/react_browser_test.go),
// started with the whole pipeline running behind WALCAST_BASE (the sync
// node, this directory at /test/, tokens at /token) and the test's own
// handler at /control/: GET /control/rows answers the table's rows,
// POST /control/change?op=insert|update|delete&id= changes one in SQL
// (op=truncate empties the table and inserts rows 100 to 105 in one
// transaction), POST /control/restart restarts the sync node (it answers
// first), GET /control/restarts counts the restarts done,
// and /control/react/ serves WALCAST_REACT_DIR, where this driver first
// bundles react-page.tsx with esbuild and the React of node_modules.
// Each step waits for the page's DOM with a deadline, never a sleep; a
// step that fails throws, saying what the page showed. It prints one JSON
// line of what it saw, for the Go test.
import { build } from 'esbuild';
import { chromium } from 'playwright-core';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '../..');
const base = process.env.WALCAST_BASE;
const topic = process.env.WALCAST_TOPIC;
const deadline = 30_000;

await build({
  entryPoints: [join(here, 'react-page.tsx')],
  outfile: join(process.env.WALCAST_REACT_DIR, 'page.js'),
  bundle: true,
  format: 'esm',
  target: 'es2020',
  jsx: 'automatic',
  define: { 'process.env.NODE_ENV': '"development"' },
  alias: { '@walcast/client/react': join(root, 'src/react.ts'), '@walcast/client': join(root, 'src/index.ts') },
  logLevel: 'warning',
});

const control = async (path, method = 'GET') => {
  const r = await fetch(`${base}/control/${path}`, { method });
  if (!r.ok) throw new Error(`control ${path}: ${r.status} ${await r.text()}`);
  return r.json();
};
// canon is rows as one string: ordered by id, each row's columns by name
// (the page compares with the same function).
const canon = (rows) =>
  JSON.stringify([...rows].sort((a, b) => a.id - b.id).map((r) => Object.keys(r).sort().map((k) => [k, r[k]])));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const out = { steps: [] };
try {
  const page = await browser.newPage();
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(e.message));
  const shown = (id) =>
    page.evaluate((id) => [...document.querySelectorAll(`#${id} tr[data-row]`)].map((tr) => JSON.parse(tr.dataset.row)), id);
  const state = () =>
    page.evaluate(() => ({
      status: document.getElementById('status')?.textContent,
      error: document.getElementById('error')?.textContent,
      items: document.querySelectorAll('#items tr').length,
      suspended: document.querySelectorAll('#suspended tr').length,
      filtered: [...document.querySelectorAll('#filtered tr[data-row]')].map((tr) => tr.dataset.row),
      fallback: !!document.getElementById('fallback'),
      clientState: window.client?.state,
      errors: window.errors,
    }));
  // matches waits until both tables of the page show the table's rows,
  // and the filtered one the rows with n <= 3, cut to id and n.
  const matches = async (what) => {
    const all = await control('rows');
    const want = canon(all);
    const wantFiltered = canon(all.filter((r) => r.n <= 3).map((r) => ({ id: r.id, n: r.n })));
    try {
      await page.waitForFunction(
        ([want, wantFiltered]) => {
          const rows = (id) => [...document.querySelectorAll(`#${id} tr[data-row]`)].map((tr) => JSON.parse(tr.dataset.row));
          const canon = (rows) =>
            JSON.stringify([...rows].sort((a, b) => a.id - b.id).map((r) => Object.keys(r).sort().map((k) => [k, r[k]])));
          return canon(rows('items')) === want && canon(rows('suspended')) === want && canon(rows('filtered')) === wantFiltered;
        },
        [want, wantFiltered],
        { timeout: deadline },
      );
    } catch (e) {
      throw new Error(`${what}: the page does not show the table's ${JSON.parse(want).length} rows: ${e.message}; ` +
        `the page: ${JSON.stringify(await state())}; page errors: ${JSON.stringify(pageErrors)}`);
    }
    out.steps.push({ what, rows: (await shown('items')).length });
  };

  // 1. The rows appear: the suspended component showed its fallback
  // first; the status reads ready.
  await page.goto(`${base}/test/react.html?topic=${encodeURIComponent(topic)}`);
  await matches('first load');
  const first = await state();
  if (first.status !== 'ready') throw new Error(`first load: status ${first.status}`);
  out.fallbacks = await page.evaluate(() => window.fallbacks);
  // The component of a topic the token does not grant shows the refusal.
  try {
    await page.waitForFunction(() => document.getElementById('refused')?.dataset.status === 'error', null, { timeout: deadline });
  } catch (e) {
    throw new Error(`the refused topic: ${e.message}; the page: ${JSON.stringify(await state())}`);
  }
  out.refused = await page.evaluate(() => document.getElementById('refused').textContent);
  if (out.fallbacks < 1) throw new Error('the suspended component never showed its fallback');

  // 2. An insert, an update and a delete in SQL reach both components.
  await control('change?op=insert&id=5001', 'POST');
  await matches('after an insert');
  await control('change?op=update&id=5001', 'POST');
  await matches('after an update');
  await control('change?op=update&id=3', 'POST');
  await control('change?op=delete&id=4', 'POST');
  await matches('after an update and a delete');

  // 3. A reload resumes with the cursor in localStorage and still gets
  // the rows; later changes keep arriving.
  await page.reload();
  await matches('after a reload');
  out.stored = await page.evaluate(() => window.stored);
  if (!out.stored) throw new Error('the reloaded page had no stored cursor, so the reload proved nothing');
  await control('change?op=insert&id=5002', 'POST');
  await control('change?op=delete&id=5001', 'POST');
  await matches('after a reload, an insert and a delete');

  // 4. A TRUNCATE and new rows in one transaction: the node answers with
  // a fresh snapshot (the token has the snapshot claim), and the page
  // holds exactly the new rows.
  await control('change?op=truncate&id=0', 'POST');
  await matches('after a truncate and new rows');

  // 5. The sync node restarts: the page's client reconnects to the new
  // node, resumes from its cursor and gets the changes made meanwhile.
  const before = (await control('restarts')).restarts;
  await control('restart', 'POST');
  for (const end = Date.now() + deadline; ; ) {
    const n = await control('restarts').then((r) => r.restarts, () => before); // refused while it restarts
    if (n > before) break;
    if (Date.now() > end) throw new Error('the sync node did not come back after a restart');
    await new Promise((r) => setTimeout(r, 50));
  }
  await control('change?op=insert&id=5003', 'POST');
  await control('change?op=update&id=101', 'POST');
  await matches('after a sync node restart');
  out.restarts = (await control('restarts')).restarts;

  // 6. Tokens of 2 to 3 s are replaced on the open socket (refresh
  // frames, counted since the reload), and changes keep arriving.
  try {
    await page.waitForFunction(() => window.sent.filter((f) => f.t === 'refresh').length >= 2, null, { timeout: deadline });
  } catch (e) {
    throw new Error(`token refresh: ${e.message}; sent ${JSON.stringify(await page.evaluate(() => window.sent.map((f) => f.t)))}`);
  }
  await control('change?op=delete&id=100', 'POST');
  await matches('after token refreshes and a delete');

  // 7. Unmounting the components unsubscribes the topic.
  await page.evaluate(() => window.unmount());
  try {
    await page.waitForFunction((topic) => window.sent.some((f) => f.t === 'unsub' && f.topic === topic) && window.client.cursor(topic) === undefined,
      topic, { timeout: deadline });
  } catch (e) {
    throw new Error(`after unmount: no unsub of ${topic}: ${e.message}; sent ${JSON.stringify(await page.evaluate(() => window.sent))}`);
  }
  out.sent = await page.evaluate(() => window.sent.map((f) => f.t));
  out.refreshes = out.sent.filter((t) => t === 'refresh').length;
  // Every error but the refused topic's.
  out.errors = await page.evaluate(() => window.errors.filter((m) => !m.includes('public.refused')));
  out.pageErrors = pageErrors;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
