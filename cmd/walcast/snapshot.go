package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

func newSnapshotCmd(env Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Backfill a table's existing rows into the stream (start, status, cancel)",
		Long: `snapshot start asks the active 'walcast run' to read a table's existing rows
into the stream: in primary-key chunks, interleaved with live changes (never
pausing them, taking no lock beyond a SELECT's), each row journaled as an
op "read" envelope between a snapshot-begin and a snapshot-end envelope.
Requests are rows of the journal's snapshots table; 'walcast run' takes them
in order, one at a time, and resumes an interrupted one from its last
journaled chunk. snapshot status lists them; snapshot cancel stops one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageErrorf("snapshot: name a subcommand: start, status or cancel\nRun 'walcast snapshot --help' for usage.")
		},
	}
	cmd.AddCommand(newSnapshotStartCmd(), newSnapshotStatusCmd(), newSnapshotCancelCmd())
	return cmd
}

// journalFlags are the flags every snapshot subcommand takes.
type journalFlags struct {
	url, schema string
}

func (f *journalFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "journal-url", "", "journal database (the --journal-url of walcast run, or its --database-url when that is unset)")
	cmd.Flags().StringVar(&f.schema, "journal-schema", journal.DefaultSchema, "schema of the journal")
}

// open opens the journal; the status subcommand, which only reads, opens
// it without migrating (journal.Config.ReadOnly).
func (f *journalFlags) open(cmd *cobra.Command, sub string) (*journal.Journal, error) {
	if f.url == "" {
		return nil, usageErrorf("snapshot %s: --journal-url is required (or set WALCAST_JOURNAL_URL): the database holding walcast run's journal", sub)
	}
	j, err := journal.Open(cmd.Context(), journal.Config{URL: f.url, Schema: f.schema, MaxConns: 2, ReadOnly: sub == "status"})
	if err != nil {
		return nil, startupError(err)
	}
	return j, nil
}

// parseTable reads schema.table (a bare name is in public; quote a part
// holding a dot as "a.b").
func parseTable(s string) (schema, table string, err error) {
	if s == "" {
		return "", "", usageErrorf("snapshot: --table is required: the table to snapshot, as schema.table")
	}
	if !strings.Contains(s, ".") || (strings.HasPrefix(s, `"`) && strings.Count(s, `"`) == 2 && strings.HasSuffix(s, `"`)) {
		s = "public." + s
	}
	schema, table, ok := decoder.SplitEntity(s)
	if !ok {
		return "", "", usageErrorf("snapshot: --table %q is not schema.table (double-quote a name that holds a dot or a quote: public.\"a.b\")", s)
	}
	return schema, table, nil
}

func newSnapshotStartCmd() *cobra.Command {
	var (
		jf        journalFlags
		table     string
		where     string
		chunkSize int
	)
	cmd := &cobra.Command{
		Use:   "start",
		Short: "Ask the active walcast run to snapshot a table",
		Long: `start records a snapshot request for --table and prints its id. The active
'walcast run' on this journal picks it up within a second (a standby's when it
takes over) and reads the table in chunks of --chunk-size rows in key order
(the primary key, or the replica identity index of a table without one); a
table with neither is refused with the fix. --where restricts the rows read:
it is SQL on the table's columns, spliced into the snapshot's SELECT, so it is
for a trusted operator. The table must be in the publication.

Exit status: 0 when the request was recorded, 2 for a bad flag or an
unreachable journal.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			schema, tbl, err := parseTable(table)
			if err != nil {
				return err
			}
			if chunkSize < 1 || chunkSize > journal.MaxSnapshotChunkSize {
				return usageErrorf("snapshot start: --chunk-size %d is out of range: give 1 to %d", chunkSize, journal.MaxSnapshotChunkSize)
			}
			j, err := jf.open(cmd, "start")
			if err != nil {
				return err
			}
			defer j.Close()
			id, err := j.RequestSnapshot(cmd.Context(), journal.SnapshotRequest{Schema: schema, Table: tbl, Where: where, ChunkSize: chunkSize})
			if err != nil {
				return withCode(exitUsage, err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "snapshot %d of %s requested; follow it with 'walcast snapshot status'\n", id, decoder.EntityName(schema, tbl))
			return withCode(exitFailed, err)
		},
	}
	jf.register(cmd)
	cmd.Flags().StringVar(&table, "table", "", "table to snapshot, schema.table (a bare name is in public)")
	cmd.Flags().StringVar(&where, "where", "", "SQL condition restricting the rows read, e.g. \"created_at > now() - interval '30 days'\"")
	cmd.Flags().IntVar(&chunkSize, "chunk-size", journal.DefaultSnapshotChunkSize, "rows per chunk (1 to 100000)")
	return cmd
}

func newSnapshotStatusCmd() *cobra.Command {
	var (
		jf     journalFlags
		all    bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List snapshots with their progress",
		Long: `status lists the open snapshots (pending and running; with --all, the 100
newest of every status), newest first: table, status, rows and chunks
journaled, the rate since it started, an estimate of the time left (from the
table's row estimate when it started; with --where an upper bound), and for a
failed one the reason with its fix. It only reads the journal: it never
creates or migrates one.

Exit status: 0, or 2 for a bad flag, an unreachable journal, or one missing
or at another version than this walcast's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			j, err := jf.open(cmd, "status")
			if err != nil {
				return err
			}
			defer j.Close()
			snaps, err := j.Snapshots(cmd.Context(), !all, 100)
			if err != nil {
				return startupError(err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if snaps == nil {
					snaps = []journal.Snapshot{}
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return withCode(exitFailed, enc.Encode(snaps))
			}
			if len(snaps) == 0 {
				what := "no open snapshots"
				if all {
					what = "no snapshots"
				}
				_, err := fmt.Fprintln(out, what)
				return withCode(exitFailed, err)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTABLE\tSTATUS\tROWS\tCHUNKS\tRATE\tETA\tNOTE")
			for _, s := range snaps {
				rate, eta := "-", "-"
				if s.StartedAt != nil && s.UpdatedAt != nil && s.Rows > 0 {
					end := *s.UpdatedAt
					if s.FinishedAt != nil {
						end = *s.FinishedAt
					}
					if d := end.Sub(*s.StartedAt); d > 0 {
						perSec := float64(s.Rows) / d.Seconds()
						rate = fmt.Sprintf("%.0f rows/s", perSec)
						eta = snapshotETA(s, perSec)
					}
				}
				note := s.Error
				if s.CancelRequested && s.Status == journal.SnapshotRunning {
					note = "cancel requested"
				}
				if note == "" && s.Where != "" {
					note = "where " + s.Where
				}
				if note == "" {
					note = "requested " + s.RequestedAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", s.ID, s.Entity(), s.Status, s.Rows, s.Chunks, rate, eta, note)
			}
			return withCode(exitFailed, tw.Flush())
		},
	}
	jf.register(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "list finished, cancelled and failed snapshots too")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

func newSnapshotCancelCmd() *cobra.Command {
	var (
		jf    journalFlags
		id    int64
		table string
	)
	cmd := &cobra.Command{
		Use:   "cancel",
		Short: "Cancel an open snapshot (--id, or every open one of --table)",
		Long: `cancel stops an open snapshot. A pending one is cancelled at once; a running
one is stopped by the active walcast run before its next chunk, which
journals its snapshot-end with "cancelled":true (the rows journaled before
stay in the journal; they are not the whole table).

Exit status: 0 when a snapshot was cancelled, 1 when none matched, 2 for a bad
flag or an unreachable journal.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var schema, tbl string
			switch {
			case id > 0 && table != "":
				return usageErrorf("snapshot cancel: give --id or --table, not both")
			case id > 0:
			case table != "":
				var err error
				if schema, tbl, err = parseTable(table); err != nil {
					return err
				}
			default:
				return usageErrorf("snapshot cancel: give --id N (see 'walcast snapshot status') or --table schema.table")
			}
			j, err := jf.open(cmd, "cancel")
			if err != nil {
				return err
			}
			defer j.Close()
			snaps, err := j.CancelSnapshots(cmd.Context(), id, schema, tbl)
			if err != nil {
				return startupError(err)
			}
			if len(snaps) == 0 {
				return withCode(exitFailed, errors.New("no open snapshot matched; list them with 'walcast snapshot status --all'"))
			}
			for _, s := range snaps {
				state := "cancelled"
				if s.Status == journal.SnapshotRunning {
					state = "cancel requested; walcast run stops it before its next chunk"
				}
				if _, err := fmt.Fprintf(cmd.OutOrStdout(), "snapshot %d of %s: %s\n", s.ID, s.Entity(), state); err != nil {
					return withCode(exitFailed, err)
				}
			}
			return nil
		},
	}
	jf.register(cmd)
	cmd.Flags().Int64Var(&id, "id", 0, "id of the snapshot to cancel")
	cmd.Flags().StringVar(&table, "table", "", "cancel every open snapshot of this table, schema.table")
	return cmd
}

// snapshotETA estimates the time a running snapshot has left at perSec rows
// a second, from the row estimate taken when it started: "-" when unknown
// or not running, "≤ …" under --where (the estimate counts the whole table).
func snapshotETA(s journal.Snapshot, perSec float64) string {
	if s.Status != journal.SnapshotRunning || s.EstimatedRows == nil || perSec <= 0 {
		return "-"
	}
	left := max(0, *s.EstimatedRows-s.Rows)
	d := time.Duration(float64(left) / perSec * float64(time.Second)).Round(time.Second)
	if s.Where != "" {
		return "≤ " + d.String()
	}
	return d.String()
}
