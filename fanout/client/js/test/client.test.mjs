import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Client, Backoff, MemoryCursorStore, LocalStorageCursorStore, closeAction, SSEParser, VERSION, WalcastError } from '../dist/index.js';
import { env, change, jwt, tick, fakeFetch, answer } from './fakes.mjs';

const T = 'public.orders';

function connected(over = {}) {
  const e = env(over);
  const c = new Client(e.opts);
  return { ...e, c };
}

test('backoff: jittered, exponential, capped, reset', () => {
  let r = 0;
  const b = new Backoff({ initial: 100, max: 1000 }, () => r);
  assert.deepEqual([b.next(), b.next(), b.next(), b.next(), b.next(), b.next()], [50, 100, 200, 400, 500, 500]);
  r = 1;
  assert.equal(b.next(), 1000);
  b.reset();
  assert.equal(b.next(), 100);
  assert.throws(() => new Backoff({ initial: 0 }), /initial/);
});

test('close codes are classified as docs/sync.md says', () => {
  assert.equal(closeAction(4000), 'reconnect');
  assert.equal(closeAction(4099), 'reconnect');
  assert.equal(closeAction(1001), 'reconnect');
  assert.equal(closeAction(1013), 'reconnect');
  assert.equal(closeAction(1006), 'reconnect');
  assert.equal(closeAction(4100), 'new-token');
  assert.equal(closeAction(4150), 'new-token');
  assert.equal(closeAction(4400), 'give-up');
  assert.equal(closeAction(4429), 'give-up');
  assert.equal(closeAction(1008), 'give-up');
  assert.equal(closeAction(4999), 'reconnect');
});

test('version equals package.json', () => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url)));
  assert.equal(VERSION, pkg.version);
});

test('subscribe: sub frame with the stored cursor, changes once, cursors stored', async () => {
  const store = new MemoryCursorStore();
  store.set(T, 'c0');
  const { c, ws } = connected({ store });
  const got = [];
  c.subscribe(T, {}, { onChange: (ch, cur) => got.push([ch.seq, cur]) });
  await tick();
  const s = ws.sockets[0];
  assert.equal(s.token(), 'tok');
  assert.equal(new URL(s.url).pathname, '/v1/socket');
  assert.equal(new URL(s.url).protocol, 'ws:');
  s.open();
  assert.deepEqual(s.sent, [{ t: 'sub', topic: T, cursor: 'c0' }]);
  s.frame({ t: 'subscribed', topic: T, cursor: 'c0' });
  s.frame(change(T, 5, 'c5'));
  s.frame(change(T, 6, 'c6'));
  s.frame(change(T, 5, 'c5')); // a duplicate
  s.frame(change(T, 6, 'c6'));
  s.frame(change(T, 7, 'c7'));
  s.frame(change('public.other', 8, 'x')); // a topic we do not follow
  assert.deepEqual(got, [[5, 'c5'], [6, 'c6'], [7, 'c7']]);
  assert.equal(store.get(T), 'c7');
  s.frame({ t: 'position', topic: T, cursor: 'p9' });
  assert.equal(store.get(T), 'p9');
  assert.equal(c.cursor(T), 'p9');
});

test('replay-gap resubscribes from the last change; resync resets dedupe', async () => {
  const { c, ws } = connected();
  const ev = [];
  c.subscribe(T, {}, { onChange: (ch) => ev.push(ch.seq), onReplayGap: (cur) => ev.push('gap ' + cur), onResync: (cur) => ev.push('resync ' + cur) });
  await tick();
  const s = ws.sockets[0];
  s.open();
  s.frame({ t: 'subscribed', topic: T, cursor: 'c0' });
  s.frame(change(T, 10, 'c10'));
  s.frame({ t: 'replay-gap', topic: T, cursor: 'c9' });
  assert.deepEqual(s.sent.at(-1), { t: 'sub', topic: T, cursor: 'c10' });
  s.frame({ t: 'subscribed', topic: T, cursor: 'c10' });
  s.frame(change(T, 10, 'c10')); // replayed again: dropped
  s.frame(change(T, 11, 'c11'));
  s.frame({ t: 'resync', topic: T, cursor: 'r1' });
  assert.deepEqual(s.sent.at(-1), { t: 'sub', topic: T, cursor: 'r1' });
  s.frame(change(T, 3, 'c3')); // a new epoch reuses seqs
  assert.deepEqual(ev, [10, 'gap c9', 11, 'resync r1', 3]);
  assert.equal(c.cursor(T), 'c3');
});

test('reconnect after a dropped connection waits a jittered backoff and resumes', async () => {
  const { c, ws, clock, states } = connected({ backoff: { initial: 1000, max: 8000 } });
  c.subscribe(T, {}, {});
  await tick();
  ws.sockets[0].open();
  ws.sockets[0].frame(change(T, 4, 'c4'));
  ws.sockets[0].serverClose(1006);
  assert.equal(states.at(-1), 'waiting');
  assert.equal(clock.next(), 750); // [500, 1000] with random 0.5
  clock.advance(749);
  await tick();
  assert.equal(ws.sockets.length, 1);
  clock.advance(1);
  await tick();
  assert.equal(ws.sockets.length, 2);
  ws.sockets[1].fail(); // fails again: the delay doubles
  assert.equal(clock.next(), 1500);
  clock.advance(1500);
  await tick();
  ws.sockets[2].open();
  assert.deepEqual(ws.sockets[2].sent, [{ t: 'sub', topic: T, cursor: 'c4' }]);
});

test('4000 and 1013 reconnect; 4400 and 4429 give up with a clear error', async () => {
  for (const code of [4000, 1013, 1001]) {
    const { c, ws, clock } = connected();
    c.subscribe(T, {}, {});
    await tick();
    ws.sockets[0].open();
    ws.sockets[0].serverClose(code, 'x');
    clock.advance(60_000);
    await tick();
    assert.equal(ws.sockets.length, 2, `code ${code}`);
    c.close();
  }
  for (const code of [4400, 4429]) {
    const { c, ws, clock, errors, states } = connected();
    c.subscribe(T, {}, {});
    await tick();
    ws.sockets[0].open();
    ws.sockets[0].serverClose(code, 'rate limit exceeded');
    clock.advance(600_000);
    await tick();
    assert.equal(ws.sockets.length, 1);
    assert.equal(states.at(-1), 'failed');
    assert.ok(errors[0] instanceof WalcastError);
    assert.equal(errors[0].terminal, true);
    assert.equal(errors[0].code, code);
    assert.match(errors[0].message, new RegExp(`${code}.*not to reconnect`));
  }
});

test('4100 gets a new token and reconnects at once; a static token fails clearly', async () => {
  let n = 0;
  const { c, ws } = connected({ token: undefined, getToken: () => `t${++n}` });
  c.subscribe(T, {}, {});
  await tick();
  assert.equal(ws.sockets[0].token(), 't1');
  ws.sockets[0].open();
  ws.sockets[0].serverClose(4100, 'token expired');
  c['clock'].advance(0); // at once: no backoff
  await tick();
  assert.equal(ws.sockets.length, 2);
  assert.equal(ws.sockets[1].token(), 't2');

  const e = connected();
  e.c.subscribe(T, {}, {});
  await tick();
  e.ws.sockets[0].open();
  e.ws.sockets[0].serverClose(4100, 'token expired');
  assert.equal(e.errors[0].kind, 'token-expired');
  assert.match(e.errors[0].message, /getToken/);
});

test('the token is refreshed on the socket before exp', async () => {
  const { clock } = connected();
  const now = clock.now() / 1000;
  let n = 0;
  const tokens = [jwt({ exp: now + 300 }), jwt({ exp: now + 600 })];
  const e = connected({ token: undefined, getToken: () => tokens[n++], clock, silenceTimeout: 3_600_000 });
  e.c.subscribe(T, {}, {});
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  clock.advance(269_999);
  await tick();
  assert.equal(s.sent.filter((f) => f.t === 'refresh').length, 0);
  clock.advance(1);
  await tick();
  assert.deepEqual(s.sent.filter((f) => f.t === 'refresh'), [{ t: 'refresh', token: tokens[1] }]);
  s.frame({ t: 'refreshed', exp: now + 600 });
  assert.equal(e.ws.sockets.length, 1);
});

test('a token living longer than a timer can wait is refreshed once, near exp', async () => {
  const { clock } = connected();
  const day = 86_400_000;
  const now = clock.now() / 1000;
  let n = 0;
  const tokens = [jwt({ exp: now + 40 * 86_400 }), jwt({ exp: now + 80 * 86_400 })];
  // As browsers do: a delay above 2^31 - 1 ms fires at once.
  const set = clock.setTimeout.bind(clock);
  clock.setTimeout = (fn, ms) => set(fn, ms > 2 ** 31 - 1 ? 0 : ms);
  const e = connected({ token: undefined, getToken: () => tokens[n++], clock, pingInterval: day, silenceTimeout: 3 * day });
  e.c.subscribe(T, {}, {});
  await tick();
  const s = e.ws.sockets[0];
  s.open();
  const refreshes = () => s.sent.filter((f) => f.t === 'refresh').length;
  for (let d = 1; d < 40; d++) {
    clock.advance(day); // a ping a day, answered
    await tick();
    s.frame({ t: 'pong' });
    assert.equal(refreshes(), 0, `refreshed on day ${d}, 40 days before exp`);
  }
  clock.advance(day - 31_000);
  await tick();
  assert.equal(refreshes(), 0);
  clock.advance(2_000);
  await tick();
  assert.equal(refreshes(), 1);
  assert.equal(e.ws.sockets.length, 1);
});

test('pings every 15 s; a silent connection is reopened', async () => {
  const { c, ws, clock } = connected();
  c.subscribe(T, {}, {});
  await tick();
  const s = ws.sockets[0];
  s.open();
  clock.advance(15_000);
  assert.deepEqual(s.sent.at(-1), { t: 'ping' });
  s.frame({ t: 'pong' });
  clock.advance(30_000);
  assert.equal(s.sent.filter((f) => f.t === 'ping').length, 3);
  clock.advance(15_000); // 45 s after the pong: silent
  await tick();
  assert.ok(ws.sockets.length >= 1 && s.closedWith === 1000);
  clock.advance(1000);
  await tick();
  assert.equal(ws.sockets.length, 2);
});

test('a bad cursor is dropped and the topic starts over', async () => {
  const store = new MemoryCursorStore();
  store.set(T, 'forged');
  const { c, ws, errors } = connected({ store });
  let resyncs = 0;
  c.subscribe(T, {}, { onResync: () => resyncs++ });
  await tick();
  const s = ws.sockets[0];
  s.open();
  s.frame({ t: 'error', code: 'bad-cursor', message: 'cursor is malformed', topic: T });
  assert.deepEqual(s.sent.at(-1), { t: 'sub', topic: T });
  assert.equal(store.get(T), undefined);
  assert.equal(resyncs, 1);
  assert.equal(errors[0].code, 'bad-cursor');
});

test('unsubscribe sends unsub once the last handler leaves', async () => {
  const { c, ws } = connected();
  const a = c.subscribe(T, {}, {});
  const b = c.subscribe(T, {}, {});
  await tick();
  const s = ws.sockets[0];
  s.open();
  assert.equal(s.sent.filter((f) => f.t === 'sub').length, 1);
  a();
  assert.equal(s.sent.filter((f) => f.t === 'unsub').length, 0);
  b();
  assert.deepEqual(s.sent.at(-1), { t: 'unsub', topic: T });
});

test('offline closes; online reconnects at once', async () => {
  const listeners = {};
  const win = { addEventListener: (t, f) => (listeners[t] = f), removeEventListener: () => {} };
  const { c, ws, states } = connected({ window: win });
  c.subscribe(T, {}, {});
  await tick();
  ws.sockets[0].open();
  listeners.offline();
  assert.equal(states.at(-1), 'offline');
  assert.equal(ws.sockets[0].closedWith, 1000);
  listeners.online();
  await tick();
  assert.equal(ws.sockets.length, 2);
});

test('visibility: a waiting client reconnects when the page is shown', async () => {
  const listeners = {};
  const doc = { visibilityState: 'visible', addEventListener: (t, f) => (listeners[t] = f), removeEventListener: () => {} };
  const { c, ws } = connected({ document: doc, backoff: { initial: 60_000, max: 60_000 } });
  c.subscribe(T, {}, {});
  await tick();
  ws.sockets[0].fail();
  listeners.visibilitychange();
  await tick();
  assert.equal(ws.sockets.length, 2);
});

test('falls back to SSE when the socket cannot be opened, and tries the socket again on the next connect', async () => {
  const f = fakeFetch();
  const { c, ws } = connected({ fetch: f.fetch, transport: 'auto' });
  const got = [];
  c.subscribe(T, { cursor: 'c1' }, { onChange: (ch) => got.push(ch.seq) });
  await tick();
  ws.sockets[0].fail();
  await tick();
  assert.equal(f.calls.length, 1);
  const call = f.calls[0];
  assert.equal(call.url.pathname, '/v1/events');
  assert.deepEqual(call.url.searchParams.getAll('topic'), [T]);
  assert.deepEqual(call.url.searchParams.getAll('cursor'), ['c1']);
  assert.equal(call.headers.Authorization, 'Bearer tok');
  answer(call, { status: 200 });
  await tick();
  assert.equal(c.transport, 'sse');
  const ch = change(T, 2, 'c2');
  call.write(`id: c2\nevent: change\ndata: ${JSON.stringify(ch)}\n\n: heartbeat\n\n`);
  call.write(`id: c2\nevent: change\ndata: ${JSON.stringify(ch)}\n\n`);
  await tick();
  await tick();
  assert.deepEqual(got, [2]);
  call.write(`event: close\ndata: {"code":4000,"reason":"node shutting down"}\n\n`);
  call.end();
  await tick();
  await tick();
  c['clock'].advance(5000);
  await tick();
  assert.equal(ws.sockets.length, 2, 'one failed socket does not make SSE permanent');
  ws.sockets[1].fail();
  await tick();
  assert.equal(f.calls.length, 2);
  assert.deepEqual(f.calls[1].url.searchParams.getAll('cursor'), ['c2']);
});

test('after 3 sockets in a row fail where SSE works, SSE only; a probe socket moves back when sockets work again', async () => {
  const f = fakeFetch();
  const { c, ws, clock } = connected({ fetch: f.fetch, transport: 'auto', backoff: { initial: 100, max: 100 } });
  c.subscribe(T, { cursor: 'c1' }, {});
  await tick();
  for (let i = 0; i < 3; i++) {
    assert.equal(ws.sockets.length, i + 1);
    ws.sockets[i].fail();
    await tick();
    answer(f.calls[i], { status: 200 });
    await tick();
    await tick();
    assert.equal(c.transport, 'sse');
    f.calls[i].end(); // the stream drops
    await tick();
    await tick();
    clock.advance(100);
    await tick();
  }
  // Blocked: the reconnect goes straight to an event stream.
  assert.equal(ws.sockets.length, 3);
  assert.equal(f.calls.length, 4);
  answer(f.calls[3], { status: 200 });
  await tick();
  await tick();
  // Five minutes on the stream (its heartbeats keep it), then a probe socket.
  for (let t = 0; t < 20; t++) {
    f.calls[3].write(': heartbeat\n\n');
    await tick();
    clock.advance(15_000);
  }
  assert.equal(ws.sockets.length, 4, 'a probe socket after wsProbeInterval');
  ws.sockets[3].open();
  await tick();
  assert.equal(ws.sockets[3].closedWith, 1000, 'the probe is closed');
  assert.equal(ws.sockets.length, 5);
  ws.sockets[4].open();
  assert.equal(c.transport, 'websocket');
  assert.deepEqual(ws.sockets[4].sent, [{ t: 'sub', topic: T, cursor: 'c1' }]);
});

test('a quiet event stream is kept open by its heartbeats', async () => {
  const f = fakeFetch();
  const { c, clock } = connected({ fetch: f.fetch, transport: 'sse' });
  c.subscribe(T, {}, {});
  await tick();
  answer(f.calls[0], { status: 200 });
  await tick();
  await tick();
  for (let t = 0; t < 10; t++) {
    f.calls[0].write(': heartbeat\n\n');
    await tick();
    await tick();
    clock.advance(15_000);
    await tick();
  }
  assert.equal(f.calls.length, 1, 'the stream was reopened though the node sent its heartbeat every 15 s');
  assert.equal(c.transport, 'sse');
  clock.advance(45_000); // and silence still ends it
  await tick();
  await tick();
  clock.advance(1_000);
  await tick();
  await tick();
  assert.equal(f.calls.length, 2);
});

test('a socket that never opens is given up after the connect timeout', async () => {
  const { c, ws, clock, states } = connected({ backoff: { initial: 100, max: 100 } });
  c.subscribe(T, {}, {});
  await tick();
  assert.equal(ws.sockets.length, 1);
  clock.advance(9_999);
  await tick();
  assert.equal(ws.sockets[0].closedWith, undefined);
  clock.advance(1);
  await tick();
  assert.equal(ws.sockets[0].closedWith, 1000);
  assert.equal(states.at(-1), 'waiting');
  clock.advance(100);
  await tick();
  assert.equal(ws.sockets.length, 2);
  ws.sockets[1].open();
  assert.equal(c.state, 'open');
  clock.advance(20_000); // an open socket is not timed out
  assert.equal(ws.sockets[1].closedWith, undefined);
});

test('transport auto: a socket that hangs falls back to SSE after the connect timeout', async () => {
  const f = fakeFetch();
  const { c, ws, clock } = connected({ fetch: f.fetch, transport: 'auto' });
  c.subscribe(T, {}, {});
  await tick();
  clock.advance(10_000);
  await tick();
  assert.equal(ws.sockets[0].closedWith, 1000);
  assert.equal(f.calls.length, 1);
});

test('SSE refusals: 401 is terminal and says why', async () => {
  const f = fakeFetch();
  const { c, errors, states } = connected({ fetch: f.fetch, transport: 'sse' });
  c.subscribe(T, {}, {});
  await tick();
  answer(f.calls[0], { status: 401, text: 'token expired' });
  await tick();
  await tick();
  assert.equal(states.at(-1), 'failed');
  assert.equal(errors[0].kind, 'unauthorized');
  assert.match(errors[0].message, /401: token expired/);
});

test('SSE parser: CRLF, CR, multi-line data, comments, ids', () => {
  const ev = [];
  const p = new SSEParser((type, data, id) => ev.push([type, data, id]));
  p.push('id: a\r\nevent: change\r\ndata: {"x":\r\ndata: 1}\r\n\r\n: comment\n\nda');
  p.push('ta: plain\r');
  p.push('\r');
  p.push('\n'); // the CR could have been half of a CRLF
  assert.deepEqual(ev, [['change', '{"x":\n1}', 'a'], ['message', 'plain', 'a']]);
});

test('localStorage adapter', () => {
  const m = new Map();
  const storage = { getItem: (k) => m.get(k) ?? null, setItem: (k, v) => m.set(k, v), removeItem: (k) => m.delete(k) };
  const s = new LocalStorageCursorStore({ storage, prefix: 'p:' });
  s.set(T, 'c1');
  assert.equal(m.get('p:' + T), 'c1');
  assert.equal(s.get(T), 'c1');
  s.delete(T);
  assert.equal(s.get(T), undefined);
  assert.throws(() => new LocalStorageCursorStore(), /no localStorage/);
});

const subs = (s) => s.sent.filter((f) => f.t === 'sub');

test('rate-limited: the topic is subscribed again after the node\'s retryAfter', async () => {
  const { c, ws, clock, errors } = connected({ backoff: { initial: 100, max: 1000 } });
  const ev = [];
  c.subscribe(T, { snapshot: true }, { onError: (e) => ev.push(e.code) });
  await tick();
  const s = ws.sockets[0];
  s.open();
  s.frame({ t: 'error', code: 'rate-limited', topic: T, retryAfter: 7, message: 'too many snapshots from this client; the topic is not subscribed; subscribe again after 7 s' });
  assert.deepEqual(ev, ['rate-limited']);
  assert.match(errors[0].message, /rate-limited on public\.orders: .*subscribes again in 7 s/);
  clock.advance(6_999);
  assert.equal(subs(s).length, 1, 'not before the node said');
  clock.advance(1);
  assert.deepEqual(subs(s), [{ t: 'sub', topic: T, snapshot: true }, { t: 'sub', topic: T, snapshot: true }]);
});

test('rate-limited over SSE: the stream is reopened with the topic after retryAfter', async () => {
  const f = fakeFetch();
  const { c, clock } = connected({ transport: 'sse', fetch: f.fetch });
  c.subscribe(T, { snapshot: true }, {});
  await tick();
  answer(f.calls[0], { status: 200 });
  await tick();
  await tick();
  f.calls[0].write(`event: node-error\ndata: ${JSON.stringify({ t: 'error', code: 'rate-limited', topic: T, retryAfter: 3, message: 'subscribe again after 3 s' })}\n\n`);
  await tick();
  await tick();
  clock.advance(2_999);
  await tick();
  assert.equal(f.calls.length, 1);
  clock.advance(1);
  await tick();
  await tick();
  assert.equal(f.calls.length, 2);
  assert.deepEqual(f.calls[1].url.searchParams.getAll('snapshot'), [T]);
});

test('snapshot-failed: the snapshot is asked for again, with a growing delay', async () => {
  const { c, ws, clock } = connected({ backoff: { initial: 1000, max: 60_000 } });
  c.subscribe(T, { snapshot: true }, {});
  await tick();
  const s = ws.sockets[0];
  s.open();
  const failed = { t: 'error', code: 'snapshot-failed', topic: T, message: 'the table changed under the catalog; subscribe again in a few seconds' };
  s.frame({ t: 'snapshot-begin', topic: T });
  s.frame(failed);
  assert.equal(clock.next(), 750); // [500, 1000] with random 0.5
  clock.advance(750);
  assert.equal(subs(s).length, 2);
  assert.deepEqual(subs(s)[1], { t: 'sub', topic: T, snapshot: true });
  s.frame(failed);
  assert.equal(clock.next(), 1500);
  clock.advance(1500);
  assert.equal(subs(s).length, 3);
  // A snapshot that ends resets the delay.
  s.frame({ t: 'snapshot-begin', topic: T });
  s.frame({ t: 'snapshot-end', topic: T, cursor: 's1' });
  s.frame({ t: 'resync', topic: T, cursor: 'r1' });
  s.frame(failed);
  assert.equal(clock.next(), 750);
});

test('snapshot-unavailable: the topic is followed without a snapshot, and the error says so', async () => {
  const store = new MemoryCursorStore();
  store.set(T, 'c0');
  const { c, ws, errors } = connected({ store });
  c.subscribe(T, { snapshot: true }, {});
  await tick();
  const s = ws.sockets[0];
  s.open();
  assert.deepEqual(subs(s), [{ t: 'sub', topic: T, snapshot: true }]);
  s.frame({ t: 'error', code: 'snapshot-unavailable', topic: T, message: 'this node serves no snapshots' });
  assert.deepEqual(subs(s)[1], { t: 'sub', topic: T, cursor: 'c0' });
  assert.equal(errors[0].code, 'snapshot-unavailable');
  assert.match(errors[0].message, /without its current rows.*--database-url/);
  // A reconnect does not ask for it again.
  s.serverClose(1006);
  c['clock'].advance(60_000);
  await tick();
  ws.sockets[1].open();
  assert.deepEqual(subs(ws.sockets[1]), [{ t: 'sub', topic: T, cursor: 'c0' }]);
});

test('backoff grows while the node accepts and closes at once; it starts over after 10 s open', async () => {
  const { c, ws, clock } = connected({ backoff: { initial: 1000, max: 30_000 } });
  c.subscribe(T, {}, {});
  await tick();
  const delays = [];
  for (let i = 0; i < 4; i++) {
    const s = ws.sockets[i];
    s.open();
    s.frame({ t: 'subscribed', topic: T, cursor: 'c0' });
    s.serverClose(i % 2 ? 4000 : 1013, 'try later');
    delays.push(clock.next());
    clock.advance(clock.next());
    await tick();
  }
  assert.deepEqual(delays, [750, 1500, 3000, 6000]);
  const s = ws.sockets[4];
  s.open();
  s.frame({ t: 'subscribed', topic: T, cursor: 'c0' });
  clock.advance(10_000);
  s.frame({ t: 'pong' });
  s.serverClose(1006);
  assert.equal(clock.next(), 750);
});

test('transport auto: sockets that fail while the node is unreachable do not count toward SSE only', async () => {
  const f = fakeFetch();
  const { c, ws, clock } = connected({ fetch: f.fetch, transport: 'auto', backoff: { initial: 100, max: 100 } });
  c.subscribe(T, {}, {});
  await tick();
  for (let i = 0; i < 3; i++) {
    ws.sockets[i].fail();
    await tick();
    answer(f.calls[i], { status: 503, text: 'overloaded', headers: { 'Retry-After': '1' } });
    await tick();
    await tick();
    clock.advance(1000);
    await tick();
  }
  // The node is back; something drops this one socket, the stream works.
  ws.sockets[3].fail();
  await tick();
  answer(f.calls[3], { status: 200 });
  await tick();
  await tick();
  f.calls[3].end();
  await tick();
  await tick();
  clock.advance(100);
  await tick();
  assert.equal(ws.sockets.length, 5, 'a socket is tried again: one failed where the stream worked');
});

test('forbidden: the topic is left and the error says what to fix', async () => {
  const { c, ws, errors, clock } = connected();
  c.subscribe(T, {}, {});
  await tick();
  const s = ws.sockets[0];
  s.open();
  s.frame({ t: 'error', code: 'forbidden', topic: T, message: 'topic not in the token' });
  assert.match(errors[0].message, /forbidden on public\.orders: topic not in the token; the client left the topic \(get a token whose topics claim grants it, then subscribe again\)/);
  assert.equal(c.cursor(T), undefined);
  clock.advance(600_000);
  assert.equal(subs(s).length, 1);
});

test('transactions: changes held until the end frame, then delivered together with onTransaction; the cursor is stored only at the end', async () => {
  const store = new MemoryCursorStore();
  const { c, ws } = connected({ store });
  const got = [];
  c.subscribe(T, {}, {
    onChange: (ch, cur) => got.push(['change', ch.seq, cur]),
    onTransaction: (chs, cur) => got.push(['txn', chs.map((ch) => ch.seq), cur]),
  });
  await tick();
  const s = ws.sockets[0];
  s.open();
  s.frame({ t: 'subscribed', topic: T, cursor: 'c0' });
  s.frame(change(T, 1, undefined, { commitLsn: '0/10' }));
  s.frame(change(T, 2, undefined, { commitLsn: '0/10' }));
  await tick();
  assert.deepEqual(got, [], 'nothing of a transaction before its end');
  assert.equal(store.get(T), 'c0');
  s.frame(change(T, 3, 'c3', { commitLsn: '0/10' }));
  assert.deepEqual(got, [['change', 1, undefined], ['change', 2, undefined], ['change', 3, 'c3'], ['txn', [1, 2, 3], 'c3']]);
  assert.equal(store.get(T), 'c3');
});

test('transactions: a connection lost mid-transaction drops the partial one and resumes from the last boundary', async () => {
  const { c, ws, clock } = connected();
  const got = [];
  c.subscribe(T, {}, { onTransaction: (chs, cur) => got.push([chs.map((ch) => ch.seq), cur]) });
  await tick();
  ws.sockets[0].open();
  ws.sockets[0].frame(change(T, 4, 'c4'));
  ws.sockets[0].frame(change(T, 5, undefined));
  ws.sockets[0].serverClose(1006);
  clock.advance(clock.next());
  await tick();
  const s = ws.sockets[1];
  s.open();
  assert.deepEqual(s.sent, [{ t: 'sub', topic: T, cursor: 'c4' }]);
  // The node replays the transaction whole: 5 is not a duplicate.
  s.frame(change(T, 5, undefined));
  s.frame(change(T, 6, 'c6'));
  assert.deepEqual(got, [[[4], 'c4'], [[5, 6], 'c6']]);
  // So does a replay-gap.
  s.frame(change(T, 7, undefined));
  s.frame({ t: 'replay-gap', topic: T, cursor: 'c6' });
  assert.deepEqual(s.sent.at(-1), { t: 'sub', topic: T, cursor: 'c6' });
  s.frame(change(T, 7, undefined));
  s.frame(change(T, 8, 'c8'));
  assert.deepEqual(got.at(-1), [[7, 8], 'c8']);
});

test('transactions: one larger than maxTxnChanges is never delivered in part: its end is a resync', async () => {
  const { c, ws } = connected({ maxTxnChanges: 3 });
  const got = [];
  c.subscribe(T, {}, { onChange: (ch) => got.push(ch.seq), onResync: (cur) => got.push('resync ' + cur) });
  await tick();
  const s = ws.sockets[0];
  s.open();
  for (let seq = 1; seq <= 5; seq++) s.frame(change(T, seq, undefined));
  s.frame(change(T, 6, 'c6'));
  s.frame(change(T, 7, undefined));
  s.frame(change(T, 8, 'c8'));
  assert.deepEqual(got, ['resync c6', 7, 8]);
  assert.equal(c.cursor(T), 'c8');
});
