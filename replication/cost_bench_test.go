package replication

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// BenchmarkE2ECost measures what `walcast run` costs the source server
// while it catches up on WAL written while it was away, next to
// pg_recvlogical draining the same WAL from its own slot in the same run
// (DESIGN §5, "Cost on the primary"). For each journal placement — the
// source database (the default), another database of the same server,
// another server (a second cluster the benchmark starts) — and each
// workload — 1,000-row transactions, single-row transactions — it prints:
//
//   - the wall rate of walcast and of pg_recvlogical;
//   - CPU per change: walcast (this process, which runs the replicator),
//     pg_recvlogical, PostgreSQL as a whole (the postmaster and every
//     backend of the source cluster, live or exited) and the walsender
//     that served each one; with the journal on another server, that
//     server's CPU too;
//   - WAL bytes: the workload's (written while walcast is stopped), and
//     what the source server wrote while walcast caught up, per workload
//     WAL byte (and the journal server's, when it is another one);
//   - the average envelope size against the source row's size;
//   - with pg_walinspect, the catch-up's WAL on the journal's server broken
//     down by resource manager, record type and relation.
//
// Both servers are durable (fsync on, synchronous_commit on) and every
// measured phase starts right after a CHECKPOINT, so full-page images
// count alike in each. Run it alone (make bench-cost):
//
//	go test ./replication -run '^$' -bench E2ECost -benchtime 1x -timeout 60m
//
// Environment: WALCAST_BENCH_ROWS (rows of the batched workload, default
// 1,000,000), WALCAST_BENCH_SINGLE_ROWS (single-row transactions, default
// 200,000), WALCAST_BENCH_PLACEMENTS (a comma-separated subset of
// source,otherdb,otherserver), WALCAST_BENCH_BREAKDOWN=0 to skip the WAL
// breakdown.
func BenchmarkE2ECost(b *testing.B) {
	rows := envInt("WALCAST_BENCH_ROWS", 1_000_000)
	single := envInt("WALCAST_BENCH_SINGLE_ROWS", 200_000)
	placements := []string{"source", "otherdb", "otherserver"}
	if v := os.Getenv("WALCAST_BENCH_PLACEMENTS"); v != "" {
		placements = strings.Split(v, ",")
	}
	breakdown := os.Getenv("WALCAST_BENCH_BREAKDOWN") != "0"
	settings := map[string]string{
		"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on",
		"shared_buffers": "256MB", "max_wal_size": "8GB", "checkpoint_timeout": "60min",
		// The catch-up's WAL must still be there for pg_walinspect.
		"wal_keep_size": "8GB",
	}
	src := pgtest.Start(b, pgtest.Options{Settings: settings})
	var other *pgtest.Cluster
	var results []*costResult
	for _, where := range placements {
		if where == "otherserver" && other == nil {
			other = pgtest.Start(b, pgtest.Options{Settings: settings})
		}
		for _, w := range []struct {
			name         string
			rows, perTxn int
		}{{"txn=1000rows", rows, 1000}, {"txn=1row", single, 1}} {
			if w.rows <= 0 {
				continue
			}
			r := &costResult{placement: where, workload: w.name, rows: w.rows}
			b.Run("journal="+where+"/"+w.name, func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					measureCost(b, src, other, r, w.perTxn, breakdown)
				}
			})
			results = append(results, r)
		}
	}
	var out bytes.Buffer
	printCost(&out, results)
	fmt.Print(out.String())
}

// costResult is one placement and workload's measurements.
type costResult struct {
	placement, workload string
	rows                int
	done                bool

	workloadWAL   int64   // source WAL bytes of the workload
	tupleBytes    float64 // average source row (pg_column_size of the row)
	envelopeBytes float64 // average envelope (entries.size)

	// pg_recvlogical's drain: wall time, its own CPU, the source
	// cluster's CPU, its walsender's CPU, the source WAL meanwhile.
	recvWall                    time.Duration
	recvCPU, recvPG, recvSender time.Duration
	recvWAL                     int64

	// walcast's catch-up: the same, and the journal server's WAL and CPU
	// when it is another server; batch is the number of appends.
	walcastWall                          time.Duration
	walcastCPU, walcastPG, walcastSender time.Duration
	walcastWAL                           int64
	journalWAL                           int64
	journalPG                            time.Duration
	batch                                int64
	roles                                map[string]time.Duration // source cluster CPU by process role

	// With pg_walinspect: the catch-up's WAL on the journal's server and
	// the workload's, by record kind and relation, with their summed
	// record lengths; walRangeBytes is the catch-up's LSN range there.
	walRecords, workloadRecords           []walRow
	walRecordsTotal, workloadRecordsTotal int64
	walRangeBytes                         int64
}

type walRow struct {
	rmgr, record, rel string
	count, rec, fpi   int64
}

func measureCost(b *testing.B, src, other *pgtest.Cluster, r *costResult, perTxn int, breakdown bool) {
	ctx := context.Background()
	url := src.NewDatabase(b)
	journalURL, journalCluster := url, src
	switch r.placement {
	case "source":
	case "otherdb":
		journalURL = src.NewDatabase(b)
	case "otherserver":
		journalURL, journalCluster = other.NewDatabase(b), other
	default:
		b.Fatalf("unknown placement %q (want source, otherdb or otherserver)", r.placement)
	}
	// Slot names are per server; sub-benchmarks share the servers.
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	slot, recvSlot := "walcast_"+suffix, "recv_"+suffix
	execSQL(b, url,
		`CREATE TABLE bench (id bigint PRIMARY KEY, account text, amount numeric(12,2), status text, payload jsonb, created_at timestamptz)`,
		`CREATE PUBLICATION pub FOR TABLE bench`,
		`SELECT pg_create_logical_replication_slot('`+recvSlot+`', 'pgoutput')`)
	if breakdown {
		execSQL(b, journalURL, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	}
	j, err := journal.Open(ctx, journal.Config{URL: journalURL})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	cfg := Config{DatabaseURL: url, Publication: "pub", Slot: slot, Standby: true, StatusInterval: time.Second}
	// Create walcast's slot and journal state, then stop it so that the
	// workload accumulates as WAL.
	rep, err := New(cfg, j)
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rep.Run(rctx) }()
	for rep.State().Role != RoleActive {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done

	execSQL(b, url, "CHECKPOINT")
	w0 := currentLSN(b, url)
	writeWorkload(b, url, r.rows, perTxn)
	end := currentLSN(b, url)
	r.workloadWAL = int64(end - w0)
	pgtest.MustQueryRow(b, url, `SELECT avg(pg_column_size(t.*))::float8 FROM bench t`, nil, &r.tupleBytes)
	if breakdown {
		execSQL(b, url, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
		r.workloadRecords, r.workloadRecordsTotal = walBreakdown(b, url, w0, end)
	}

	// pg_recvlogical drains its slot up to the same end position.
	execSQL(b, url, "CHECKPOINT")
	l0, pg0 := currentLSN(b, url), clusterCPU(b, src)
	start := time.Now()
	cmd := exec.Command(filepath.Join(src.BinDir(), "pg_recvlogical"), "-d", url, "-S", recvSlot, "--start",
		"-E", end.String(), "-f", "/dev/null", "--no-loop",
		"-o", "proto_version=2", "-o", "publication_names=pub", "-o", "streaming=on", "-o", "messages=true")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sender := watchSender(url, recvSlot)
	if err := cmd.Wait(); err != nil {
		b.Fatalf("pg_recvlogical: %v\n%s", err, out.String())
	}
	r.recvWall = time.Since(start)
	r.recvCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	// Its walsender exits with it; once reaped, its time is in the
	// postmaster's.
	r.recvSender = sender.stopAfterExit(5 * time.Second)
	r.recvPG = clusterCPU(b, src) - pg0
	r.recvWAL = int64(currentLSN(b, url) - l0)

	// walcast catches up until its watermark reaches the end position.
	execSQL(b, url, "CHECKPOINT")
	if journalCluster != src {
		execSQL(b, journalURL, "CHECKPOINT")
	}
	s0, pg0 := currentLSN(b, url), clusterCPU(b, src)
	j0, jpg0 := currentLSN(b, journalURL), clusterCPU(b, journalCluster)
	jcfg, err := pgx.ParseConfig(journalURL)
	if err != nil {
		b.Fatal(err)
	}
	jdb := jcfg.Database
	snap0, reaped0 := snapCluster(b, src, jdb)
	cpu0 := selfCPU()
	start = time.Now()
	rep, err = New(cfg, j)
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel = context.WithCancel(ctx)
	defer cancel()
	go func() { done <- rep.Run(rctx) }()
	sender = watchSender(url, slot)
	for decoder.LSN(rep.watermark.Load()) < end || rep.Stats().Changes.Load() < uint64(r.rows) {
		time.Sleep(20 * time.Millisecond)
	}
	r.walcastWall = time.Since(start)
	r.walcastCPU = selfCPU() - cpu0
	r.walcastSender = sender.stop()
	r.walcastPG = clusterCPU(b, src) - pg0
	snap1, reaped1 := snapCluster(b, src, jdb)
	r.roles = roleDelta(snap0, snap1, reaped0, reaped1)
	s1, j1 := currentLSN(b, url), currentLSN(b, journalURL)
	r.walcastWAL = int64(s1 - s0)
	if journalCluster != src {
		r.journalWAL = int64(j1 - j0)
		r.journalPG = clusterCPU(b, journalCluster) - jpg0
	}
	r.batch = int64(rep.Stats().Batches.Load())
	cancel()
	<-done
	pgtest.MustQueryRow(b, journalURL, `SELECT avg(size)::float8 FROM walcast.entries`, nil, &r.envelopeBytes)
	if breakdown {
		r.walRangeBytes = int64(j1 - j0)
		r.walRecords, r.walRecordsTotal = walBreakdown(b, journalURL, j0, j1)
	}
	r.done = true
	b.ReportMetric(float64(r.rows)/r.walcastWall.Seconds(), "walcast_changes/s")
	b.ReportMetric(float64(r.rows)/r.recvWall.Seconds(), "recvlogical_changes/s")
	b.ReportMetric(float64(r.walcastWAL)/float64(r.workloadWAL), "wal_ratio")
}

// walBreakdown sums the WAL records between from and to on the server of
// url (pg_walinspect) by resource manager, record type and the relation of
// their first block, named when it belongs to url's database. total is the
// records' summed length, full-page images included.
func walBreakdown(b *testing.B, url string, from, to decoder.LSN) (rows []walRow, total int64) {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	// pg_walinspect reads flushed WAL only; the WAL writer flushes what
	// no commit did (the last records of a workload may be such) within
	// wal_writer_delay.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var flushed bool
		if err := conn.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn`, to.String()).Scan(&flushed); err != nil {
			b.Fatal(err)
		}
		if flushed {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("WAL up to %s not flushed after 10 s", to)
		}
	}
	const q = `WITH r AS (
		SELECT resource_manager AS rm, record_type AS rt, record_length AS len, fpi_length AS fpi,
		       substring(block_ref FROM 'rel \d+/(\d+)/\d+')::oid AS db,
		       substring(block_ref FROM 'rel \d+/\d+/(\d+)')::oid AS node
		FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)),
	g AS (SELECT rm, rt, db, node, count(*) AS n, sum(len - fpi) AS rec, sum(fpi) AS fpi FROM r GROUP BY 1, 2, 3, 4)
	SELECT rm, rt,
	       CASE WHEN db IS NULL THEN '-'
	            WHEN db = 0 THEN 'shared catalog'
	            WHEN db <> (SELECT oid FROM pg_database WHERE datname = current_database()) THEN 'other database'
	            ELSE coalesce(
	                (SELECT 'TOAST of ' || o.oid::regclass FROM pg_class o WHERE o.reltoastrelid = pg_filenode_relation(0, node)),
	                (SELECT 'TOAST index of ' || o.oid::regclass FROM pg_class o JOIN pg_index i ON i.indrelid = o.reltoastrelid
	                    WHERE i.indexrelid = pg_filenode_relation(0, node)),
	                pg_filenode_relation(0, node)::regclass::text, 'relfilenode ' || node) END,
	       n, rec, fpi
	FROM g`
	rs, err := conn.Query(ctx, q, from.String(), to.String())
	if err != nil {
		b.Fatal(err)
	}
	m := map[[3]string]*walRow{}
	var w walRow
	_, err = pgx.ForEachRow(rs, []any{&w.rmgr, &w.record, &w.rel, &w.count, &w.rec, &w.fpi}, func() error {
		// Catalog and TOAST relations are many; one line each for them.
		rel := w.rel
		if strings.HasPrefix(rel, "pg_") {
			rel = "catalog"
		}
		k := [3]string{w.rmgr, w.record, rel}
		if m[k] == nil {
			m[k] = &walRow{rmgr: w.rmgr, record: w.record, rel: rel}
		}
		m[k].count += w.count
		m[k].rec += w.rec
		m[k].fpi += w.fpi
		total += w.rec + w.fpi
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, v := range m {
		rows = append(rows, *v)
	}
	sortWalRows(rows)
	return rows, total
}

func sortWalRows(rows []walRow) {
	sort.Slice(rows, func(a, b int) bool { return rows[a].rec+rows[a].fpi > rows[b].rec+rows[b].fpi })
}

// printCost writes the results as Markdown tables.
func printCost(w *bytes.Buffer, rs []*costResult) {
	us := func(d time.Duration, n int) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/float64(n)) }
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| journal | workload | changes | walcast changes/s | pg_recvlogical changes/s | rate ratio | workload WAL MB | walcast WAL on source MB | WAL ratio | journal server WAL MB | PostgreSQL µs/change walcast / recv | walsender µs/change walcast / recv | client µs/change walcast / recv | journal server µs/change | envelope B / row B | batches |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		if !r.done {
			continue
		}
		jw, jpg := "-", "-"
		if r.placement == "otherserver" {
			jw = fmt.Sprintf("%.1f", float64(r.journalWAL)/1e6)
			jpg = us(r.journalPG, r.rows)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %.0f | %.2f | %.1f | %.1f | %.2f | %s | %s / %s | %s / %s | %s / %s | %s | %.0f / %.0f | %d |\n",
			r.placement, r.workload, r.rows,
			float64(r.rows)/r.walcastWall.Seconds(), float64(r.rows)/r.recvWall.Seconds(), r.recvWall.Seconds()/r.walcastWall.Seconds(),
			float64(r.workloadWAL)/1e6, float64(r.walcastWAL)/1e6, float64(r.walcastWAL)/float64(r.workloadWAL), jw,
			us(r.walcastPG, r.rows), us(r.recvPG, r.rows), us(r.walcastSender, r.rows), us(r.recvSender, r.rows),
			us(r.walcastCPU, r.rows), us(r.recvCPU, r.rows), jpg, r.envelopeBytes, r.tupleBytes, r.batch)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Source WAL while pg_recvlogical drained (background): ")
	for _, r := range rs {
		if r.done {
			fmt.Fprintf(w, "  %s/%s: %d bytes\n", r.placement, r.workload, r.recvWAL)
		}
	}
	fmt.Fprintln(w, "\nSource cluster CPU during walcast's catch-up, µs per change by process role:")
	for _, r := range rs {
		if !r.done {
			continue
		}
		var parts []string
		for role, d := range r.roles {
			if d > 0 {
				parts = append(parts, fmt.Sprintf("%s %s", role, us(d, r.rows)))
			}
		}
		sort.Strings(parts)
		fmt.Fprintf(w, "  %s/%s: %s\n", r.placement, r.workload, strings.Join(parts, ", "))
	}
	for _, r := range rs {
		if !r.done || r.walRecords == nil {
			continue
		}
		fmt.Fprintf(w, "\nWAL of the workload, journal=%s %s: %d changes, %d bytes of WAL (%.1f per change; records %d bytes, the rest is page headers and alignment)\n\n",
			r.placement, r.workload, r.rows, r.workloadWAL, float64(r.workloadWAL)/float64(r.rows), r.workloadRecordsTotal)
		printWalRows(w, r.workloadRecords, r.workloadRecordsTotal, r.rows)
		fmt.Fprintf(w, "\nWAL of the catch-up on the journal's server, journal=%s %s: %d changes, %d bytes of WAL (%.1f per change; records %d bytes, the rest is page headers and alignment)\n\n",
			r.placement, r.workload, r.rows, r.walRangeBytes, float64(r.walRangeBytes)/float64(r.rows), r.walRecordsTotal)
		printWalRows(w, r.walRecords, r.walRecordsTotal, r.rows)
	}
}

// printWalRows prints a WAL breakdown as a Markdown table; lines under
// 0.01% of the total are summed in one.
func printWalRows(w *bytes.Buffer, rows []walRow, total int64, changes int) {
	fmt.Fprintln(w, "| resource manager | record | relation | records | record bytes | FPI bytes | bytes/change | share |")
	fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---:|")
	var rest walRow
	for _, x := range rows {
		t := x.rec + x.fpi
		if float64(t) < 0.0001*float64(total) {
			rest.count += x.count
			rest.rec += x.rec
			rest.fpi += x.fpi
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %d | %d | %.2f | %.2f%% |\n", x.rmgr, x.record, x.rel, x.count, x.rec, x.fpi,
			float64(t)/float64(changes), 100*float64(t)/float64(total))
	}
	if rest.count > 0 {
		t := rest.rec + rest.fpi
		fmt.Fprintf(w, "| (each under 0.01%%) | | | %d | %d | %d | %.2f | %.2f%% |\n", rest.count, rest.rec, rest.fpi,
			float64(t)/float64(changes), 100*float64(t)/float64(total))
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

// clockTick is the kernel's USER_HZ, the unit of /proc/<pid>/stat times.
const clockTick = 10 * time.Millisecond

// statTicks returns utime+stime of pid, plus cutime+cstime (its reaped
// children) when children is set, in clock ticks; ppid is its parent.
func statTicks(pid int, children bool) (ticks int64, ppid int, ok bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// Fields after the command, which may hold spaces: state, ppid, ...,
	// utime and stime are the 12th and 13th, cutime and cstime the 14th
	// and 15th.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 15 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	last := 12
	if children {
		last = 14
	}
	for _, s := range f[11 : last+1] {
		v, _ := strconv.ParseInt(s, 10, 64)
		ticks += v
	}
	return ticks, ppid, true
}

// clusterCPU is the CPU time the cluster's processes have used so far: the
// postmaster's, its live children's, and that of its children that exited
// (reaped by the postmaster, so in its cutime and cstime).
func clusterCPU(b *testing.B, c *pgtest.Cluster) time.Duration {
	b.Helper()
	var total time.Duration
	snap, reaped := snapCluster(b, c, "")
	for _, t := range snap {
		total += time.Duration(t.ticks) * clockTick
	}
	return total + time.Duration(reaped)*clockTick
}

// selfCPU is this process's user and system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// senderWatch follows the CPU time of the walsender that serves a slot:
// the walsender starts after the client connects and exits with it, so
// its /proc entry is sampled until stop (or its exit).
type senderWatch struct {
	once  sync.Once
	ticks atomic.Int64
	quit  chan struct{}
	done  chan struct{}
}

func watchSender(url, slot string) *senderWatch {
	w := &senderWatch{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return
		}
		pid := 0
		for pid == 0 {
			var p *int32
			if err := conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&p); err != nil {
				conn.Close(ctx)
				return
			}
			if p != nil {
				pid = int(*p)
				break
			}
			select {
			case <-w.quit:
				conn.Close(ctx)
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		conn.Close(ctx)
		// Sampled rarely, and once more at stop: the sampling is CPU of
		// the benchmark's process, which is counted as walcast's.
		for {
			t, _, ok := statTicks(pid, false)
			if !ok {
				return
			}
			w.ticks.Store(t)
			select {
			case <-w.quit:
				if t, _, ok := statTicks(pid, false); ok {
					w.ticks.Store(t)
				}
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return w
}

// stop ends the watch and returns the walsender's CPU time as last seen.
func (w *senderWatch) stop() time.Duration {
	w.once.Do(func() { close(w.quit) })
	<-w.done
	return time.Duration(w.ticks.Load()) * clockTick
}

// roleCPU splits a cluster's CPU time by process role, from a snapshot at
// the start of a phase to one at its end: "walsender", "journal backend"
// (sessions connected to the journal's database), "other backend",
// "autovacuum", the auxiliary processes by name ("walwriter",
// "checkpointer", ...), and "exited" for processes that ended meanwhile
// (their time is in the postmaster's cutime/cstime).
type procSnap map[int]procTick

type procTick struct {
	ticks int64
	role  string
}

func snapCluster(b *testing.B, c *pgtest.Cluster, journalDB string) (procSnap, int64) {
	b.Helper()
	pidFile, err := os.ReadFile(filepath.Join(c.DataDir(), "postmaster.pid"))
	if err != nil {
		b.Fatal(err)
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(pidFile), "\n", 2)[0]))
	if err != nil {
		b.Fatalf("postmaster.pid: %v", err)
	}
	// A child reaped between reading the postmaster's reaped-children
	// time and reading the child would be counted twice or not at all:
	// read again until the postmaster's figure holds still around the
	// scan of its children.
	for attempt := 0; ; attempt++ {
		before, _, _ := statTicks(pm, true)
		own, _, _ := statTicks(pm, false)
		snap := procSnap{pm: {own, "postmaster"}}
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			t, ppid, ok := statTicks(pid, false)
			if !ok || ppid != pm {
				continue
			}
			cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			snap[pid] = procTick{t, processRole(string(bytes.TrimRight(cmdline, "\x00")), journalDB)}
		}
		after, _, _ := statTicks(pm, true)
		if after == before || attempt == 10 {
			return snap, before - own
		}
	}
}

// processRole names a postgres process by its title ("postgres:
// walsender postgres [local] START_REPLICATION", "postgres: postgres
// t123_bench [local] idle", "postgres: checkpointer").
func processRole(title, journalDB string) string {
	t := strings.TrimPrefix(title, "postgres: ")
	f := strings.Fields(t)
	switch {
	case len(f) == 0:
		return "other"
	case f[0] == "walsender":
		return "walsender"
	case strings.HasPrefix(t, "autovacuum"):
		return "autovacuum"
	case len(f) >= 2 && f[1] == journalDB:
		return "journal backend"
	case len(f) >= 3 && (f[2] == "[local]" || strings.Contains(f[2], ":") || strings.Contains(f[2], ".")):
		return "other backend"
	}
	return t
}

// roleDelta is the CPU by role between two snapshots; exited is the
// growth of the postmaster's reaped-children time.
func roleDelta(s0, s1 procSnap, reaped0, reaped1 int64) map[string]time.Duration {
	m := map[string]time.Duration{}
	for pid, t := range s1 {
		d := t.ticks
		if p, ok := s0[pid]; ok {
			d -= p.ticks
		}
		m[t.role] += time.Duration(d) * clockTick
	}
	if d := reaped1 - reaped0; d > 0 {
		m["exited"] += time.Duration(d) * clockTick
	}
	return m
}

// stopAfterExit waits up to d for the walsender to exit and be reaped,
// then stops the watch as stop does.
func (w *senderWatch) stopAfterExit(d time.Duration) time.Duration {
	select {
	case <-w.done:
	case <-time.After(d):
	}
	return w.stop()
}
