import type { Client, Handlers } from './client.js';
import type { Envelope, Row } from './frames.js';
import type { WalcastError } from './errors.js';

/** What happened to a live table's rows. */
export type LiveEvent =
  | { type: 'upsert'; key: string; row: Row; change: Envelope }
  | { type: 'delete'; key: string; change: Envelope }
  | { type: 'clear'; change?: Envelope }
  | { type: 'snapshot'; rows: number }
  | { type: 'resync' };

export interface LiveOptions {
  /** Ask the node for the current rows first (default true). */
  snapshot?: boolean;
  /** Called after every change to rows, with what changed. */
  onChange?(rows: ReadonlyMap<string, Row>, event: LiveEvent): void;
  onError?(err: WalcastError): void;
}

export interface LiveTable {
  /** key → row; keys are rowKey() of the key columns. */
  readonly rows: ReadonlyMap<string, Row>;
  /** Whether the snapshot (when asked for) has been received. */
  readonly ready: boolean;
  stop(): void;
}

/** rowKey is a stable string for a key object: JSON with sorted columns. */
export function rowKey(key: Row): string {
  const cols = Object.keys(key).sort();
  return JSON.stringify(cols.map((c) => [c, key[c]]));
}

function pick(row: Row | undefined, cols: string[]): Row | undefined {
  if (!row) return undefined;
  const out: Row = {};
  for (const c of cols) {
    if (!(c in row)) return undefined;
    out[c] = row[c];
  }
  return out;
}

/**
 * live keeps topic's rows current — key → row — from a snapshot's rows and
 * every change after it: inserts and reads add a row, updates replace it
 * (columns the change leaves out as unchanged keep their values), deletes
 * remove it, a truncate clears the table. A resync or a new snapshot
 * replaces the rows with the node's: rows the new snapshot does not name
 * are removed at its end.
 */
export function live(client: Client, topic: string, opts: LiveOptions = {}): LiveTable {
  const rows = new Map<string, Row>();
  let ready = !(opts.snapshot ?? true);
  let seen: Set<string> | undefined;
  const emit = (ev: LiveEvent) => opts.onChange?.(rows, ev);

  const apply = (ch: Envelope) => {
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
            if (ok !== k && rows.has(ok)) {
              const prev = rows.get(ok)!;
              rows.delete(ok);
              rows.set(k, { ...prev, ...ch.after });
              seen?.add(k);
              emit({ type: 'delete', key: ok, change: ch });
              emit({ type: 'upsert', key: k, row: rows.get(k)!, change: ch });
              return;
            }
          }
        }
        const row = { ...(ch.op === 'update' ? rows.get(k) : undefined), ...ch.after };
        rows.set(k, row);
        seen?.add(k);
        emit({ type: 'upsert', key: k, row, change: ch });
        return;
      }
      case 'delete': {
        const k = rowKey(ch.key ?? pick(ch.before, Object.keys(ch.before ?? {})) ?? {});
        rows.delete(k);
        seen?.delete(k);
        emit({ type: 'delete', key: k, change: ch });
        return;
      }
      case 'truncate':
        rows.clear();
        seen?.clear();
        emit({ type: 'clear', change: ch });
        return;
    }
  };

  const handlers: Handlers = {
    onChange: apply,
    onRow: (row) => apply({ ...row, op: row.op === 'read' ? 'read' : row.op }),
    onSnapshotBegin: () => {
      seen = new Set();
    },
    onSnapshotEnd: () => {
      // The end of a snapshot whose beginning this table did not see (a
      // second live() of a topic mid-snapshot): its rows are partial; the
      // snapshot the client asked for this table follows.
      if (!seen) return;
      for (const k of [...rows.keys()]) if (!seen.has(k)) rows.delete(k);
      seen = undefined;
      ready = true;
      emit({ type: 'snapshot', rows: rows.size });
    },
    onResync: () => emit({ type: 'resync' }),
    onError: (e) => opts.onError?.(e),
  };
  const stop = client.subscribe(topic, { snapshot: opts.snapshot ?? true }, handlers);
  return {
    rows,
    get ready() {
      return ready;
    },
    stop,
  };
}
