import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client, MemoryCursorStore, rowKey } from '../dist/index.js';
import { env, change, tick, fakeFetch, answer } from './fakes.mjs';

const T = 'public.orders';
const paid = { col: 'status', op: '=', value: 'paid' };
const env0 = { lsn: '0/1', commitLsn: '0/1', xid: 1, commitTime: '' };
const subs = (s) => s.sent.filter((f) => f.t === 'sub');

test('filter: sent with the first sub, after a replay gap, after a reconnect and with the fresh snapshot after a resync', async () => {
  const e = env();
  const c = new Client(e.opts);
  c.subscribe(T, { snapshot: true, filter: paid, columns: ['status', 'amount'] }, {});
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  const view = { filter: paid, columns: ['status', 'amount'] };
  assert.deepEqual(subs(s), [{ t: 'sub', topic: T, snapshot: true, ...view }]);
  s.frame({ t: 'snapshot-begin', topic: T });
  s.frame({ t: 'snapshot-end', topic: T, cursor: 's1' });
  s.frame(change(T, 2, 'c2'));
  s.frame({ t: 'replay-gap', topic: T, cursor: 'c2' });
  assert.deepEqual(subs(s).at(-1), { t: 'sub', topic: T, cursor: 'c2', ...view });
  s.frame({ t: 'resync', topic: T, cursor: 'r3' });
  assert.deepEqual(subs(s).at(-1), { t: 'sub', topic: T, snapshot: true, ...view });
  s.frame({ t: 'snapshot-begin', topic: T });
  s.frame({ t: 'snapshot-end', topic: T, cursor: 's4' });
  s.serverClose(1006);
  e.clock.advance(60_000);
  await tick();
  const s2 = e.ws.sockets[1];
  s2.open();
  assert.deepEqual(subs(s2), [{ t: 'sub', topic: T, cursor: 's4', ...view }]);
  // A bad cursor (one issued under another view) starts over with the same view.
  s2.frame({ t: 'error', code: 'bad-cursor', topic: T, message: 'cursor issued for another view' });
  assert.deepEqual(subs(s2).at(-1), { t: 'sub', topic: T, snapshot: true, ...view });
});

test('filter: columns [] asks for the key columns only; no filter sends neither field', async () => {
  const e = env();
  const c = new Client(e.opts);
  c.subscribe(T, { columns: [] }, {});
  c.subscribe('public.items', {}, {});
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  assert.deepEqual(subs(s), [{ t: 'sub', topic: T, columns: [] }, { t: 'sub', topic: 'public.items' }]);
});

test('filter: a second subscriber of a topic must ask for the same view', async () => {
  const e = env();
  const c = new Client(e.opts);
  const stop = c.subscribe(T, { filter: paid }, {});
  c.subscribe(T, { filter: { col: 'status', op: '=', value: 'paid' } }, {}); // the same view, shared
  assert.throws(() => c.subscribe(T, { filter: paid, columns: ['status'] }, {}), /already subscribed with another filter or column list/);
  assert.throws(() => c.subscribe(T, {}, {}), /already subscribed/);
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  assert.deepEqual(subs(s), [{ t: 'sub', topic: T, filter: paid }]);
  stop();
});

test('filter: bad-filter reaches the handlers and onError with the node\'s message, and the topic is left', async () => {
  const e = env();
  const c = new Client(e.opts);
  const got = [];
  c.subscribe(T, { filter: { col: 'amount', op: '=', value: 'x' } }, { onError: (err) => got.push(err) });
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  s.frame({ t: 'error', code: 'bad-filter', topic: T, message: 'filter.value: column "amount" is int4; give an integer' });
  assert.equal(got.length, 1);
  assert.equal(got[0].code, 'bad-filter');
  assert.equal(got[0].kind, 'node');
  assert.equal(got[0].topic, T);
  assert.match(got[0].message, /bad-filter on public\.orders: filter\.value: column "amount" is int4; give an integer; the client left the topic \(correct the filter or column list/);
  assert.equal(e.errors[0], got[0]);
  // Left: not subscribed again after a reconnect, and a corrected view may be asked for.
  s.serverClose(1006);
  e.clock.advance(60_000);
  await tick();
  e.ws.sockets[1].open();
  assert.deepEqual(subs(e.ws.sockets[1]), []);
  c.subscribe(T, { filter: { col: 'amount', op: '=', value: 7 } }, {});
  assert.deepEqual(subs(e.ws.sockets[1]), [{ t: 'sub', topic: T, filter: { col: 'amount', op: '=', value: 7 } }]);
});

test('filter: live() keeps only matching rows; a removal (left: filter) deletes the row', async () => {
  const e = env();
  const c = new Client(e.opts);
  const events = [];
  const table = c.live(T, { filter: paid, columns: ['status'], onChange: (_rows, evs) => events.push(...evs.map((ev) => [ev.type, ev.key, ev.change?.left])) });
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  assert.deepEqual(subs(s), [{ t: 'sub', topic: T, snapshot: true, filter: paid, columns: ['status'] }]);
  s.frame({ t: 'snapshot-begin', topic: T });
  s.frame({ t: 'row', topic: T, change: { seq: 1, op: 'read', ...env0, key: { id: 1 }, after: { id: 1, status: 'paid' } } });
  s.frame({ t: 'row', topic: T, change: { seq: 2, op: 'read', ...env0, key: { id: 2 }, after: { id: 2, status: 'paid' } } });
  s.frame({ t: 'snapshot-end', topic: T, cursor: 's2' });
  assert.equal(table.rows.size, 2);
  // Row 2 stops matching: the node sends its removal.
  s.frame({ t: 'change', topic: T, cursor: 'c3', end: true, change: { seq: 3, op: 'delete', ...env0, key: { id: 2 }, before: { id: 2 }, left: 'filter' } });
  assert.deepEqual([...table.rows.keys()], [rowKey({ id: 1 })]);
  await tick();
  assert.deepEqual(events, [['snapshot', undefined, undefined], ['delete', rowKey({ id: 2 }), 'filter']]);
  // A reconnect resumes from the cursor, with the view.
  s.serverClose(1006);
  e.clock.advance(60_000);
  await tick();
  e.ws.sockets[1].open();
  assert.deepEqual(subs(e.ws.sockets[1]), [{ t: 'sub', topic: T, cursor: 'c3', filter: paid, columns: ['status'] }]);
});

test('filter: over Server-Sent Events the filter and columns travel in the stream URL, beside the unfiltered topics', async () => {
  const f = fakeFetch();
  const e = env({ fetch: f.fetch, transport: 'sse', store: new MemoryCursorStore() });
  const c = new Client(e.opts);
  const got = [];
  c.subscribe(T, { filter: paid, columns: ['status'] }, { onError: (err) => got.push(err.code) });
  c.subscribe('public.items', { cursor: 'i1' }, {});
  await tick();
  assert.equal(f.calls.length, 1);
  const q = f.calls[0].url.searchParams;
  assert.deepEqual(q.getAll('topic'), [T, 'public.items']);
  assert.deepEqual(JSON.parse(q.get(`filter.${T}`)), paid);
  assert.deepEqual(JSON.parse(q.get(`columns.${T}`)), ['status']);
  assert.equal(q.get('filter.public.items'), null);
  assert.equal(q.get('columns.public.items'), null);
  assert.deepEqual(got, []);
  answer(f.calls[0], { status: 200 });
  await tick();
});
