/**
 * A CursorStore keeps the last cursor of each topic, so a reloaded page or
 * a restarted process resumes where it was. Cursors are opaque strings
 * scoped by the node to one topic and one tenant; a store shared by users of
 * different tenants must key them apart (a prefix per user).
 */
export interface CursorStore {
  get(topic: string): string | undefined;
  set(topic: string, cursor: string): void;
  delete(topic: string): void;
}

/** MemoryCursorStore keeps cursors for the life of the client (the default). */
export class MemoryCursorStore implements CursorStore {
  private readonly m = new Map<string, string>();
  get(topic: string): string | undefined {
    return this.m.get(topic);
  }
  set(topic: string, cursor: string): void {
    this.m.set(topic, cursor);
  }
  delete(topic: string): void {
    this.m.delete(topic);
  }
}

/** The part of the Web Storage API the localStorage adapter uses. */
export interface StorageLike {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

/**
 * LocalStorageCursorStore keeps cursors in window.localStorage (or any
 * Storage), under `prefix + topic`. Writes that fail (storage full, private
 * mode) are ignored: the stream goes on and a reload resumes from an older
 * cursor, which the client dedupes.
 */
export class LocalStorageCursorStore implements CursorStore {
  private readonly storage: StorageLike;
  private readonly prefix: string;

  constructor(opts: { prefix?: string; storage?: StorageLike } = {}) {
    const s = opts.storage ?? (globalThis as { localStorage?: StorageLike }).localStorage;
    if (!s) {
      throw new Error('walcast: no localStorage here; pass {storage} or use MemoryCursorStore');
    }
    this.storage = s;
    this.prefix = opts.prefix ?? 'walcast:cursor:';
  }
  get(topic: string): string | undefined {
    try {
      return this.storage.getItem(this.prefix + topic) ?? undefined;
    } catch {
      return undefined;
    }
  }
  set(topic: string, cursor: string): void {
    try {
      this.storage.setItem(this.prefix + topic, cursor);
    } catch {
      // full or unavailable: see the class comment
    }
  }
  delete(topic: string): void {
    try {
      this.storage.removeItem(this.prefix + topic);
    } catch {
      // unavailable
    }
  }
}
