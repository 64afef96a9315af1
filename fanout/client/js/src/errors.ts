/** Why the client stopped or reports a problem. */
export type ErrorKind =
  /** The node refused the token (HTTP 401) and no new one helped. */
  | 'unauthorized'
  /** The node refused the page's origin (HTTP 403): fix --allowed-origins. */
  | 'origin'
  /** The node closed with a do-not-reconnect code (4400–4499, 1008). */
  | 'closed'
  /** The token expired and there is no getToken to get another. */
  | 'token-expired'
  /** An error frame from the node (bad-topic, forbidden, bad-cursor …). */
  | 'node'
  /** No WebSocket or fetch implementation to connect with. */
  | 'config';

/** WalcastError is every error the client reports. */
export class WalcastError extends Error {
  readonly kind: ErrorKind;
  /** The close code, HTTP status or node error code behind it, when any. */
  readonly code?: number | string;
  readonly topic?: string;
  /** Terminal errors stop the client; it does not reconnect by itself. */
  readonly terminal: boolean;

  constructor(kind: ErrorKind, message: string, opts: { code?: number | string; topic?: string; terminal?: boolean } = {}) {
    super(message);
    this.name = 'WalcastError';
    this.kind = kind;
    this.code = opts.code;
    this.topic = opts.topic;
    this.terminal = opts.terminal ?? false;
  }
}
