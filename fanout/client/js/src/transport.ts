import type { ClientFrame, ServerFrame } from './frames.js';

/** The part of the WebSocket API the client uses (browsers, Node 22, `ws`). */
export interface WebSocketLike {
  readonly readyState: number;
  onopen: Handler<unknown> | null;
  onmessage: Handler<{ data: unknown }> | null;
  onclose: Handler<{ code: number; reason: string }> | null;
  onerror: Handler<unknown> | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}
export type WebSocketCtor = new (url: string) => WebSocketLike;

/**
 * An event handler property, checked like a method parameter (bivariantly),
 * so the browser's WebSocket — whose handlers take an Event, a MessageEvent,
 * a CloseEvent — and subclasses of it are WebSocketLike.
 */
type Handler<E> = { bivarianceHack(ev: E): void }['bivarianceHack'];

/** fetch, as browsers and Node 18+ have it. */
export type FetchLike = (url: string, init: { headers: Record<string, string>; signal: AbortSignal }) => Promise<{
  status: number;
  ok: boolean;
  headers: { get(name: string): string | null };
  body: ReadableStream<Uint8Array> | null;
  text(): Promise<string>;
}>;

/** How a connection ended. */
export interface ConnEnd {
  /** The close code: the node's, 1006 for a dropped connection, or 1000 when we closed. */
  code: number;
  reason: string;
  /** Whether the connection was ever open (the handshake passed). */
  opened: boolean;
  /** The HTTP status of a refused handshake, when the transport can see it (SSE). */
  status?: number;
  /** Retry-After of a refused handshake, in seconds. */
  retryAfter?: number;
}

export interface ConnEvents {
  open(): void;
  frame(f: ServerFrame): void;
  /** The node said something that is not a frame: an SSE comment (its heartbeat). */
  alive?(): void;
  end(e: ConnEnd): void;
}

/** One connection to the node. */
export interface Conn {
  readonly kind: 'websocket' | 'sse';
  /** Sends a frame; SSE streams cannot (they reopen instead) and return false. */
  send(f: ClientFrame): boolean;
  close(): void;
}

/** A subscription as an SSE stream asks for it in its URL. */
export interface StreamTopic {
  topic: string;
  cursor?: string;
  snapshot?: boolean;
  /** The subscription's filter (docs/filters.md) and column list, if any. */
  filter?: unknown;
  columns?: readonly string[];
}

/** socketURL is base's /v1/socket with the token as access_token. */
export function socketURL(base: string, token: string): string {
  const u = new URL('/v1/socket', base);
  u.protocol = u.protocol === 'https:' || u.protocol === 'wss:' ? 'wss:' : 'ws:';
  // Browsers cannot set headers on a WebSocket: the node accepts the token
  // as access_token and redacts it from its logs.
  u.searchParams.set('access_token', token);
  return u.toString();
}

/**
 * eventsURL is base's /v1/events for topics (the token goes in a header).
 * A topic whose snapshot is wanted goes without its cursor: given one the
 * node resumes from it and takes no snapshot (docs/sync.md), as a `sub`
 * frame with both would.
 */
export function eventsURL(base: string, topics: StreamTopic[]): string {
  const u = new URL('/v1/events', base);
  u.protocol = u.protocol === 'wss:' || u.protocol === 'https:' ? 'https:' : 'http:';
  for (const t of topics) u.searchParams.append('topic', t.topic);
  for (const t of topics) if (t.cursor && !t.snapshot) u.searchParams.append('cursor', t.cursor);
  for (const t of topics) if (t.snapshot) u.searchParams.append('snapshot', t.topic);
  // A filtered topic's filter and columns, as the node reads them for an
  // event stream (filter.<topic>, columns.<topic> as a JSON array).
  for (const t of topics) {
    if (t.filter !== undefined) u.searchParams.append(`filter.${t.topic}`, JSON.stringify(t.filter));
    if (t.columns !== undefined) u.searchParams.append(`columns.${t.topic}`, JSON.stringify(t.columns));
  }
  return u.toString();
}

/** openWebSocket connects to /v1/socket. */
export function openWebSocket(WS: WebSocketCtor, url: string, ev: ConnEvents): Conn {
  const ws = new WS(url);
  let opened = false;
  let ended = false;
  const end = (e: ConnEnd) => {
    if (ended) return;
    ended = true;
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    ev.end(e);
  };
  ws.onopen = () => {
    opened = true;
    ev.open();
  };
  ws.onmessage = (m) => {
    if (typeof m.data !== 'string') return; // the node sends text frames only
    let f: ServerFrame;
    try {
      f = JSON.parse(m.data) as ServerFrame;
    } catch {
      return;
    }
    ev.frame(f);
  };
  ws.onclose = (c) => end({ code: c.code, reason: c.reason, opened });
  // An error is followed by close; a socket that never opens nor closes is
  // ended by the client's connect timeout (ClientOptions.connectTimeout).
  ws.onerror = () => {};
  return {
    kind: 'websocket',
    send(f) {
      if (ws.readyState !== 1) return false;
      ws.send(JSON.stringify(f));
      return true;
    },
    close() {
      try {
        ws.close(1000);
      } catch {
        // already closing
      }
      end({ code: 1000, reason: 'closed by the client', opened });
    },
  };
}

/**
 * SSEParser turns text/event-stream bytes into events (the WHATWG
 * algorithm: lines end with CRLF, LF or CR; `data` lines join with LF;
 * a blank line dispatches; lines starting with ':' are comments).
 */
export class SSEParser {
  private buf = '';
  private data: string[] = [];
  private event = '';
  private id: string | undefined;
  private readonly decoder = new TextDecoder();
  /** The last event id seen (Last-Event-ID), if any. */
  lastEventId: string | undefined;

  /** onComment, when given, is called with each comment's text (a heartbeat). */
  constructor(
    private readonly onEvent: (type: string, data: string, id: string | undefined) => void,
    private readonly onComment?: (text: string) => void,
  ) {}

  push(chunk: Uint8Array | string): void {
    this.buf += typeof chunk === 'string' ? chunk : this.decoder.decode(chunk, { stream: true });
    for (;;) {
      const m = /\r\n|\n|\r/.exec(this.buf);
      if (!m) return;
      // A CR at the very end may be the first half of a CRLF: wait.
      if (m[0] === '\r' && m.index === this.buf.length - 1) return;
      const line = this.buf.slice(0, m.index);
      this.buf = this.buf.slice(m.index + m[0].length);
      this.line(line);
    }
  }

  private line(line: string): void {
    if (line === '') {
      if (this.id !== undefined) this.lastEventId = this.id;
      if (this.data.length > 0) this.onEvent(this.event || 'message', this.data.join('\n'), this.lastEventId);
      this.data = [];
      this.event = '';
      this.id = undefined;
      return;
    }
    if (line.startsWith(':')) {
      this.onComment?.(line.slice(1).trimStart());
      return;
    }
    const i = line.indexOf(':');
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? '' : line.slice(i + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    switch (field) {
      case 'data':
        this.data.push(value);
        break;
      case 'event':
        this.event = value;
        break;
      case 'id':
        if (!value.includes('\0')) this.id = value;
        break;
    }
  }
}

/**
 * openEventStream reads GET /v1/events with fetch (not EventSource: fetch
 * can send the token in a header and sees the status of a refusal). Every
 * event's data is the frame the socket would have sent; a `close` event
 * carries the code and reason the socket would have closed with.
 */
export function openEventStream(fetchFn: FetchLike, url: string, token: string, lastEventId: string | undefined, ev: ConnEvents): Conn {
  const ac = new AbortController();
  let opened = false;
  let ended = false;
  let closeFrame: { code: number; reason: string } | undefined;
  const end = (e: ConnEnd) => {
    if (ended) return;
    ended = true;
    ac.abort();
    ev.end(e);
  };
  const headers: Record<string, string> = { Authorization: `Bearer ${token}`, Accept: 'text/event-stream' };
  if (lastEventId) headers['Last-Event-ID'] = lastEventId;
  const parser = new SSEParser((type, data) => {
    if (ended) return;
    let f: unknown;
    try {
      f = JSON.parse(data);
    } catch {
      return;
    }
    if (type === 'close') {
      closeFrame = f as { code: number; reason: string };
      return;
    }
    ev.frame(f as ServerFrame);
  }, () => {
    // The node's heartbeat (its socket's pong): the stream is alive.
    if (!ended) ev.alive?.();
  });
  (async () => {
    let res;
    try {
      res = await fetchFn(url, { headers, signal: ac.signal });
    } catch {
      end({ code: 1006, reason: 'event stream could not be opened', opened: false });
      return;
    }
    if (!res.ok || !res.body) {
      let reason = '';
      try {
        reason = (await res.text()).trim();
      } catch {
        // no body
      }
      const ra = Number(res.headers.get('Retry-After'));
      end({ code: 1006, reason, opened: false, status: res.status, retryAfter: Number.isFinite(ra) && ra > 0 ? ra : undefined });
      return;
    }
    opened = true;
    ev.open();
    const reader = res.body.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        if (ended) return;
        parser.push(value);
      }
    } catch {
      // aborted or dropped
    }
    const c = closeFrame;
    end(c ? { code: c.code, reason: c.reason, opened } : { code: 1006, reason: 'event stream ended', opened });
  })();
  return {
    kind: 'sse',
    send() {
      return false;
    },
    close() {
      end({ code: 1000, reason: 'closed by the client', opened });
    },
  };
}
