import { Backoff, type BackoffOptions } from './backoff.js';
import { closeAction, type ClientFrame, type Envelope, type Filter, type Row, type ServerFrame } from './frames.js';
import { MemoryCursorStore, type CursorStore } from './store.js';
import { WalcastError } from './errors.js';
import { live, type LiveOptions, type LiveTable } from './live.js';
import {
  eventsURL,
  openEventStream,
  openWebSocket,
  socketURL,
  type Conn,
  type ConnEnd,
  type ConnEvents,
  type FetchLike,
  type StreamTopic,
  type WebSocketCtor,
} from './transport.js';

/** Timers the client uses; tests pass a fake. Times in milliseconds. */
export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const realClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
};

/** Where online/offline and visibility events come from (window, document). */
export interface EventSourceTarget {
  addEventListener(type: string, fn: () => void): void;
  removeEventListener(type: string, fn: () => void): void;
}

export interface ClientOptions {
  /** The node's base URL: http(s):// or ws(s)://host:port. */
  url: string;
  /** A token, or a function that returns one (called again before exp and after 4100). */
  token?: string;
  getToken?: () => string | Promise<string>;
  /** A WebSocket implementation (default: the global one; pass `ws` on Node 20). */
  WebSocket?: WebSocketCtor;
  /** fetch for the Server-Sent Events fallback (default: the global one). */
  fetch?: FetchLike;
  /** 'auto' (WebSocket, falling back to SSE when it cannot be opened), 'websocket' or 'sse'. */
  transport?: 'auto' | 'websocket' | 'sse';
  /** Where cursors are kept (default: memory). */
  store?: CursorStore;
  backoff?: BackoffOptions;
  /** Ping interval (default 15 s, as docs/sync.md asks). */
  pingInterval?: number;
  /** Refresh the token this long before exp (default 30 s). */
  refreshBefore?: number;
  /**
   * A connection that says nothing for this long is dropped and reopened
   * (default 45 s). Frames and an event stream's heartbeat comments count.
   */
  silenceTimeout?: number;
  /**
   * The backoff starts over once a connection has stayed open this long
   * (default 10 s): a node that accepts and then closes (1013, 4000) is
   * retried ever more slowly.
   */
  healthyAfter?: number;
  /** A connection not open this long after it was started is given up and retried (default 10 s). */
  connectTimeout?: number;
  /**
   * transport 'auto': after this many WebSockets in a row that could not be
   * opened where an event stream could, the client opens event streams
   * only (default 3) …
   */
  wsBlockAfter?: number;
  /** … and, while on an event stream, tries a WebSocket again this often (default 5 min). */
  wsProbeInterval?: number;
  /**
   * The most changes the client holds for one topic while it waits for the
   * end of a transaction (default 100,000). A larger transaction is not
   * delivered: at its end the topic gets onResync (and, subscribed with a
   * snapshot, a fresh snapshot), as if the node had asked for one.
   */
  maxTxnChanges?: number;
  /** Called on every error; terminal ones also stop the client. */
  onError?: (err: WalcastError) => void;
  /** Called on every state change. */
  onState?: (state: ClientState, transport: 'websocket' | 'sse' | undefined) => void;
  /** Events `online`/`offline` (default: globalThis when it has addEventListener). */
  window?: EventSourceTarget;
  /** `visibilitychange` and `visibilityState` (default: globalThis.document). */
  document?: EventSourceTarget & { visibilityState?: string };
  clock?: Clock;
  random?: () => number;
}

export type ClientState = 'connecting' | 'open' | 'waiting' | 'offline' | 'closed' | 'failed';

/**
 * Callbacks of one subscription; R is the row type of the topic's table
 * (default Row, any column map).
 */
export interface Handlers<R extends object = Row> {
  /**
   * A change, once, in order (duplicates by seq are dropped). Changes come
   * a whole transaction at a time: the client holds a transaction's
   * changes until its last one arrives, then calls onChange for each, back
   * to back in one task, then onTransaction. cursor is the cursor after
   * the transaction, set only on its last change (undefined on the others
   * and on a snapshot's own changes).
   */
  onChange?(change: Envelope<R>, cursor: string | undefined): void;
  /**
   * A whole transaction of the topic (its changes in this client's scope,
   * in order) and the cursor after it: called once per transaction, after
   * its onChange calls. Not called for the changes inside a snapshot,
   * which onSnapshotEnd completes.
   */
  onTransaction?(changes: Envelope<R>[], cursor: string): void;
  /** The node confirmed the subscription; the stream starts after cursor. */
  onSubscribed?(cursor: string): void;
  /** The topic's state must be read again; changes continue after cursor. */
  onResync?(cursor: string | undefined): void;
  /** Frames were dropped; the client resubscribes from its cursor by itself. */
  onReplayGap?(cursor: string): void;
  /** A snapshot starts: rows follow, then onSnapshotEnd. */
  onSnapshotBegin?(): void;
  /** A row of the snapshot (an envelope with op "read"). */
  onRow?(row: Envelope<R>): void;
  onSnapshotEnd?(cursor: string): void;
  /** A node error frame about this topic (forbidden, bad-topic, bad-filter …). */
  onError?(err: WalcastError): void;
}

export interface SubscribeOptions {
  /** Resume after this cursor (default: the store's, else from now). */
  cursor?: string;
  /** Deliver the topic's current rows first (DESIGN §6 state). */
  snapshot?: boolean;
  /**
   * Receive only the rows this filter matches (docs/filters.md). A row that
   * stops matching arrives as a removal: a change with op 'delete', its old
   * key in key and before, and left: 'filter'. The filter is sent again with
   * every resubscription (reconnects, replay gaps, fresh snapshots), as the
   * node binds a topic's cursors to the filter and columns they were issued
   * under. A filter the node refuses is reported as a WalcastError with code
   * 'bad-filter' (onError), and the topic is left. Over Server-Sent Events
   * the filter and columns travel in the stream's URL.
   */
  filter?: Filter;
  /**
   * The published columns wanted of each row (default: every column); the
   * key columns are always included, and [] asks for the key columns only.
   */
  columns?: readonly string[];
}

interface TopicState {
  topic: string;
  handlers: Set<Handlers>;
  cursor?: string;
  lastSeq: number;
  snapshot: boolean;
  /** Whether the snapshot still has to be asked for (first sub, resync). */
  wantSnapshot: boolean;
  /** Between snapshot-begin and snapshot-end. */
  inSnapshot: boolean;
  /** The transaction being received: its changes so far (until its end frame). */
  txn: Envelope[];
  /** The transaction went over maxTxnChanges: its changes are dropped until its end. */
  txnOver: boolean;
  /** The seq of the last change of the last whole transaction (lastSeq goes back to it when a partial one is dropped). */
  endSeq: number;
  /** Delays of resubscriptions after the node ended the topic's subscription. */
  retry: Backoff;
  retryTimer?: unknown;
  /** The subscription's filter and columns, sent with every sub (undefined: none). */
  filter?: Filter;
  columns?: string[];
  /** filter and columns as one string, to tell views apart. */
  view: string;
}

/** viewOf is a subscription's filter and columns as one string ('' for neither). */
function viewOf(filter: Filter | undefined, columns: readonly string[] | undefined): string {
  if (filter === undefined && columns === undefined) return '';
  return JSON.stringify([filter ?? null, columns ?? null]);
}

/**
 * Client is a connection to a walcast sync node that keeps its
 * subscriptions across reconnects: it resumes every topic from its cursor,
 * drops duplicates by seq, follows replay-gap and resync frames, refreshes
 * its token before exp and falls back to Server-Sent Events when a
 * WebSocket cannot be opened.
 */
export class Client {
  private readonly opts: ClientOptions;
  private readonly clock: Clock;
  private readonly store: CursorStore;
  private readonly backoff: Backoff;
  private readonly topics = new Map<string, TopicState>();
  private conn: Conn | undefined;
  private token: string | undefined;
  private tokenStale = false;
  private stateValue: ClientState = 'closed';
  private started = false;
  private stopped = false;
  /** Whether to open event streams only (transport 'auto'; see wsBlockAfter). */
  private wsBlocked = false;
  /** WebSockets in a row that could not be opened. */
  private wsFailures = 0;
  /** A WebSocket opened beside an event stream to learn whether sockets work again. */
  private probe: Conn | undefined;
  private probeTimer: unknown;
  private connectTimer: unknown;
  private timers = new Set<unknown>();
  private retryTimer: unknown;
  private pingTimer: unknown;
  private refreshTimer: unknown;
  private silenceTimer: unknown;
  private reopenQueued = false;
  private healthyTimer: unknown;
  private generation = 0;
  private readonly onOnline = () => this.wake();
  private readonly onOffline = () => this.goOffline();
  private readonly onVisible = () => {
    if (this.opts.document?.visibilityState !== 'hidden') this.wake();
  };

  constructor(opts: ClientOptions) {
    if (!opts.url) throw new WalcastError('config', 'walcast: url is required (the sync node, e.g. https://sync.example.com)', { terminal: true });
    if (!opts.token && !opts.getToken) {
      throw new WalcastError('config', 'walcast: give token or getToken', { terminal: true });
    }
    const g = globalThis as { addEventListener?: unknown; document?: unknown };
    this.opts = {
      window: typeof g.addEventListener === 'function' ? (globalThis as unknown as EventSourceTarget) : undefined,
      document: g.document as ClientOptions['document'],
      ...opts,
    };
    this.clock = opts.clock ?? realClock;
    this.store = opts.store ?? new MemoryCursorStore();
    this.backoff = new Backoff(opts.backoff, opts.random);
    this.token = opts.token;
  }

  /** The connection state. */
  get state(): ClientState {
    return this.stateValue;
  }

  /** The transport of the open connection, if any. */
  get transport(): 'websocket' | 'sse' | undefined {
    return this.stateValue === 'open' ? this.conn?.kind : undefined;
  }

  /** connect starts connecting (subscribe does too); it returns at once. */
  connect(): void {
    if (this.started || this.stopped) return;
    this.started = true;
    this.opts.window?.addEventListener('online', this.onOnline);
    this.opts.window?.addEventListener('offline', this.onOffline);
    this.opts.document?.addEventListener('visibilitychange', this.onVisible);
    void this.open();
  }

  /** close ends the connection for good. */
  close(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.teardown();
    this.opts.window?.removeEventListener('online', this.onOnline);
    this.opts.window?.removeEventListener('offline', this.onOffline);
    this.opts.document?.removeEventListener('visibilitychange', this.onVisible);
    this.setState('closed');
  }

  /**
   * subscribe follows topic (schema.table) and returns the function that
   * unsubscribes. Several subscriptions of one topic share the node's.
   * R types the rows of the handlers' envelopes (`subscribe<Order>(…)`);
   * the client does not check them.
   */
  subscribe<R extends object = Row>(topic: string, opts: SubscribeOptions = {}, handlers: Handlers<R> = {}): () => void {
    let st = this.topics.get(topic);
    let send = false;
    const view = viewOf(opts.filter, opts.columns);
    if (st && st.view !== view) {
      // One connection follows a topic once: its subscribers share one view.
      throw new WalcastError(
        'config',
        `walcast: ${topic} is already subscribed with ${st.view ? 'another filter or column list' : 'no filter or column list'}; unsubscribe it first, or use a second client for a second view`,
        { topic },
      );
    }
    if (!st) {
      const cursor = opts.cursor ?? this.store.get(topic);
      st = {
        topic,
        handlers: new Set(),
        cursor,
        lastSeq: 0,
        snapshot: !!opts.snapshot,
        wantSnapshot: !!opts.snapshot,
        inSnapshot: false,
        txn: [],
        txnOver: false,
        endSeq: 0,
        retry: new Backoff(this.opts.backoff, this.opts.random),
        filter: opts.filter,
        columns: opts.columns ? [...opts.columns] : undefined,
        view,
      };
      this.topics.set(topic, st);
      send = true;
    } else if (opts.snapshot && (!st.wantSnapshot || st.inSnapshot)) {
      // The rows went to the earlier subscribers only: ask for them again
      // (every subscriber's handlers see the new snapshot, which replaces
      // what the earlier ones hold).
      st.snapshot = true;
      st.wantSnapshot = true;
      st.inSnapshot = false;
      send = true;
    }
    st.handlers.add(handlers);
    if (send) this.sendSub(st);
    this.connect();
    const s = st;
    return () => {
      if (!s.handlers.delete(handlers) || s.handlers.size > 0 || this.topics.get(topic) !== s) return;
      this.topics.delete(topic);
      this.cancel(s.retryTimer);
      if (this.conn && this.stateValue === 'open' && !this.conn.send({ t: 'unsub', topic })) this.queueReopen();
    };
  }

  /** live keeps topic's rows current (see live()); R types its rows. */
  live<R extends object = Row>(topic: string, opts: LiveOptions<R> = {}): LiveTable<R> {
    return live<R>(this, topic, opts);
  }

  /** The cursor the client would resume topic from. */
  cursor(topic: string): string | undefined {
    return this.topics.get(topic)?.cursor;
  }

  // --- connection ---------------------------------------------------------

  private setState(s: ClientState): void {
    if (this.stateValue === s) return;
    this.stateValue = s;
    this.opts.onState?.(s, this.conn?.kind);
  }

  private report(err: WalcastError): void {
    this.opts.onError?.(err);
  }

  private fail(err: WalcastError): void {
    this.report(err);
    this.teardown();
    this.stopped = true;
    this.setState('failed');
  }

  private after(ms: number, fn: () => void): unknown {
    const h = this.clock.setTimeout(() => {
      this.timers.delete(h);
      fn();
    }, ms);
    this.timers.add(h);
    return h;
  }

  private cancel(h: unknown): void {
    if (h === undefined) return;
    this.timers.delete(h);
    this.clock.clearTimeout(h);
  }

  private teardown(): void {
    this.generation++;
    for (const h of this.timers) this.clock.clearTimeout(h);
    this.timers.clear();
    this.retryTimer = this.pingTimer = this.refreshTimer = this.silenceTimer = this.probeTimer = this.connectTimer = this.healthyTimer = undefined;
    this.endProbe();
    const c = this.conn;
    this.conn = undefined;
    c?.close();
  }

  private async currentToken(): Promise<string> {
    if (this.opts.getToken && (this.tokenStale || !this.token || tokenExpired(this.token, this.clock.now()))) {
      this.token = await this.opts.getToken();
      this.tokenStale = false;
    }
    if (!this.token) throw new WalcastError('config', 'walcast: getToken returned no token', { terminal: true });
    return this.token;
  }

  private async open(): Promise<void> {
    if (this.stopped) return;
    const gen = ++this.generation;
    this.setState('connecting');
    let token: string;
    try {
      token = await this.currentToken();
    } catch (e) {
      if (gen !== this.generation) return;
      this.report(e instanceof WalcastError ? e : new WalcastError('unauthorized', `walcast: getToken failed: ${String(e)}; retrying`));
      this.retry();
      return;
    }
    if (gen !== this.generation || this.stopped) return;
    if (this.opts.window && (globalThis as { navigator?: { onLine?: boolean } }).navigator?.onLine === false) {
      this.setState('offline');
      return;
    }
    const mode = this.opts.transport ?? 'auto';
    const WS = this.opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketCtor }).WebSocket;
    if (mode !== 'sse' && WS && !this.wsBlocked) {
      this.openConn(gen, (ev) => openWebSocket(WS, socketURL(this.opts.url, token), ev), mode === 'auto');
      return;
    }
    if (mode === 'websocket') {
      this.fail(new WalcastError('config', 'walcast: no WebSocket implementation: pass {WebSocket} (on Node 20, the `ws` package)', { terminal: true }));
      return;
    }
    this.openSSE(gen, token);
  }

  private openSSE(gen: number, token: string): void {
    const f = this.opts.fetch ?? (globalThis as { fetch?: FetchLike }).fetch;
    if (!f) {
      this.fail(new WalcastError('config', 'walcast: neither WebSocket nor fetch is available: pass {WebSocket} or {fetch}', { terminal: true }));
      return;
    }
    // An event stream carries each topic's filter and columns in its URL
    // (filter.<topic>, columns.<topic>), so cursors stay bound to them.
    const topics: StreamTopic[] = [];
    for (const st of this.topics.values()) {
      topics.push({ topic: st.topic, cursor: st.cursor, snapshot: st.wantSnapshot, filter: st.filter, columns: st.columns });
    }
    const url = eventsURL(this.opts.url, topics);
    this.openConn(gen, (ev) => openEventStream(f, url, token, undefined, ev), false);
  }

  private openConn(gen: number, make: (ev: ConnEvents) => Conn, fallback: boolean): void {
    const conn = make({
      open: () => {
        if (gen !== this.generation) return;
        this.cancel(this.connectTimer);
        this.onOpen();
      },
      frame: (f) => {
        if (gen !== this.generation) return;
        this.onFrame(f);
      },
      alive: () => {
        if (gen === this.generation) this.armSilence();
      },
      end: (e) => {
        if (gen !== this.generation || this.conn !== conn) return;
        this.conn = undefined;
        this.onEnd(e, fallback, conn.kind);
      },
    });
    this.conn = conn;
    // A socket can hang in its handshake (a proxy that never answers): give
    // it up after connectTimeout as if it had failed to open.
    this.cancel(this.connectTimer);
    this.connectTimer = this.after(this.opts.connectTimeout ?? 10_000, () => {
      this.connectTimer = undefined;
      if (this.conn !== conn || gen !== this.generation) return;
      this.conn = undefined;
      conn.close();
      this.onEnd({ code: 1006, reason: 'the node did not answer within the connect timeout', opened: false }, fallback, conn.kind);
    });
  }

  private onOpen(): void {
    const c = this.conn;
    if (!c) return;
    if (c.kind === 'sse' && this.fallbackPending) {
      // The socket failed where the event stream works: something between
      // us and the node may block WebSockets. After several failures in a
      // row, open event streams only.
      this.fallbackPending = false;
      if (this.wsFailures >= (this.opts.wsBlockAfter ?? 3)) this.wsBlocked = true;
    }
    // On an event stream (transport 'auto'), try a socket again now and then.
    if (c.kind === 'sse') this.scheduleProbe();
    if (c.kind === 'websocket') this.wsFailures = 0;
    this.setState('open');
    // A transaction cut off with the last connection is read again from
    // the cursor, its last boundary.
    for (const st of this.topics.values()) this.dropTxn(st);
    if (c.kind === 'websocket') {
      for (const st of this.topics.values()) this.sendSub(st);
      this.schedulePing();
    }
    this.scheduleRefresh();
    this.armSilence();
    this.cancel(this.healthyTimer);
    this.healthyTimer = this.after(this.opts.healthyAfter ?? 10_000, () => {
      this.healthyTimer = undefined;
      this.backoff.reset(); // the connection works
    });
  }

  private onEnd(e: ConnEnd, fallback: boolean, kind: 'websocket' | 'sse'): void {
    this.cancel(this.pingTimer);
    this.cancel(this.refreshTimer);
    this.cancel(this.silenceTimer);
    this.cancel(this.connectTimer);
    this.cancel(this.probeTimer);
    this.cancel(this.healthyTimer);
    this.endProbe();
    if (this.stopped) return;
    if (this.stateValue === 'offline') return;
    if (!e.opened) {
      // The event stream opened after a failed socket failed too: the node
      // is unreachable, which says nothing of WebSockets.
      if (kind === 'sse' && this.fallbackPending) this.wsFailures = Math.max(0, this.wsFailures - 1);
      this.fallbackPending = false;
      if (kind === 'websocket') this.wsFailures++;
      if (kind === 'websocket' && fallback) {
        // A socket that cannot be opened: try the event stream, which also
        // tells a refusal (401, 403, 503) from a blocked WebSocket.
        const gen = ++this.generation;
        void this.currentToken().then(
          (tok) => {
            if (gen !== this.generation || this.stopped) return;
            this.fallbackPending = true;
            this.openSSE(gen, tok);
          },
          () => this.retry(),
        );
        return;
      }
      switch (e.status) {
        case 401:
          if (this.opts.getToken && !this.tokenStale && !this.refusedOnce) {
            this.refusedOnce = true;
            this.tokenStale = true;
            this.retry(0);
            return;
          }
          this.fail(new WalcastError('unauthorized', `walcast: the node refused the token (401: ${e.reason || 'unauthorized'}); get a valid token for this node and connect again`, { code: 401, terminal: true }));
          return;
        case 403:
          this.fail(new WalcastError('origin', `walcast: the node refused this page's origin (403: ${e.reason || 'forbidden'}); add it to the node's --allowed-origins`, { code: 403, terminal: true }));
          return;
      }
      this.retry(e.retryAfter !== undefined ? e.retryAfter * 1000 : undefined);
      return;
    }
    this.refusedOnce = false;
    switch (closeAction(e.code)) {
      case 'give-up':
        this.fail(new WalcastError('closed', `walcast: the node closed the connection with ${e.code} (${e.reason || 'no reason'}) and asks clients not to reconnect: ${giveUpHint(e.code)}`, { code: e.code, terminal: true }));
        return;
      case 'new-token':
        if (!this.opts.getToken) {
          this.fail(new WalcastError('token-expired', `walcast: the token expired (${e.code} ${e.reason}); pass getToken so the client can get new ones`, { code: e.code, terminal: true }));
          return;
        }
        this.tokenStale = true;
        this.retry(0);
        return;
    }
    this.retry();
  }

  private fallbackPending = false;
  private refusedOnce = false;

  /** retry reconnects after ms, or after the next backoff delay. */
  private retry(ms?: number): void {
    if (this.stopped) return;
    this.setState('waiting');
    const delay = ms === 0 ? 0 : Math.max(ms ?? 0, this.backoff.next());
    this.cancel(this.retryTimer);
    this.retryTimer = this.after(delay, () => {
      this.retryTimer = undefined;
      void this.open();
    });
  }

  /** wake reconnects now when waiting (back online, page visible again). */
  private wake(): void {
    if (this.stopped || !this.started) return;
    if (this.stateValue === 'waiting' || this.stateValue === 'offline') {
      this.cancel(this.retryTimer);
      this.retryTimer = undefined;
      this.backoff.reset();
      void this.open();
    }
  }

  private goOffline(): void {
    if (this.stopped || !this.started) return;
    this.teardown();
    this.setState('offline');
  }

  /** scheduleProbe tries a WebSocket beside the open event stream after wsProbeInterval. */
  private scheduleProbe(): void {
    this.cancel(this.probeTimer);
    const WS = this.opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketCtor }).WebSocket;
    if (!WS || (this.opts.transport ?? 'auto') !== 'auto') return;
    const gen = this.generation;
    this.probeTimer = this.after(this.opts.wsProbeInterval ?? 300_000, () => {
      this.probeTimer = undefined;
      if (gen !== this.generation || this.conn?.kind !== 'sse' || !this.token) return;
      let timer: unknown;
      const probe = openWebSocket(WS, socketURL(this.opts.url, this.token), {
        open: () => {
          this.cancel(timer);
          if (this.probe !== probe) return;
          // Sockets work again: move the topics over to one (resuming
          // from their cursors, nothing lost).
          this.endProbe();
          this.wsFailures = 0;
          this.wsBlocked = false;
          if (gen === this.generation && this.conn?.kind === 'sse') this.reopen();
        },
        frame: () => {},
        end: () => {
          this.cancel(timer);
          if (this.probe !== probe) return;
          this.probe = undefined;
          this.wsFailures++;
          if (gen === this.generation) this.scheduleProbe();
        },
      });
      this.probe = probe;
      timer = this.after(this.opts.connectTimeout ?? 10_000, () => probe.close());
    });
  }

  private endProbe(): void {
    const p = this.probe;
    this.probe = undefined;
    p?.close();
  }

  private schedulePing(): void {
    this.cancel(this.pingTimer);
    this.pingTimer = this.after(this.opts.pingInterval ?? 15_000, () => {
      this.conn?.send({ t: 'ping' });
      this.schedulePing();
    });
  }

  /** armSilence drops a connection that said nothing for silenceTimeout. */
  private armSilence(): void {
    this.cancel(this.silenceTimer);
    this.silenceTimer = this.after(this.opts.silenceTimeout ?? 45_000, () => {
      const c = this.conn;
      if (!c) return;
      this.conn = undefined;
      c.close();
      this.onEnd({ code: 1006, reason: 'no frame from the node within the silence timeout', opened: true }, false, c.kind);
    });
  }

  private scheduleRefresh(): void {
    this.cancel(this.refreshTimer);
    if (!this.opts.getToken || !this.token) return;
    const exp = tokenExp(this.token);
    if (exp === undefined) return;
    const left = exp * 1000 - this.clock.now();
    if (left <= 0) return; // the node closes with 4100; onEnd gets a new token
    const wait = Math.max(left - (this.opts.refreshBefore ?? 30_000), left / 2, 1000);
    // setTimeout fires at once for a delay above 2^31 - 1 ms (24.8 days):
    // a token that lives longer would be refreshed in a loop until the
    // node closes the socket (4429). Wait the longest a timer can, then
    // look again.
    if (wait > maxTimerDelay) {
      this.refreshTimer = this.after(maxTimerDelay, () => this.scheduleRefresh());
      return;
    }
    this.refreshTimer = this.after(wait, () => void this.refresh());
  }

  private async refresh(): Promise<void> {
    const gen = this.generation;
    let tok: string;
    try {
      tok = await this.opts.getToken!();
    } catch (e) {
      this.report(new WalcastError('unauthorized', `walcast: getToken failed while refreshing: ${String(e)}; the node closes at exp and the client tries again`));
      return;
    }
    if (gen !== this.generation || !this.conn) return;
    this.token = tok;
    if (this.conn.kind === 'websocket' && this.conn.send({ t: 'refresh', token: tok })) return;
    // An event stream cannot take a refresh frame: reopen it with the new
    // token from the cursors (nothing is lost, duplicates are dropped).
    this.reopen();
  }

  /** reopen closes the connection and opens a new one at once. */
  private reopen(): void {
    const c = this.conn;
    this.conn = undefined;
    this.generation++;
    c?.close();
    void this.open();
  }

  /** queueReopen reopens an event stream once the current task is done (its topic set changed). */
  private queueReopen(): void {
    if (this.reopenQueued) return;
    this.reopenQueued = true;
    queueMicrotask(() => {
      this.reopenQueued = false;
      if (this.conn?.kind === 'sse' && this.stateValue === 'open') this.reopen();
    });
  }

  private sendSub(st: TopicState): void {
    const c = this.conn;
    if (!c || this.stateValue !== 'open') return; // onOpen subscribes
    const f: ClientFrame = { t: 'sub', topic: st.topic };
    if (st.cursor && !st.wantSnapshot) f.cursor = st.cursor;
    if (st.wantSnapshot) f.snapshot = true;
    // The node binds cursors to the view: every sub carries it.
    if (st.filter !== undefined) f.filter = st.filter;
    if (st.columns !== undefined) f.columns = st.columns;
    if (!c.send(f)) this.queueReopen();
  }

  // --- frames -------------------------------------------------------------

  private onFrame(f: ServerFrame): void {
    this.armSilence();
    switch (f.t) {
      case 'pong':
        return;
      case 'refreshed':
        this.scheduleRefresh();
        return;
      case 'error':
        this.onErrorFrame(f);
        return;
    }
    const st = this.topics.get(f.topic);
    if (!st) return; // a topic we left
    switch (f.t) {
      case 'change': {
        const seq = typeof f.change?.seq === 'number' ? f.change.seq : undefined;
        if (seq !== undefined && seq <= st.lastSeq) return; // a duplicate
        if (seq !== undefined) st.lastSeq = seq;
        if (st.inSnapshot) {
          // A snapshot's own changes: applied with the snapshot at its end.
          for (const h of [...st.handlers]) h.onChange?.(f.change, undefined);
          return;
        }
        if (!f.end) {
          // Inside a transaction: held until its end.
          if (!st.txnOver) {
            st.txn.push(f.change);
            if (st.txn.length > (this.opts.maxTxnChanges ?? 100_000)) {
              st.txn = [];
              st.txnOver = true;
            }
          }
          return;
        }
        if (seq !== undefined) st.endSeq = seq;
        if (st.txn.length + 1 > (this.opts.maxTxnChanges ?? 100_000)) st.txnOver = true; // the end makes it too large
        if (st.txnOver) {
          // Too large to hold whole: never delivered in part. The topic is
          // read again after it, as after a resync.
          st.txn = [];
          st.txnOver = false;
          this.onFrame({ t: 'resync', topic: st.topic, cursor: f.cursor ?? '' });
          return;
        }
        const txn = st.txn;
        txn.push(f.change);
        st.txn = [];
        this.setCursor(st, f.cursor);
        const cursor = f.cursor ?? '';
        for (const h of [...st.handlers]) {
          for (let i = 0; i < txn.length; i++) h.onChange?.(txn[i], i === txn.length - 1 ? cursor : undefined);
          h.onTransaction?.(txn, cursor);
        }
        return;
      }
      case 'subscribed':
        st.retry.reset();
        if (!st.cursor) this.setCursor(st, f.cursor);
        for (const h of [...st.handlers]) h.onSubscribed?.(f.cursor);
        return;
      case 'position':
        // A quiet topic moved: nothing of its scope up to here.
        this.setCursor(st, f.cursor);
        return;
      case 'replay-gap':
        // The node dropped frames: a partial transaction comes again.
        this.dropTxn(st);
        for (const h of [...st.handlers]) h.onReplayGap?.(f.cursor);
        if (!st.cursor) this.setCursor(st, f.cursor);
        // An event stream follows its gaps on the node's side.
        if (this.conn?.kind === 'websocket') this.sendSub(st);
        return;
      case 'resync':
        // Seqs after a resync need not follow the ones before (a restored
        // journal): dedupe starts over.
        st.lastSeq = 0;
        st.endSeq = 0;
        st.txn = [];
        st.txnOver = false;
        this.setCursor(st, f.cursor);
        if (st.snapshot) st.wantSnapshot = true;
        for (const h of [...st.handlers]) h.onResync?.(f.cursor);
        if (this.conn?.kind === 'websocket') this.sendSub(st);
        else if (st.snapshot) this.queueReopen();
        return;
      case 'snapshot-begin':
        st.lastSeq = 0;
        st.endSeq = 0;
        st.txn = [];
        st.txnOver = false;
        st.inSnapshot = true;
        // Until its end there is no cursor to resume from: a snapshot cut
        // short (a reconnect, snapshot-failed) is asked for again.
        if (st.snapshot) st.wantSnapshot = true;
        for (const h of [...st.handlers]) h.onSnapshotBegin?.();
        return;
      case 'row': {
        const row = f.change ?? f.row;
        if (!row) return;
        for (const h of [...st.handlers]) h.onRow?.(row);
        return;
      }
      case 'snapshot-end':
        st.wantSnapshot = false;
        st.inSnapshot = false;
        st.endSeq = st.lastSeq;
        st.retry.reset();
        this.setCursor(st, f.cursor);
        for (const h of [...st.handlers]) h.onSnapshotEnd?.(f.cursor);
        return;
    }
  }

  private onErrorFrame(f: { code: string; message: string; topic?: string; retryAfter?: unknown }): void {
    const st = f.topic ? this.topics.get(f.topic) : undefined;
    // What the client does about it, for the message.
    let then = '';
    if (st) {
      switch (f.code) {
        case 'bad-cursor':
          // A cursor of another tenant, topic or deployment: start the topic
          // over without one (its state must be read again).
          this.store.delete(st.topic);
          st.cursor = undefined;
          st.lastSeq = 0;
          if (st.snapshot) st.wantSnapshot = true;
          for (const h of [...st.handlers]) h.onResync?.(undefined);
          this.sendSub(st);
          then = '; the client dropped the cursor and subscribed again without it';
          break;
        case 'unavailable':
        case 'unknown-topic':
        case 'snapshot-failed':
        case 'rate-limited':
        case 'overloaded': {
          // The node ended (or never began) the subscription: a journal
          // outage, a table's first change still to come, a snapshot that
          // failed, a snapshot budget or the node's memory spent. Ask again
          // later: when the node says, else after the topic's backoff.
          st.inSnapshot = false;
          const ra = typeof f.retryAfter === 'number' && f.retryAfter > 0 ? f.retryAfter * 1000 : 0;
          const ms = Math.max(ra, st.retry.next());
          this.resubscribeLater(st, ms);
          then = `; the client subscribes again in ${Math.ceil(ms / 1000)} s`;
          break;
        }
        case 'snapshot-unavailable':
          // The node serves no snapshots (no --database-url): follow the
          // topic's changes without its current rows.
          st.snapshot = false;
          st.wantSnapshot = false;
          st.inSnapshot = false;
          this.sendSub(st);
          then = "; the client follows the topic's changes without its current rows (start the node with --database-url to serve snapshots)";
          break;
        case 'forbidden':
        case 'bad-topic':
        case 'bad-filter':
        case 'too-many-topics':
          this.cancel(st.retryTimer);
          this.topics.delete(st.topic); // the node dropped it; so do we
          then = `; the client left the topic (${leaveHint(f.code)}, then subscribe again)`;
          break;
      }
    }
    const err = new WalcastError('node', `walcast: ${f.code}${f.topic ? ` on ${f.topic}` : ''}: ${f.message}${then}`, { code: f.code, topic: f.topic });
    if (st) for (const h of [...st.handlers]) h.onError?.(err);
    this.report(err);
  }

  /** resubscribeLater subscribes st again after ms, unless the connection or the topic changed first. */
  private resubscribeLater(st: TopicState, ms: number): void {
    const gen = this.generation;
    this.cancel(st.retryTimer);
    st.retryTimer = this.after(ms, () => {
      st.retryTimer = undefined;
      // A new connection subscribes every topic itself.
      if (gen === this.generation && this.topics.get(st.topic) === st) this.sendSub(st);
    });
  }

  /** dropTxn forgets st's partial transaction: it is read again from the cursor, at its last boundary. */
  private dropTxn(st: TopicState): void {
    st.txn = [];
    st.txnOver = false;
    st.lastSeq = st.endSeq;
  }

  private setCursor(st: TopicState, cursor: string | undefined): void {
    if (!cursor) return;
    st.cursor = cursor;
    this.store.set(st.topic, cursor);
  }
}

/** The longest delay setTimeout honours (2^31 - 1 ms); longer ones fire at once. */
const maxTimerDelay = 2 ** 31 - 1;

function leaveHint(code: string): string {
  switch (code) {
    case 'forbidden':
      return "get a token whose topics claim grants it";
    case 'bad-topic':
      return 'name it as schema.table';
    case 'bad-filter':
      return 'correct the filter or column list as the message says';
    default:
      return 'follow at most 256 topics on one connection';
  }
}

function giveUpHint(code: number): string {
  switch (code) {
    case 4400:
      return 'the client sent a frame the node cannot read (not JSON, or larger than --max-frame-bytes); fix the client';
    case 4429:
      return 'the client sent more frames than --inbound-rate allows; send fewer (one sub per topic, a ping every 15 s)';
    default:
      return 'see docs/sync.md, "Tokens and close codes"';
  }
}

/** tokenExp is a JWT's exp claim (seconds), if it has one. */
export function tokenExp(token: string): number | undefined {
  const part = token.split('.')[1];
  if (!part) return undefined;
  try {
    const b64 = part.replace(/-/g, '+').replace(/_/g, '/');
    const json = JSON.parse(atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4))) as { exp?: unknown };
    return typeof json.exp === 'number' ? json.exp : undefined;
  } catch {
    return undefined;
  }
}

function tokenExpired(token: string, now: number): boolean {
  const exp = tokenExp(token);
  return exp !== undefined && exp * 1000 <= now;
}
