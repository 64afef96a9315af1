// The page of TestBrowserReact (fanout/sync/react_browser_test.go), built
// by react.mjs with esbuild and a real React from npm (a development
// build, under StrictMode: effects run twice, as in a developer's app).
// Two components follow the topic with useLive: one checks status, the
// other suspends until the rows are there; a third follows a topic the
// token does not grant and shows the refusal; a fourth, on a client of
// its own, follows the topic with a filter (n <= 3) and a column list (n),
// so rows enter and leave it as n changes. The first two render the rows through a
// memo() table, which renders again only when it gets a new rows array, so
// the DOM shows a change only if the hook handed out a new identity. The
// client's WebSocket records the frames it sends (the test looks for the
// unsub after unmount); cursors are kept in localStorage, so a reload
// resumes with a stored cursor. Its tokens live 2 to 3 seconds, so they
// are refreshed on the socket several times while the test runs.
import { StrictMode, Suspense, memo, useEffect, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { Client, LocalStorageCursorStore, type ClientFrame } from '@walcast/client';
import { useLive } from '@walcast/client/react';

/** A row of public.items, as `walcast types --lang ts` writes it. */
interface Item {
  id: number;
  val: string;
  n: number;
}

declare global {
  interface Window {
    client: Client;
    errors: string[];
    sent: ClientFrame[];
    fallbacks: number;
    stored: string | null;
    unmount: () => void;
  }
}

const topic = new URLSearchParams(location.search).get('topic') ?? '';
window.errors = [];
window.sent = [];
window.fallbacks = 0;
window.stored = localStorage.getItem('walcast-react:' + topic);

class RecordingWebSocket extends WebSocket {
  send(data: string) {
    window.sent.push(JSON.parse(data) as ClientFrame);
    super.send(data);
  }
}

const client = new Client({
  url: location.origin,
  transport: 'websocket',
  WebSocket: RecordingWebSocket,
  getToken: async () => {
    // Short-lived tokens (2 to 3 s): the client refreshes them on the open
    // socket while the test runs.
    const r = await fetch('/token?ttl=short', { cache: 'no-store' });
    if (!r.ok) throw new Error(`GET /token: ${r.status}`);
    return r.text();
  },
  store: new LocalStorageCursorStore({ prefix: 'walcast-react:' }),
  backoff: { initial: 100, max: 1000 },
  onError: (e) => window.errors.push(e.message),
});
window.client = client;

/**
 * A second client: one client follows a topic with one filter. Its token
 * lives long (the first client's refreshes are what the test watches), so
 * no token fetch of its own is in flight when the page reloads.
 */
const filteredClient = new Client({
  url: location.origin,
  transport: 'websocket',
  getToken: async () => {
    const r = await fetch('/token?ttl=long', { cache: 'no-store' });
    if (!r.ok) throw new Error(`GET /token: ${r.status}`);
    return r.text();
  },
  store: new LocalStorageCursorStore({ prefix: 'walcast-react-filtered:' }),
  backoff: { initial: 100, max: 1000 },
  onError: (e) => window.errors.push(e.message),
});

const Rows = memo(function Rows({ id, rows }: { id: string; rows: readonly Partial<Item>[] }) {
  return (
    <table id={id}>
      <tbody>
        {rows.map((r) => (
          <tr key={r.id} data-row={JSON.stringify(r)}>
            <td>{r.id}</td>
            <td>{r.val}</td>
            <td>{r.n}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
});

function Items() {
  const { rows, status, error } = useLive<Item>(client, topic, { keepAlive: 0 });
  const total: number = rows.reduce((s, r) => s + r.n, 0);
  return (
    <section>
      <p id="status">{status}</p>
      <p id="error">{error?.message ?? ''}</p>
      <p id="total">{total}</p>
      <Rows id="items" rows={rows} />
    </section>
  );
}

function SuspendedItems() {
  const { rows, status } = useLive<Item>(client, topic, { suspense: true, keepAlive: 0 });
  return (
    <section>
      <p id="suspended-status">{status}</p>
      <Rows id="suspended" rows={rows} />
    </section>
  );
}

/** The rows with n <= 3, and of each only its key and n. */
function FilteredItems() {
  const { rows, status } = useLive<Pick<Item, 'id' | 'n'>>(filteredClient, topic, {
    filter: { col: 'n', op: '<=', value: 3 },
    columns: ['n'],
    keepAlive: 0,
  });
  return (
    <section>
      <p id="filtered-status">{status}</p>
      <Rows id="filtered" rows={rows} />
    </section>
  );
}

/** A topic the token does not grant: the hook reports the node's refusal. */
function Refused() {
  const { status, error, rows } = useLive<Item>(client, 'public.refused', { keepAlive: 0 });
  return (
    <p id="refused" data-status={status}>
      {rows.length} rows; {error?.code}: {error?.message}
    </p>
  );
}

function Fallback() {
  useEffect(() => {
    window.fallbacks++;
  }, []);
  return <p id="fallback">loading…</p>;
}

function App() {
  const [shown, setShown] = useState(true);
  window.unmount = () => setShown(false);
  if (!shown) return <p id="unmounted">unmounted</p>;
  return (
    <>
      <Items />
      <FilteredItems />
      <Refused />
      <Suspense fallback={<Fallback />}>
        <SuspendedItems />
      </Suspense>
    </>
  );
}

createRoot(document.getElementById('root')!).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
