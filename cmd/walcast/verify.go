package main

import (
	"encoding/json"
	"errors"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/replication"
)

func newVerifyCmd(env Env) *cobra.Command {
	var (
		cfg     replication.VerifyConfig
		asJSON  bool
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check that a database and publication are ready for walcast, with fixes to paste",
		Long: `verify connects to the source database and checks what walcast needs:
wal_level, free replication slots and WAL senders, the role's privileges, the
publication and its tables' replica identity, the slot, max_slot_wal_keep_size
and TLS; with --sync-role, that the sync nodes' role can read every published
table and nothing more. Each check is ok, warn or fail; every warn and fail comes with SQL or a
setting to fix it.

Exit status: 0 when nothing fails (warnings allowed), 1 when a check fails,
2 when the database cannot be reached or a flag is wrong.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.DatabaseURL == "" {
				return usageErrorf("verify: --database-url is required (or set WALCAST_DATABASE_URL)")
			}
			if cfg.Publication == "" {
				return usageErrorf("verify: --publication is required (or set WALCAST_PUBLICATION)")
			}
			report, err := replication.Verify(cmd.Context(), cfg)
			if err != nil {
				var rerr *replication.Error
				if errors.As(err, &rerr) && rerr.Code != replication.CodeInternal {
					return withCode(exitUsage, err)
				}
				return withCode(exitFailed, err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				err = enc.Encode(report)
			} else {
				err = report.WriteText(out, verbose)
			}
			if err != nil {
				return withCode(exitFailed, err)
			}
			if report.Failed() {
				return withCode(exitFailed, errors.New(""))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DatabaseURL, "database-url", "", "source database, libpq URL or DSN (sslmode, sslrootcert, sslcert honoured)")
	f.StringVar(&cfg.Publication, "publication", "", "publication to check (required)")
	f.StringVar(&cfg.Slot, "slot", "walcast", "replication slot name")
	f.StringVar(&cfg.JournalSchema, "journal-schema", "walcast", "schema of walcast's journal")
	f.StringVar(&cfg.JournalURL, "journal-url", "", "the journal's database, when not the source's (as walcast run --journal-url)")
	f.StringVar(&cfg.TenantColumn, "tenant-column", "", "column hoisted into the envelope's tenant, if any")
	f.StringVar(&cfg.SyncRole, "sync-role", "", "also check the role sync nodes read snapshots as (walcast sync --database-url; setup.sql -v sync_role=): it can log in and SELECT every published table, and cannot write, replicate or manage roles")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVar(&verbose, "verbose", false, "list every table's passing checks instead of folding them")
	return cmd
}
