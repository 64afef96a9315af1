// Fakes for the unit tests: a clock whose time moves only when told, a
// WebSocket that records what is sent and lets the test play the node, and
// a fetch that serves a scripted event stream.

export class FakeClock {
  constructor(start = 1_700_000_000_000) {
    this.t = start;
    this.timers = [];
    this.seq = 0;
  }
  now() {
    return this.t;
  }
  setTimeout(fn, ms) {
    const h = { at: this.t + ms, fn, id: this.seq++ };
    this.timers.push(h);
    return h;
  }
  clearTimeout(h) {
    this.timers = this.timers.filter((x) => x !== h);
  }
  /** Runs every timer due within ms, in time order. */
  advance(ms) {
    const end = this.t + ms;
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at || a.id - b.id);
      const h = this.timers[0];
      if (!h || h.at > end) break;
      this.timers.shift();
      this.t = h.at;
      h.fn();
    }
    this.t = end;
  }
  /** The delay of the earliest pending timer. */
  next() {
    if (this.timers.length === 0) return undefined;
    return Math.min(...this.timers.map((h) => h.at)) - this.t;
  }
}

export function fakeWebSocket() {
  const sockets = [];
  class FakeWS {
    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.sent = [];
      this.onopen = this.onmessage = this.onclose = this.onerror = null;
      sockets.push(this);
    }
    send(s) {
      this.sent.push(JSON.parse(s));
    }
    close(code = 1000, reason = '') {
      if (this.readyState === 3) return;
      this.readyState = 3;
      this.closedWith = code;
      this.onclose?.({ code, reason });
    }
    // The node's side:
    open() {
      this.readyState = 1;
      this.onopen?.({});
    }
    frame(f) {
      this.onmessage?.({ data: JSON.stringify(f) });
    }
    serverClose(code, reason = '') {
      this.readyState = 3;
      this.onclose?.({ code, reason });
    }
    fail() {
      this.readyState = 3;
      this.onerror?.({});
      this.onclose?.({ code: 1006, reason: '' });
    }
    token() {
      return new URL(this.url).searchParams.get('access_token');
    }
  }
  return { WebSocket: FakeWS, sockets };
}

/** A fetch answering /v1/events with status and a stream the test writes to. */
export function fakeFetch() {
  const calls = [];
  const fetch = async (url, init) => {
    let ctrl;
    const body = new ReadableStream({
      start(c) {
        ctrl = c;
      },
    });
    const call = { url: new URL(url), headers: init.headers, signal: init.signal };
    calls.push(call);
    await new Promise((resolve) => (call.respond = resolve));
    const { status, text = '', headers = {} } = call.response;
    init.signal.addEventListener('abort', () => {
      try {
        ctrl.error(new Error('aborted'));
      } catch {}
    });
    call.write = (s) => ctrl.enqueue(new TextEncoder().encode(s));
    call.end = () => ctrl.close();
    return {
      status,
      ok: status >= 200 && status < 300,
      headers: { get: (k) => headers[k] ?? null },
      body: status === 200 ? body : null,
      text: async () => text,
    };
  };
  return { fetch, calls };
}

export function answer(call, response) {
  call.response = response;
  call.respond();
}

/** A JWT-shaped token (unsigned: the client only reads exp). */
export function jwt(claims) {
  const b = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  return `${b({ alg: 'HS256' })}.${b(claims)}.sig`;
}

/** Lets promise callbacks (getToken, fetch) run. */
export const tick = () => new Promise((r) => setTimeout(r, 0));

export function env(over = {}) {
  const clock = new FakeClock();
  const ws = fakeWebSocket();
  const errors = [];
  const states = [];
  return {
    clock,
    ws,
    errors,
    states,
    opts: {
      url: 'http://node.test:8080',
      token: 'tok',
      WebSocket: ws.WebSocket,
      clock,
      random: () => 0.5,
      transport: 'websocket',
      window: null,
      document: null,
      onError: (e) => errors.push(e),
      onState: (s) => states.push(s),
      ...over,
    },
  };
}

export function change(topic, seq, cursor, extra = {}) {
  return { t: 'change', topic, cursor, end: cursor !== undefined, change: { seq, op: 'insert', key: { id: seq }, after: { id: seq }, lsn: '0/1', commitLsn: '0/1', xid: 1, commitTime: '', ...extra } };
}
