import type { Client, Handlers } from './client.js';
import type { Envelope, Filter, Row } from './frames.js';
import type { WalcastError } from './errors.js';

/** What happened to a live table's rows (R: the row type, default Row). */
export type LiveEvent<R extends object = Row> =
  | { type: 'upsert'; key: string; row: R; change: Envelope<R> }
  | { type: 'delete'; key: string; change: Envelope<R> }
  | { type: 'clear'; change?: Envelope<R> }
  | { type: 'snapshot'; rows: number }
  | { type: 'resync' };

export interface LiveOptions<R extends object = Row> {
  /** Ask the node for the current rows first (default true). */
  snapshot?: boolean;
  /**
   * Keep only the rows this filter matches (docs/filters.md); a row that
   * stops matching is removed (a 'delete' event whose change has left:
   * 'filter'). See SubscribeOptions.filter.
   */
  filter?: Filter;
  /** Keep only these columns of each row, and the key columns (default: every column). */
  columns?: readonly string[];
  /**
   * Called once per applied batch, with the rows after it and what changed,
   * in order: a snapshot is one batch, delivered at its end ({type:
   * 'snapshot'}, its rows not listed one by one); changes are batched by
   * `schedule`. rows is a new Map for every batch that changed a row (a
   * batch of only a resync passes the unchanged one), never changed after
   * it is passed: keep it as state (React's setState sees the change).
   */
  onChange?(rows: ReadonlyMap<string, R>, events: LiveEvent<R>[]): void;
  /**
   * When a batch of changes is delivered: after the current task by default
   * (queueMicrotask: the frames of one message, or of one read of an event
   * stream, are one batch); pass requestAnimationFrame to deliver at most
   * once per frame.
   */
  schedule?: (flush: () => void) => void;
  onError?(err: WalcastError): void;
}

export interface LiveTable<R extends object = Row> {
  /** key → row, as of the last applied change; keys are rowKey() of the key columns. */
  readonly rows: ReadonlyMap<string, R>;
  /** Whether the snapshot (when asked for) has been received. */
  readonly ready: boolean;
  stop(): void;
}

/** rowKey is a stable string for a key object: JSON with sorted columns. */
export function rowKey(key: object): string {
  const k = key as Row;
  const cols = Object.keys(k).sort();
  return JSON.stringify(cols.map((c) => [c, k[c]]));
}

function pick(row: object | undefined, cols: string[]): Row | undefined {
  if (!row) return undefined;
  const r = row as Row;
  const out: Row = {};
  for (const c of cols) {
    if (!(c in r)) return undefined;
    out[c] = r[c];
  }
  return out;
}

/**
 * live keeps topic's rows current — key → row — from a snapshot's rows and
 * every change after it: inserts and reads add a row, updates replace it
 * (columns the change leaves out as unchanged keep their values), deletes
 * and removals (a row leaving the filter, left: 'filter') remove it, a
 * truncate clears the table. A resync or a new snapshot
 * replaces the rows with the node's: rows the new snapshot does not name
 * are removed at its end. The rows are copied on write: every batch gets a
 * new Map, and a Map once handed out never changes.
 *
 * R is the row type (`live<Order>(client, 'public.orders')`, with Order
 * from `walcast types --lang ts`); it is not checked against the rows.
 */
export function live<R extends object = Row>(client: Client, topic: string, opts: LiveOptions<R> = {}): LiveTable<R> {
  /** The rows last handed out (or the empty start). */
  let rows: Map<string, R> = new Map();
  /** The rows the pending change batch is building (a copy of rows). */
  let draft: Map<string, R> | undefined;
  /** The rows of the snapshot being read (a copy of rows); keys it named. */
  let snap: Map<string, R> | undefined;
  let seen: Set<string> | undefined;
  let ready = !(opts.snapshot ?? true);
  let pending: LiveEvent<R>[] = [];
  let queued = false;
  let stopped = false;
  const schedule = opts.schedule ?? queueMicrotask;

  const flush = () => {
    queued = false;
    if (stopped || pending.length === 0) return;
    if (draft) rows = draft;
    draft = undefined;
    const events = pending;
    pending = [];
    opts.onChange?.(rows, events);
  };
  const push = (ev: LiveEvent<R>) => {
    pending.push(ev);
    if (queued) return;
    queued = true;
    schedule(flush);
  };

  /** apply changes the map a change goes to: the snapshot's while one is read (its events are not listed). */
  const apply = (ch: Envelope<R>) => {
    const m = snap ?? (draft ??= new Map(rows));
    const emit = (ev: LiveEvent<R>) => {
      if (!snap) push(ev);
    };
    switch (ch.op) {
      case 'insert':
      case 'read':
      case 'update': {
        const key = ch.key ?? {};
        const k = rowKey(key);
        if (ch.op === 'update') {
          // A key change: the old key is in before.
          const old = pick(ch.before, Object.keys(key));
          if (old) {
            const ok = rowKey(old);
            if (ok !== k && m.has(ok)) {
              const prev = m.get(ok)!;
              m.delete(ok);
              const row = { ...prev, ...ch.after } as R;
              m.set(k, row);
              seen?.add(k);
              emit({ type: 'delete', key: ok, change: ch });
              emit({ type: 'upsert', key: k, row, change: ch });
              return;
            }
          }
        }
        // A row is whole once inserted or read; an update's after lacks
        // only its unchanged columns, which the row keeps.
        const row = { ...(ch.op === 'update' ? m.get(k) : undefined), ...ch.after } as R;
        m.set(k, row);
        seen?.add(k);
        emit({ type: 'upsert', key: k, row, change: ch });
        return;
      }
      case 'delete': {
        const k = rowKey(ch.key ?? pick(ch.before, Object.keys(ch.before ?? {})) ?? {});
        m.delete(k);
        seen?.delete(k);
        emit({ type: 'delete', key: k, change: ch });
        return;
      }
      case 'truncate':
        m.clear();
        seen?.clear();
        emit({ type: 'clear', change: ch });
        return;
    }
  };

  const handlers: Handlers<R> = {
    onChange: apply,
    onRow: (row) => {
      // Rows of a snapshot whose beginning this table did not see are partial.
      if (snap) apply({ ...row, op: row.op === 'read' ? 'read' : row.op });
    },
    onSnapshotBegin: () => {
      flush(); // changes before the snapshot are a batch of their own
      snap = new Map(rows);
      seen = new Set();
    },
    onSnapshotEnd: () => {
      // The end of a snapshot whose beginning this table did not see (a
      // second live() of a topic mid-snapshot): its rows are partial; the
      // snapshot the client asked for this table follows.
      if (!snap || !seen) return;
      for (const k of [...snap.keys()]) if (!seen.has(k)) snap.delete(k);
      flush();
      rows = snap;
      snap = undefined;
      seen = undefined;
      ready = true;
      pending.push({ type: 'snapshot', rows: rows.size });
      flush();
    },
    onResync: () => push({ type: 'resync' }),
    onError: (e) => opts.onError?.(e),
  };
  const unsubscribe = client.subscribe<R>(topic, { snapshot: opts.snapshot ?? true, filter: opts.filter, columns: opts.columns }, handlers);
  return {
    get rows() {
      return draft ?? rows;
    },
    get ready() {
      return ready;
    },
    stop() {
      stopped = true;
      unsubscribe();
    },
  };
}
