// Compiled (never run) by test/types.test.mjs with tsc --strict: rows
// typed by an interface, as `walcast types --lang ts` writes them, reach
// live(), subscribe() and their callbacks with no cast; untyped use keeps
// Record<string, unknown>. Each @ts-expect-error is a misuse tsc must
// refuse: if the types stopped checking it, tsc would fail on the unused
// directive.
import { Client, live, type Envelope, type LiveTable, type Row } from '../../src/index.js';

interface Order {
  id: number;
  status: 'new' | 'paid';
  total: string | number;
  note: string | null;
}

const client = new Client({ url: 'http://127.0.0.1:8080', token: 't' });

const orders: LiveTable<Order> = client.live<Order>('public.orders', {
  onChange: (rows, events) => {
    for (const o of rows.values()) {
      const id: number = o.id;
      const note: string | null = o.note;
      // @ts-expect-error a column the table does not have
      void o.missing;
      void id, note;
    }
    for (const ev of events) {
      if (ev.type === 'upsert') {
        const s: 'new' | 'paid' = ev.row.status;
        void s;
      }
    }
  },
});
const first: Order | undefined = orders.rows.values().next().value;
void first;

const same: LiveTable<Order> = live<Order>(client, 'public.orders');
void same;

client.subscribe<Order>('public.orders', { snapshot: true }, {
  onChange: (ch: Envelope<Order>) => {
    // before, after and key hold some of the columns
    const id: number | undefined = ch.after?.id;
    // @ts-expect-error after may lack a column (unchanged, or a key-only before)
    const total: string | number = ch.after!.total;
    void id, total;
  },
  onRow: (row) => {
    const s: 'new' | 'paid' | undefined = row.after?.status;
    void s;
  },
});

// Untyped, as before: rows are Row.
const any = client.live('public.things', {
  onChange: (rows) => {
    const r: Row | undefined = rows.get('k');
    const v: unknown = r?.whatever;
    void v;
  },
});
const r: ReadonlyMap<string, Record<string, unknown>> = any.rows;
void r;

// A filtered live table: filters are typed by the language's forms.
const paidOrders: LiveTable<Order> = client.live<Order>('public.orders', {
  filter: { and: [{ col: 'status', op: '=', value: 'paid' }, { col: 'note', op: 'is not null' }] },
  columns: ['status', 'total'],
});
void paidOrders;
// @ts-expect-error the language has no pattern matching
client.subscribe('public.orders', { filter: { col: 'status', op: 'like', value: 'p%' } });
// @ts-expect-error null is never a value: test with 'is null'
client.subscribe('public.orders', { filter: { col: 'note', op: '=', value: null } });
