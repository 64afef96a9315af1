import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client, MemoryCursorStore, rowKey } from '../dist/index.js';
import { env, tick, fakeFetch, answer } from './fakes.mjs';

const T = 'public.orders';
const env0 = { lsn: '0/1', commitLsn: '0/1', xid: 1, commitTime: '' };
const ch = (seq, op, fields) => ({ t: 'change', topic: T, cursor: 'c' + seq, end: true, change: { seq, op, ...env0, ...fields } });

test('live: snapshot rows, then changes keep key → row', async () => {
  const e = env();
  const c = new Client(e.opts);
  const events = [];
  const table = c.live(T, { onChange: (_rows, evs) => events.push(evs.map((ev) => ev.type)) });
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  assert.deepEqual(s.sent, [{ t: 'sub', topic: T, snapshot: true }]);
  assert.equal(table.ready, false);
  s.frame({ t: 'snapshot-begin', topic: T });
  s.frame({ t: 'row', topic: T, change: { seq: 1, op: 'read', ...env0, key: { id: 1 }, after: { id: 1, status: 'new', notes: 'big' } } });
  s.frame({ t: 'row', topic: T, change: { seq: 2, op: 'read', ...env0, key: { id: 2 }, after: { id: 2, status: 'new' } } });
  s.frame({ t: 'snapshot-end', topic: T, cursor: 's2' });
  assert.equal(table.ready, true);
  assert.equal(table.rows.size, 2);
  assert.equal(c.cursor(T), 's2');
  // An update that leaves notes out as unchanged keeps its value.
  s.frame(ch(3, 'update', { key: { id: 1 }, after: { id: 1, status: 'paid' }, unchanged: ['notes'] }));
  assert.deepEqual(table.rows.get(rowKey({ id: 1 })), { id: 1, status: 'paid', notes: 'big' });
  s.frame(ch(4, 'insert', { key: { id: 3 }, after: { id: 3, status: 'new' } }));
  s.frame(ch(4, 'insert', { key: { id: 3 }, after: { id: 3, status: 'dup' } })); // duplicate seq
  assert.equal(table.rows.get(rowKey({ id: 3 })).status, 'new');
  s.frame(ch(5, 'delete', { key: { id: 2 }, before: { id: 2 } }));
  assert.equal(table.rows.has(rowKey({ id: 2 })), false);
  // A key change moves the row.
  s.frame(ch(6, 'update', { key: { id: 30 }, before: { id: 3 }, after: { id: 30, status: 'moved' } }));
  assert.equal(table.rows.has(rowKey({ id: 3 })), false);
  assert.equal(table.rows.get(rowKey({ id: 30 })).status, 'moved');
  assert.deepEqual([...table.rows.keys()].sort(), [rowKey({ id: 1 }), rowKey({ id: 30 })].sort());
  s.frame(ch(7, 'truncate', {}));
  assert.equal(table.rows.size, 0);
  await tick();
  assert.deepEqual(events, [['snapshot'], ['upsert', 'upsert', 'delete', 'delete', 'upsert', 'clear']]);
});

test('live: a resync asks for a new snapshot and drops rows it does not name', async () => {
  const e = env();
  const c = new Client(e.opts);
  const table = c.live(T);
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  s.frame({ t: 'snapshot-begin', topic: T });
  s.frame({ t: 'row', topic: T, change: { seq: 1, op: 'read', ...env0, key: { id: 1 }, after: { id: 1 } } });
  s.frame({ t: 'row', topic: T, change: { seq: 2, op: 'read', ...env0, key: { id: 2 }, after: { id: 2 } } });
  s.frame({ t: 'snapshot-end', topic: T, cursor: 's2' });
  s.frame({ t: 'resync', topic: T, cursor: 'r9' });
  assert.deepEqual(s.sent.at(-1), { t: 'sub', topic: T, snapshot: true });
  s.frame({ t: 'snapshot-begin', topic: T });
  s.frame({ t: 'row', topic: T, change: { seq: 1, op: 'read', ...env0, key: { id: 2 }, after: { id: 2, v: 'new' } } });
  s.frame({ t: 'snapshot-end', topic: T, cursor: 's3' });
  assert.deepEqual([...table.rows.values()], [{ id: 2, v: 'new' }]);
  // A reconnect after the snapshot resumes from its cursor without another.
  s.serverClose(1006);
  e.clock.advance(60_000);
  await tick();
  e.ws.sockets[1].open();
  assert.deepEqual(e.ws.sockets[1].sent, [{ t: 'sub', topic: T, cursor: 's3' }]);
});

test('live: a row moving between tenants leaves one table as a moved delete and enters the other as an upsert', async () => {
  const e = env();
  const c = new Client(e.opts);
  const old = c.live(T);
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  s.frame({ t: 'snapshot-begin', topic: T });
  s.frame({ t: 'row', topic: T, change: { seq: 1, op: 'read', ...env0, key: { id: 1 }, after: { id: 1, org: 'a' }, tenant: 'a' } });
  s.frame({ t: 'snapshot-end', topic: T, cursor: 's1' });
  // The old tenant's socket: the journal's delete of the row it held.
  s.frame(ch(2, 'delete', { key: { id: 1 }, before: { id: 1 }, tenant: 'a', moved: 'tenant' }));
  assert.equal(old.rows.size, 0);

  const e2 = env();
  const c2 = new Client(e2.opts);
  const neu = c2.live(T);
  await tick();
  const s2 = e2.ws.sockets[0];
  s2.open();
  s2.frame({ t: 'snapshot-begin', topic: T });
  s2.frame({ t: 'snapshot-end', topic: T, cursor: 's1' });
  // The new tenant's socket: an update of a key it never held, some of
  // its columns unchanged (unknown here), becomes the row.
  s2.frame(ch(3, 'update', { key: { id: 1 }, after: { id: 1, org: 'b' }, unchanged: ['notes'], tenant: 'b' }));
  assert.deepEqual(neu.rows.get(rowKey({ id: 1 })), { id: 1, org: 'b' });
  // The same with a key change: the old key it never held is ignored.
  s2.frame(ch(5, 'update', { key: { id: 7 }, before: { id: 6 }, after: { id: 7, org: 'b' }, tenant: 'b' }));
  assert.deepEqual([...neu.rows.keys()].sort(), [rowKey({ id: 1 }), rowKey({ id: 7 })].sort());
});

// sseWrite sends frames on a fake event stream as the node does (an error
// frame is the event node-error).
const sseWrite = (call, ...frames) =>
  call.write(frames.map((f) => `event: ${f.t === 'error' ? 'node-error' : f.t}\ndata: ${JSON.stringify(f)}\n\n`).join(''));
const ticks = async (n = 4) => {
  for (let i = 0; i < n; i++) await tick();
};
const snapshotFrames = (cursor, ...ids) => [
  { t: 'snapshot-begin', topic: T },
  ...ids.map((id) => ({ t: 'row', topic: T, row: { op: 'read', ...env0, key: { id }, after: { id } } })),
  { t: 'snapshot-end', topic: T, cursor },
];

test('live over SSE: a reloaded page with a stored cursor asks for the snapshot without the cursor', async () => {
  const store = new MemoryCursorStore();
  store.set(T, 'stored'); // the cursor the page kept before its reload
  const f = fakeFetch();
  const e = env({ transport: 'sse', fetch: f.fetch, store });
  const c = new Client(e.opts);
  const table = c.live(T);
  await ticks();
  const call = f.calls[0];
  assert.deepEqual(call.url.searchParams.getAll('topic'), [T]);
  assert.deepEqual(call.url.searchParams.getAll('snapshot'), [T]);
  assert.deepEqual(call.url.searchParams.getAll('cursor'), [], 'a cursor makes the node skip the snapshot');
  answer(call, { status: 200 });
  await ticks();
  sseWrite(call, ...snapshotFrames('s2', 1, 2));
  await ticks();
  assert.equal(table.ready, true);
  assert.equal(table.rows.size, 2);
  assert.equal(store.get(T), 's2');
});

test('live over SSE: a resync reopens the stream for a snapshot, without the resync cursor', async () => {
  const f = fakeFetch();
  const e = env({ transport: 'sse', fetch: f.fetch });
  const c = new Client(e.opts);
  const table = c.live(T);
  await ticks();
  answer(f.calls[0], { status: 200 });
  await ticks();
  sseWrite(f.calls[0], ...snapshotFrames('s2', 1, 2));
  await ticks();
  // The stream ends; the client resumes from the snapshot's cursor.
  f.calls[0].end();
  await ticks();
  e.clock.advance(60_000);
  await ticks();
  const resumed = f.calls[1];
  assert.deepEqual(resumed.url.searchParams.getAll('cursor'), ['s2']);
  assert.deepEqual(resumed.url.searchParams.getAll('snapshot'), []);
  answer(resumed, { status: 200 });
  await ticks();
  // A truncate: the node says resync; the state must be read again.
  sseWrite(resumed, { t: 'resync', topic: T, cursor: 'r9' });
  await ticks();
  const again = f.calls[2];
  assert.ok(again, 'the stream is reopened after the resync');
  assert.deepEqual(again.url.searchParams.getAll('snapshot'), [T]);
  assert.deepEqual(again.url.searchParams.getAll('cursor'), [], 'with the resync cursor the node resumes at the horizon and skips the snapshot');
  answer(again, { status: 200 });
  await ticks();
  sseWrite(again, ...snapshotFrames('s3', 2));
  await ticks();
  assert.deepEqual([...table.rows.values()], [{ id: 2 }]);
  assert.equal(c.cursor(T), 's3');
});

test('live: a second live() of a topic gets the rows too', async () => {
  const e = env();
  const c = new Client(e.opts);
  const first = c.live(T);
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  snapshotFrames('s2', 1, 2).forEach((f) => s.frame(f));
  s.frame(ch(3, 'insert', { key: { id: 3 }, after: { id: 3 } }));
  assert.equal(first.rows.size, 3);
  const second = c.live(T);
  assert.deepEqual(s.sent.filter((f) => f.t === 'sub'), [{ t: 'sub', topic: T, snapshot: true }, { t: 'sub', topic: T, snapshot: true }], 'the rows are asked for again');
  assert.equal(second.ready, false);
  snapshotFrames('s3', 1, 2, 3).forEach((f) => s.frame(f));
  assert.equal(second.ready, true);
  assert.equal(second.rows.size, 3);
  assert.equal(first.rows.size, 3);
});

test('live: a second live() during the first one\'s snapshot waits for a whole one', async () => {
  const e = env();
  const c = new Client(e.opts);
  const first = c.live(T);
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  const [begin, r1, r2, end] = snapshotFrames('s2', 1, 2);
  s.frame(begin);
  s.frame(r1);
  let calls = 0;
  const second = c.live(T, { onChange: () => calls++ });
  assert.equal(s.sent.filter((f) => f.t === 'sub').length, 2);
  s.frame(r2); // the rest of the first snapshot, already on its way
  s.frame(end);
  await tick();
  assert.equal(first.ready, true);
  assert.equal(second.ready, false, 'it saw half a snapshot');
  assert.equal(second.rows.size, 0, 'half a snapshot is not rows');
  assert.equal(calls, 0);
  snapshotFrames('s3', 1, 2).forEach((f) => s.frame(f));
  assert.equal(second.ready, true);
  assert.equal(second.rows.size, 2);
  assert.equal(calls, 1);
});

test('live: one callback per snapshot and per batch of changes, each with a new Map', async () => {
  const e = env();
  const c = new Client(e.opts);
  const calls = [];
  const table = c.live(T, { onChange: (rows, evs) => calls.push({ rows, size: rows.size, evs }) });
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  const ids = Array.from({ length: 3028 }, (_, i) => i + 1);
  const [begin, ...rest] = snapshotFrames('s1', ...ids);
  s.frame(begin);
  for (const f of rest.slice(0, -1)) s.frame(f);
  // A transaction committed while the rows were read, part of the snapshot.
  s.frame({ t: 'change', topic: T, change: { seq: 1, op: 'insert', ...env0, key: { id: 5000 }, after: { id: 5000 } } });
  await tick();
  assert.equal(calls.length, 0, 'nothing before the snapshot ends');
  assert.equal(table.rows.size, 0, 'rows are the snapshot\'s only once it is whole');
  s.frame(rest.at(-1));
  assert.equal(calls.length, 1);
  assert.deepEqual(calls[0].evs, [{ type: 'snapshot', rows: 3029 }]);
  assert.equal(calls[0].size, 3029);
  // A transaction of three changes arriving together: one callback.
  s.frame(ch(2, 'insert', { key: { id: 6000 }, after: { id: 6000 } }));
  s.frame(ch(3, 'update', { key: { id: 1 }, after: { id: 1, v: 2 } }));
  s.frame(ch(4, 'delete', { key: { id: 2 }, before: { id: 2 } }));
  assert.equal(calls.length, 1);
  await tick();
  assert.equal(calls.length, 2);
  assert.deepEqual(calls[1].evs.map((ev) => ev.type), ['upsert', 'upsert', 'delete']);
  assert.notEqual(calls[1].rows, calls[0].rows, 'a new Map per batch');
  assert.equal(calls[0].rows.size, 3029, 'a Map handed out never changes');
  assert.equal(calls[0].rows.has(rowKey({ id: 2 })), true);
  assert.equal(calls[1].rows.size, 3029);
  assert.equal(table.rows, calls[1].rows);
  s.frame(ch(5, 'insert', { key: { id: 7000 }, after: { id: 7000 } }));
  await tick();
  assert.equal(calls.length, 3);
  assert.notEqual(calls[2].rows, calls[1].rows);
  assert.equal(calls[1].rows.size, 3029);
  assert.equal(calls[2].rows.size, 3030);
});

test('live: schedule groups changes as the page asks (one callback per animation frame)', async () => {
  const e = env();
  const c = new Client(e.opts);
  const frames = [];
  const calls = [];
  c.live(T, { snapshot: false, schedule: (fn) => frames.push(fn), onChange: (_rows, evs) => calls.push(evs.length) });
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  s.frame(ch(1, 'insert', { key: { id: 1 }, after: { id: 1 } }));
  await tick();
  s.frame(ch(2, 'insert', { key: { id: 2 }, after: { id: 2 } }));
  await tick();
  assert.equal(calls.length, 0);
  assert.equal(frames.length, 1, 'one frame asked for');
  frames.shift()();
  assert.deepEqual(calls, [2]);
});

test('live over SSE: a second live() reopens the stream for a snapshot, without the cursor', async () => {
  const f = fakeFetch();
  const e = env({ transport: 'sse', fetch: f.fetch });
  const c = new Client(e.opts);
  const first = c.live(T);
  await ticks();
  answer(f.calls[0], { status: 200 });
  await ticks();
  sseWrite(f.calls[0], ...snapshotFrames('s2', 1, 2));
  await ticks();
  assert.equal(first.ready, true);
  const second = c.live(T);
  await ticks();
  const again = f.calls[1];
  assert.ok(again, 'the stream is reopened');
  assert.deepEqual(again.url.searchParams.getAll('snapshot'), [T]);
  assert.deepEqual(again.url.searchParams.getAll('cursor'), []);
  answer(again, { status: 200 });
  await ticks();
  sseWrite(again, ...snapshotFrames('s3', 1, 2, 3));
  await ticks();
  assert.equal(second.ready, true);
  assert.equal(second.rows.size, 3);
  assert.equal(first.rows.size, 3);
});

test('live: a transaction whose frames arrive in separate tasks is applied in one batch at its end', async () => {
  const e = env();
  const c = new Client(e.opts);
  const calls = [];
  const table = c.live(T, { snapshot: false, onChange: (rows, evs) => calls.push({ size: rows.size, evs: evs.map((ev) => ev.type) }) });
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  const mid = (seq, id) => ({ t: 'change', topic: T, change: { seq, op: 'insert', ...env0, commitLsn: '0/9', key: { id }, after: { id } } });
  s.frame(mid(1, 1));
  await tick();
  s.frame(mid(2, 2));
  await tick();
  assert.equal(calls.length, 0, 'nothing of the transaction before its end');
  assert.equal(table.rows.size, 0);
  s.frame({ ...mid(3, 3), cursor: 'c3', end: true });
  await tick();
  assert.deepEqual(calls, [{ size: 3, evs: ['upsert', 'upsert', 'upsert'] }]);
  assert.equal(c.cursor(T), 'c3');
});
