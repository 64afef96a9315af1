/** Options of the reconnect backoff; times in milliseconds. */
export interface BackoffOptions {
  /** First delay (default 500 ms). */
  initial?: number;
  /** Cap of every delay (default 30 s). */
  max?: number;
  /** Growth per failed attempt (default 2). */
  factor?: number;
}

/**
 * Backoff is jittered exponential backoff with a cap: the n-th delay is
 * drawn uniformly from [d/2, d] where d = min(max, initial · factor^n), so a
 * fleet of clients reconnecting after a deploy spreads out instead of
 * arriving together. reset() starts over after a success.
 */
export class Backoff {
  readonly initial: number;
  readonly max: number;
  readonly factor: number;
  private attempt = 0;
  private readonly random: () => number;

  constructor(opts: BackoffOptions = {}, random: () => number = Math.random) {
    this.initial = opts.initial ?? 500;
    this.max = opts.max ?? 30_000;
    this.factor = opts.factor ?? 2;
    if (!(this.initial > 0) || !(this.max >= this.initial) || !(this.factor >= 1)) {
      throw new RangeError(
        `walcast: backoff needs 0 < initial <= max and factor >= 1 (got initial ${this.initial}, max ${this.max}, factor ${this.factor})`,
      );
    }
    this.random = random;
  }

  /** The next delay in milliseconds; each call counts one failed attempt. */
  next(): number {
    const d = Math.min(this.max, this.initial * Math.pow(this.factor, this.attempt));
    if (d < this.max) this.attempt++;
    return d / 2 + (this.random() * d) / 2;
  }

  /** How many delays were handed out since the last reset. */
  get attempts(): number {
    return this.attempt;
  }

  reset(): void {
    this.attempt = 0;
  }
}
