// The live console `walcast sync --console` serves at /console: paste a
// token, pick topics, watch each topic's changes (op, key, latency from
// commit to this page), its replay gaps and resyncs, and the node's
// counters (GET /console/stats, with the same token).
import { Client, WalcastError, tokenExp, type Envelope } from '../src/index.js';

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const tokenEl = $<HTMLTextAreaElement>('token');
const topicsEl = $<HTMLInputElement>('topics');
const errorEl = $('error');
const stateEl = $('state');
let client: Client | undefined;
let statsTimer: ReturnType<typeof setInterval> | undefined;
const maxRows = 50;

function claims(tok: string): { topics?: string[]; tenant?: string; sub?: string } {
  try {
    const p = tok.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    return JSON.parse(atob(p + '='.repeat((4 - (p.length % 4)) % 4)));
  } catch {
    return {};
  }
}

function cell(tr: HTMLTableRowElement, text: string, cls = ''): void {
  const td = tr.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
}

function panel(topic: string) {
  const sec = document.createElement('section');
  sec.dataset.topic = topic;
  const h = document.createElement('div');
  const counts = { changes: 0, gaps: 0, resyncs: 0 };
  const title = document.createElement('b');
  title.textContent = topic;
  const summary = document.createElement('span');
  h.append(title, ' ', summary);
  const table = document.createElement('table');
  table.createTHead().innerHTML = '<tr><th>seq</th><th>op</th><th>key</th><th>latency</th><th>after</th></tr>';
  const body = table.createTBody();
  sec.append(h, table);
  $('panels').append(sec);
  const show = () => (summary.textContent = `${counts.changes} changes · ${counts.gaps} replay gaps · ${counts.resyncs} resyncs`);
  const note = (text: string) => {
    const tr = body.insertRow(0);
    const td = tr.insertCell();
    td.colSpan = 5;
    td.className = 'note';
    td.textContent = text;
  };
  const add = (ch: Envelope) => {
    counts.changes++;
    const tr = body.insertRow(0);
    tr.className = 'change';
    cell(tr, String(ch.seq ?? ''));
    cell(tr, ch.op, 'op-' + ch.op);
    cell(tr, ch.key ? JSON.stringify(ch.key) : '');
    const lat = ch.commitTime ? Date.now() - Date.parse(ch.commitTime) : NaN;
    cell(tr, Number.isFinite(lat) ? `${lat} ms` : '');
    cell(tr, ch.after ? JSON.stringify(ch.after) : '');
    while (body.rows.length > maxRows) body.deleteRow(-1);
    show();
  };
  show();
  return {
    onChange: add,
    onRow: add,
    onReplayGap: () => {
      counts.gaps++;
      note('replay gap: frames were dropped; resubscribed from the last change');
      show();
    },
    onResync: () => {
      counts.resyncs++;
      note('resync: the topic must be read again; changes continue');
      show();
    },
    onSnapshotBegin: () => note('snapshot begins'),
    onSnapshotEnd: () => note('snapshot ends'),
    onError: (e: WalcastError) => note(e.message),
  };
}

async function stats(tok: string): Promise<void> {
  try {
    const r = await fetch('stats', { headers: { Authorization: `Bearer ${tok}` } });
    if (!r.ok) throw new Error(`${r.status} ${(await r.text()).trim()}`);
    const s = (await r.json()) as Record<string, number | Record<string, number>>;
    const t = $<HTMLTableElement>('counters');
    t.innerHTML = '';
    for (const [k, v] of Object.entries(s)) {
      const tr = t.insertRow();
      cell(tr, k);
      cell(tr, typeof v === 'object' ? Object.entries(v).map(([a, b]) => `${a}=${b}`).join(' ') || '—' : String(v));
    }
    $('stats-at').textContent = new Date().toLocaleTimeString();
  } catch (e) {
    $('stats-at').textContent = `counters unavailable: ${String(e)}`;
  }
}

function disconnect(): void {
  client?.close();
  client = undefined;
  if (statsTimer) clearInterval(statsTimer);
  $('panels').innerHTML = '';
}

function connect(): void {
  disconnect();
  errorEl.textContent = '';
  const tok = tokenEl.value.trim();
  const topics = topicsEl.value.split(/[\s,]+/).filter(Boolean);
  if (!tok || topics.length === 0) {
    errorEl.textContent = 'Paste a token and name at least one topic (schema.table).';
    return;
  }
  const exp = tokenExp(tok);
  if (exp !== undefined && exp * 1000 < Date.now()) {
    errorEl.textContent = 'This token has expired: get a new one.';
    return;
  }
  sessionStorage.setItem('walcast-console', JSON.stringify({ tok, topics }));
  client = new Client({
    url: location.origin,
    token: tok,
    onState: (s) => {
      stateEl.textContent = s;
      stateEl.className = s;
      $('transport').textContent = client?.transport ?? '';
    },
    onError: (e) => {
      if (e.terminal) errorEl.textContent = e.message;
    },
  });
  for (const t of topics) client.subscribe(t, {}, panel(t));
  void stats(tok);
  statsTimer = setInterval(() => void stats(tok), 2000);
}

tokenEl.addEventListener('input', () => {
  const c = claims(tokenEl.value.trim());
  $('granted').textContent = c.topics ? `token grants: ${c.topics.join(', ')}${c.tenant ? ` · tenant ${c.tenant}` : ''}` : '';
  if (!topicsEl.value && c.topics && !c.topics.includes('*')) topicsEl.value = c.topics.join(', ');
});
$('connect').addEventListener('click', connect);
$('disconnect').addEventListener('click', () => {
  disconnect();
  stateEl.textContent = 'closed';
  stateEl.className = '';
});
const saved = sessionStorage.getItem('walcast-console');
if (saved) {
  const s = JSON.parse(saved) as { tok: string; topics: string[] };
  tokenEl.value = s.tok;
  topicsEl.value = s.topics.join(', ');
}
