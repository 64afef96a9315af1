// @walcast/client/react: React bindings of the client. The core entry
// (@walcast/client) never imports this file, so it stays framework-free;
// react is an optional peer dependency of the package, needed only here.
import { useCallback, useSyncExternalStore } from 'react';
import type { Client } from './client.js';
import type { WalcastError } from './errors.js';
import type { Filter, Row } from './frames.js';
import { live, type LiveTable } from './live.js';

/**
 * Where a live table is: 'loading' until its rows have arrived (the
 * snapshot), 'ready' after, 'error' when the node refused the topic
 * (forbidden, bad-topic …; error says why) — rows then keep what they
 * held. A table that recovers (the client resubscribes by itself after
 * rate-limited or snapshot-failed) goes back to 'ready' at its next rows.
 */
export type LiveStatus = 'loading' | 'ready' | 'error';

/** What useLive returns; a new object whenever anything in it changed. */
export interface LiveState<R extends object = Row> {
  /** The rows, in the order they arrived; a new array per applied batch. */
  readonly rows: readonly R[];
  /** key (rowKey of the key columns) → row; a new Map per applied batch. */
  readonly byKey: ReadonlyMap<string, R>;
  readonly status: LiveStatus;
  /** Whether the rows have arrived at least once (they stay while status is 'error'). */
  readonly ready: boolean;
  readonly error: WalcastError | undefined;
}

export interface UseLiveOptions {
  /** Ask for the current rows first (default true; false: changes from now on). */
  snapshot?: boolean;
  /**
   * Keep only the rows this filter matches, and only these columns (and
   * the key columns) of each; see live(). A client follows a topic with one
   * filter: components of one client and topic must agree on it (another
   * one is an error, status 'error').
   */
  filter?: Filter;
  columns?: readonly string[];
  /**
   * Suspend (throw a promise to the nearest <Suspense>) until the rows
   * have arrived, and throw the error to the nearest error boundary when
   * the topic is refused before they did. The returned state is then
   * always ready.
   */
  suspense?: boolean;
  /**
   * How long (ms) a topic stays subscribed after its last component
   * unmounted (default 1000): a remount within it (React's StrictMode, a
   * route change that comes back) reuses the rows instead of a new
   * snapshot. Also how long rows fetched by a suspended render that never
   * mounted are kept after they arrive.
   */
  keepAlive?: number;
}

/** One live table shared by every component of one client, topic and snapshot option. */
interface Entry {
  key: string;
  table: LiveTable<object> | undefined;
  state: LiveState<object>;
  listeners: Set<() => void>;
  refs: number;
  keepAlive: number;
  timer: ReturnType<typeof setTimeout> | undefined;
  /** Settles when the state leaves 'loading' (for Suspense). */
  settled: Promise<void>;
  settle: () => void;
}

const tables = new WeakMap<Client, Map<string, Entry>>();

/** The state before a component has subscribed: loading, or (snapshot false) ready with no rows. */
const loading: LiveState<object> = Object.freeze({ rows: [], byKey: new Map(), status: 'loading', ready: false, error: undefined });
const empty: LiveState<object> = Object.freeze({ rows: [], byKey: new Map(), status: 'ready', ready: true, error: undefined });
const initial = (snapshot: boolean) => (snapshot ? loading : empty);

/** What a live table follows: its topic, snapshot option, filter and columns. */
interface Spec {
  topic: string;
  snapshot: boolean;
  filter?: Filter;
  columns?: readonly string[];
  /** filter and columns as one string ('' for neither), part of the entry's key. */
  view: string;
}

const entryKey = (s: Spec) => (s.snapshot ? 'rows:' : 'changes:') + s.topic + (s.view ? '\u0000' + s.view : '');

/** start subscribes entry's table (again, after it was stopped). */
function start(client: Client, spec: Spec, e: Entry): void {
  const { topic, snapshot } = spec;
  const set = (s: LiveState<object>) => {
    e.state = s;
    if (s.status !== 'loading') {
      e.settle();
      if (e.refs === 0) release(client, e); // a render that suspended and has not mounted (yet)
    }
    for (const l of [...e.listeners]) l();
  };
  let m = tables.get(client);
  if (!m) tables.set(client, (m = new Map()));
  if (!m.has(e.key)) m.set(e.key, e);
  const failed = (error: WalcastError) => set({ ...e.state, status: 'error', error });
  try {
    e.table = live<object>(client, topic, {
      snapshot,
      filter: spec.filter,
      columns: spec.columns,
      onChange: (rows) => set({ rows: [...rows.values()], byKey: rows, status: 'ready', ready: true, error: undefined }),
      onError: failed,
    });
  } catch (err) {
    // Another component follows the topic on this client with another
    // filter or column list (live() refuses a second view).
    e.table = undefined;
    failed(err as WalcastError);
  }
}

function acquire(client: Client, spec: Spec, keepAlive: number): Entry {
  const key = entryKey(spec);
  const found = tables.get(client)?.get(key);
  if (found) return found;
  let settle = () => {};
  const settled = new Promise<void>((r) => (settle = r));
  const e: Entry = { key, table: undefined, state: initial(spec.snapshot), listeners: new Set(), refs: 0, keepAlive, timer: undefined, settled, settle };
  start(client, spec, e);
  return e;
}

/** release stops e keepAlive ms from now unless a component subscribes to it by then. */
function release(client: Client, e: Entry): void {
  if (e.timer !== undefined) clearTimeout(e.timer);
  e.timer = setTimeout(() => {
    e.timer = undefined;
    if (e.refs > 0 || !e.table) return;
    e.table.stop();
    e.table = undefined;
    const m = tables.get(client);
    if (m?.get(e.key) === e) m.delete(e.key);
  }, e.keepAlive);
}

/**
 * useLive keeps a component's copy of topic's rows (live()): it renders
 * again once per applied batch — the snapshot at its end, the changes of
 * a transaction (or of one message) together — with a new `rows` array
 * and `byKey` Map each time, so memo() and effects that depend on them
 * see the change. Components of one client and topic share one
 * subscription and its rows (with the options of the component that
 * started it); the topic is unsubscribed keepAlive ms after the last of
 * them unmounted. R types the rows (`useLive<Order>(…)`, with
 * Order from `walcast types --lang ts`); it is not checked.
 *
 * Readiness: without `suspense`, check `status` (or `ready`) and render a
 * placeholder while 'loading'. With `suspense: true` the component
 * suspends until the rows are there, so a <Suspense fallback> shows
 * instead; the subscription is started by the first render and kept for
 * the retry. Without suspense it starts when the component has mounted,
 * so a server render (getServerSnapshot: 'loading') opens nothing.
 */
export function useLive<R extends object = Row>(client: Client, topic: string, opts: UseLiveOptions = {}): LiveState<R> {
  const snapshot = opts.snapshot ?? true;
  const keepAlive = opts.keepAlive ?? 1000;
  // The filter and columns by value: a component that writes them inline
  // passes new objects on every render, which must not resubscribe.
  const view = opts.filter === undefined && opts.columns === undefined ? '' : JSON.stringify([opts.filter ?? null, opts.columns ?? null]);
  const spec: Spec = { topic, snapshot, filter: opts.filter, columns: opts.columns, view };
  // The subscription starts when the component subscribes (an effect:
  // never in a server render), or, with suspense, at the first render.
  const subscribe = useCallback(
    (listener: () => void) => {
      const e = acquire(client, spec, keepAlive);
      e.refs++;
      if (e.timer !== undefined) {
        clearTimeout(e.timer);
        e.timer = undefined;
      }
      if (!e.table) start(client, spec, e);
      e.listeners.add(listener);
      return () => {
        e.listeners.delete(listener);
        if (--e.refs === 0) release(client, e);
      };
    },
    // eslint-disable-next-line react-hooks/exhaustive-deps -- spec changes with view, compared by value
    [client, topic, snapshot, keepAlive, view],
  );
  const get = () => tables.get(client)?.get(entryKey(spec))?.state ?? initial(snapshot);
  const state = useSyncExternalStore(subscribe, get, () => initial(snapshot)) as LiveState<R>;
  if (opts.suspense && !state.ready) {
    if (state.status === 'error') throw state.error;
    throw acquire(client, spec, keepAlive).settled;
  }
  return state;
}
