#!/usr/bin/env bash
# walcast demo: a throwaway PostgreSQL 15, `walcast verify`, `walcast run` with
# its embedded NATS server, `walcast sync --console --database-url` (a sync
# node with the live console that also serves tables' rows), an example page
# on @walcast/client's live() (the script prints its URL, the console's and a
# demo token), and `walcast tail` printing every envelope while this script
# makes direct-SQL writes. Ctrl-C stops everything it started.
#
#   make demo                         # interactive: keeps running until Ctrl-C
#   DEMO_NONINTERACTIVE=1 make demo   # CI: exits once every envelope arrived
#
# Environment: WALCAST_BIN (default bin/walcast), DEMO_TIMEOUT (seconds, for
# the non-interactive mode; default 120).
set -euo pipefail

WALCAST_BIN=${WALCAST_BIN:-bin/walcast}
DEMO_TIMEOUT=${DEMO_TIMEOUT:-120}
NONINTERACTIVE=${DEMO_NONINTERACTIVE:-}
[ -t 0 ] || NONINTERACTIVE=${NONINTERACTIVE:-1}

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[ -x "$WALCAST_BIN" ] || die "$WALCAST_BIN not found: run 'make build' first (make demo does)"

# --- PostgreSQL binaries -----------------------------------------------------
find_pg() {
  local d
  for d in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  if command -v initdb >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v initdb)")"; return 0; fi
  return 1
}
if ! PGBIN=$(find_pg); then
  if [ "$(id -u)" = 0 ]; then
    say "installing PostgreSQL 15 (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql-15
    PGBIN=$(find_pg) || die "postgresql-15 installed but initdb not found"
  else
    die "PostgreSQL server binaries not found. Install them with:
  sudo apt-get update && sudo apt-get install -y postgresql-15"
  fi
fi

# As root, the server runs as the unprivileged postgres user.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  local p
  for p in $(seq "$1" $(($1 + 200))); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  die "no free port near $1"
}

DIR=$(mktemp -d /tmp/walcast-demo.XXXXXX)
chmod 755 "$DIR"
[ "$(id -u)" = 0 ] && chown postgres "$DIR"
NATSPORT=$(free_port 4222)
HTTPPORT=$(free_port 9187)
SYNCPORT=$(free_port 8080)
SYNCOPS=$(free_port 9288)
PAGEPORT=$(free_port 8000)
HERE=$(cd "$(dirname "$0")" && pwd)
PIDS=()

cleanup() {
  trap - EXIT INT TERM
  say "stopping everything the demo started"
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  as_pg "$PGBIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "starting a throwaway PostgreSQL (data in $DIR)"
as_pg "$PGBIN/initdb" -D "$DIR/data" -U postgres --auth=trust -N >/dev/null
# A port that looked free can be taken before the server binds it (55432
# is inside Linux's ephemeral range, so any outgoing connection may hold
# it): try the next free one.
started=
for attempt in 1 2 3 4 5; do
  PGPORT=$(free_port $((55432 + (attempt - 1) * 7)))
  if as_pg "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/postgres.log" -w \
    -o "-p $PGPORT -k $DIR -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_slot_wal_keep_size=1GB" start >/dev/null; then
    started=1
    break
  fi
  grep -q 'could not bind' "$DIR/postgres.log" 2>/dev/null || break
done
if [ -z "$started" ]; then
  tail -n 20 "$DIR/postgres.log" >&2 2>/dev/null || true
  die "PostgreSQL did not start (its log is above); fix what it says and run make demo again"
fi
say "PostgreSQL is listening on 127.0.0.1:$PGPORT"
URL="postgres://postgres@127.0.0.1:$PGPORT/postgres?sslmode=disable"
PSQL=("$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$URL")

say "creating a schema and a publication"
"${PSQL[@]}" <<'SQL'
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, notes text);
CREATE TABLE customers (id int PRIMARY KEY, name text);
CREATE PUBLICATION demo FOR TABLE orders, customers;
SQL

say "walcast verify"
"$WALCAST_BIN" verify --database-url "$URL" --publication demo || true

say "walcast run (embedded NATS on 127.0.0.1:$NATSPORT); its log is in $DIR/run.log"
"$WALCAST_BIN" run --database-url "$URL" --publication demo --embedded-nats-listen "127.0.0.1:$NATSPORT" \
  --http-listen "127.0.0.1:$HTTPPORT" --log-format text >"$DIR/run.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
  if grep -q 'msg=streaming' "$DIR/run.log" 2>/dev/null; then break; fi
  kill -0 "${PIDS[0]}" 2>/dev/null || { cat "$DIR/run.log" >&2; die "walcast run exited"; }
  sleep 0.1
done
grep -q 'msg=streaming' "$DIR/run.log" || { cat "$DIR/run.log" >&2; die "walcast run did not start streaming"; }

say "walcast sync --console --database-url on 127.0.0.1:$SYNCPORT; its log is in $DIR/sync.log"
random_hex() { od -An -tx1 -N32 /dev/urandom | tr -d ' \n'; }
JWT_SECRET=$(random_hex)
"$WALCAST_BIN" sync --console --journal-url "$URL" --nats-url "nats://127.0.0.1:$NATSPORT" \
  --cursor-secret "$(random_hex)" --jwt-secret "$JWT_SECRET" \
  --database-url "$URL" --allowed-origins "http://127.0.0.1:$PAGEPORT" \
  --listen "127.0.0.1:$SYNCPORT" --http-listen "127.0.0.1:$SYNCOPS" --log-format text >"$DIR/sync.log" 2>&1 &
PIDS+=($!)
SYNCPID=$!
for _ in $(seq 1 100); do
  if grep -q 'msg="console enabled"' "$DIR/sync.log" 2>/dev/null; then break; fi
  kill -0 "$SYNCPID" 2>/dev/null || { cat "$DIR/sync.log" >&2; die "walcast sync exited"; }
  sleep 0.1
done
grep -q 'msg="console enabled"' "$DIR/sync.log" || { cat "$DIR/sync.log" >&2; die "walcast sync did not start its console"; }
# A demo token (HS256, a day) for the demo's two tables, their rows included
# (the snapshot claim: live() asks for the current rows first), signed with
# the node's secret by walcast token.
DEMO_TOKEN=$(WALCAST_JWT_SECRET="$JWT_SECRET" "$WALCAST_BIN" token --dev --sub demo --ttl 24h --snapshot \
  --topic public.orders,public.customers 2>/dev/null) || die "walcast token could not mint the demo token"
console_help() {
  [ -n "$PAGE" ] && say "example page (live() of both tables): http://127.0.0.1:$PAGEPORT/#node=http://127.0.0.1:$SYNCPORT&token=$DEMO_TOKEN"
  say "live console: http://127.0.0.1:$SYNCPORT/console/  (paste the token, topics public.orders, public.customers)"
  printf '   demo token: %s\n' "$DEMO_TOKEN" >&2
  printf '   (minted with: WALCAST_JWT_SECRET=<the node'"'"'s secret> walcast token --dev --sub demo --ttl 24h --snapshot --topic public.orders,public.customers)\n' >&2
}
# The node must accept the token it is shown with.
exec 3<>"/dev/tcp/127.0.0.1/$SYNCPORT"
printf 'GET /console/stats HTTP/1.0\r\nAuthorization: Bearer %s\r\n\r\n' "$DEMO_TOKEN" >&3
STATUS=$(head -1 <&3)
exec 3<&-
case "$STATUS" in *" 200 "*) ;; *) cat "$DIR/sync.log" >&2; die "the sync node refused the demo token: $STATUS" ;; esac

# The example page and the client's one-file bundle (the package's API, as
# `walcast sync --console` embeds it), on a static server of their own: a
# page of another origin, as an application's would be.
PAGE=
if command -v python3 >/dev/null 2>&1; then
  mkdir -p "$DIR/page"
  cp "$HERE/page/index.html" "$HERE/../../fanout/sync/console/walcast.js" "$DIR/page/"
  python3 -m http.server --bind 127.0.0.1 --directory "$DIR/page" "$PAGEPORT" >"$DIR/page.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PAGEPORT") 2>/dev/null && { PAGE=1; break; }
    sleep 0.1
  done
  [ -n "$PAGE" ] || { cat "$DIR/page.log" >&2; die "the example page's server did not start"; }
  exec 3<>"/dev/tcp/127.0.0.1/$PAGEPORT"
  printf 'GET /walcast.js HTTP/1.0\r\n\r\n' >&3
  STATUS=$(head -1 <&3)
  exec 3<&-
  case "$STATUS" in *" 200 "*) ;; *) cat "$DIR/page.log" >&2; die "the example page's server does not serve the client: $STATUS" ;; esac
else
  say "python3 not found: the example page is not served (the console is)"
fi
console_help

COUNT=0
[ -n "$NONINTERACTIVE" ] && COUNT=7
say "walcast tail: every envelope published to NATS, one JSON line each (values over 256 bytes cut for the screen)"
"$WALCAST_BIN" tail --nats-url "nats://127.0.0.1:$NATSPORT" --count "$COUNT" &
TAIL=$!
PIDS+=($TAIL)
sleep 0.5

step() { say "$1"; printf '   %s\n' "$2" >&2; "${PSQL[@]}" -c "$2" >/dev/null; sleep 0.7; }
step "insert three orders (direct SQL: no application code involved)" \
  "INSERT INTO orders VALUES (1, 'new', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 4000))), (2, 'new', 'gift'), (3, 'new', NULL)"
step "update order 1's status: its 128 KB TOASTed notes are not rewritten, so they are listed under \"unchanged\"" \
  "UPDATE orders SET status = 'paid' WHERE id = 1"
step "delete order 3" "DELETE FROM orders WHERE id = 3"
step "an application event through the same ordered stream (pg_logical_emit_message)" \
  "SELECT pg_logical_emit_message(true, 'walcast.demo', '{\"event\":\"invoice-sent\",\"order\":1}')"
step "truncate orders" "TRUNCATE orders"

if [ -n "$NONINTERACTIVE" ]; then
  for _ in $(seq 1 $((DEMO_TIMEOUT * 10))); do
    kill -0 "$TAIL" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$TAIL" 2>/dev/null; then die "not every envelope arrived within ${DEMO_TIMEOUT}s"; fi
  wait "$TAIL" || die "walcast tail failed"
  say "demo complete: every change arrived"
  exit 0
fi

console_help
say "try your own writes:  ${PSQL[*]}"
say "Ctrl-C stops walcast, NATS and PostgreSQL and removes $DIR"
wait "$TAIL"
