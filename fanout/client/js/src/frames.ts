// Frames and envelopes of the walcast sync protocol (docs/sync.md in the
// walcast repository). Every type here mirrors what the node sends or reads;
// nothing is invented on the client side.

/** The operation of an envelope (DESIGN §3). */
export type Op =
  | 'insert'
  | 'update'
  | 'delete'
  | 'truncate'
  | 'message'
  | 'resync'
  | 'read'
  | 'snapshot-begin'
  | 'snapshot-end';

/** A column map: column name → its JSON value. */
export type Row = Record<string, unknown>;

/**
 * One journaled change as the node delivers it. R is the row type of its
 * table (`walcast types --lang ts` generates one per published table;
 * default Row): key, before and after hold some of its columns — the key
 * columns, the old row as the replica identity sends it, and the new row
 * without the columns listed in unchanged.
 */
export interface Envelope<R extends object = Row> {
  seq?: number;
  entitySeq?: number;
  lsn: string;
  commitLsn: string;
  xid: number;
  commitTime: string;
  entity?: string;
  op: Op;
  key?: Partial<R>;
  before?: Partial<R>;
  after?: Partial<R>;
  /** Columns whose value did not change and was not sent (TOAST). */
  unchanged?: string[];
  beforeJsonNull?: string[];
  afterJsonNull?: string[];
  truncate?: { cascade: boolean; restartIdentity: boolean };
  tenant?: string;
  tenantUnknown?: boolean;
  /**
   * "tenant" on the delete the journal adds when an update moves a row to
   * another tenant: the row leaves this client's tenant (the update follows
   * in the new one). A consumer of every tenant should skip it.
   */
  moved?: 'tenant';
  /**
   * "filter" on a removal: the row (its old key in key and before) no
   * longer matches the subscription's filter. It is not deleted from the
   * table; it leaves this subscription's rows, and is removed from them as
   * a delete is.
   */
  left?: 'filter';
  oversize?: boolean;
  [field: string]: unknown;
}

/** A value a filter compares a column with (docs/filters.md, "Types"). */
export type FilterValue = string | number | boolean;

/**
 * A row filter (docs/filters.md): a predicate over a table's published
 * columns, as JSON with typed values, never SQL text. For example
 * `{ and: [{ col: 'status', op: '=', value: 'paid' }, { col: 'amount', op: '>', value: 100 }] }`.
 */
export type Filter =
  | { and: Filter[] }
  | { or: Filter[] }
  | { not: Filter }
  | { col: string; op: '=' | '<>' | '!=' | '<' | '<=' | '>' | '>='; value: FilterValue }
  | { col: string; op: 'in'; values: FilterValue[] }
  | { col: string; op: 'is null' | 'is not null' };

/** Client → node frames. */
export type ClientFrame =
  | { t: 'sub'; topic: string; cursor?: string; snapshot?: boolean; filter?: Filter; columns?: string[] }
  | { t: 'unsub'; topic: string }
  | { t: 'ping' }
  | { t: 'refresh'; token: string };

/** Node → client frames. */
export type ServerFrame =
  | { t: 'subscribed'; topic: string; cursor: string }
  /**
   * A change. The last change of a source transaction on the topic (in the
   * socket's tenant scope) carries end: true and the cursor after it; the
   * changes before it in the transaction carry neither. Changes of one
   * transaction share change.commitLsn. Changes between snapshot-begin
   * and snapshot-end carry neither either: they belong to the snapshot.
   */
  | { t: 'change'; topic: string; cursor?: string; end?: boolean; change: Envelope }
  | { t: 'replay-gap'; topic: string; cursor: string }
  | { t: 'resync'; topic: string; cursor: string }
  | { t: 'position'; topic: string; cursor: string }
  | { t: 'snapshot-begin'; topic: string; cursor?: string }
  | { t: 'row'; topic: string; cursor?: string; change?: Envelope; row?: Envelope }
  | { t: 'snapshot-end'; topic: string; cursor: string }
  /** retryAfter (seconds): when to subscribe again, on rate-limited. */
  | { t: 'error'; code: string; message: string; topic?: string; retryAfter?: number }
  | { t: 'refreshed'; exp: number }
  | { t: 'pong' };

/** Close codes of /v1/socket (docs/sync.md, "Tokens and close codes"). */
export const CloseCode = {
  Normal: 1000,
  Idle: 1001,
  Abnormal: 1006,
  PolicyViolation: 1008,
  Backpressure: 1013,
  Shutdown: 4000,
  TokenExpired: 4100,
  BadFrame: 4400,
  Flood: 4429,
} as const;

/** What a client does after a close, by code (docs/sync.md). */
export type CloseAction = 'reconnect' | 'new-token' | 'give-up';

/**
 * closeAction classifies a close code as docs/sync.md says: 4000–4099
 * reconnect with backoff, 4100–4199 get a new token and reconnect at once,
 * 4400–4499 (and 1008, the code of older nodes for the same faults) do not
 * reconnect; everything else, 1006 included, reconnects with backoff.
 */
export function closeAction(code: number): CloseAction {
  if (code >= 4100 && code <= 4199) return 'new-token';
  if ((code >= 4400 && code <= 4499) || code === CloseCode.PolicyViolation) return 'give-up';
  return 'reconnect';
}
