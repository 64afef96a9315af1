package main

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/replication"
)

func newSlotCmd(env Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "slot",
		Short: "Inspect or drop walcast's replication slot",
		Long: `slot status shows where the replication slot stands and who holds it;
slot drop removes it (only with --yes, and never while anything uses it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageErrorf("slot: name a subcommand: status or drop\nRun 'walcast slot --help' for usage.")
		},
	}
	cmd.AddCommand(newSlotStatusCmd(), newSlotDropCmd())
	return cmd
}

// slotFlags are the flags both slot subcommands take.
type slotFlags struct {
	databaseURL string
	slot        string
}

func (s *slotFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.databaseURL, "database-url", "", "source database, libpq URL or DSN (sslmode, sslrootcert, sslcert honoured)")
	cmd.Flags().StringVar(&s.slot, "slot", "walcast", "replication slot name")
}

func (s *slotFlags) check(sub string) error {
	if s.databaseURL == "" {
		return usageErrorf("slot %s: --database-url is required (or set WALCAST_DATABASE_URL)", sub)
	}
	return nil
}

// slotError maps an error of the slot subcommands to its exit code: a
// missing or busy slot is a failed check (1); a configuration or connection
// problem is exit 2.
func slotError(err error) error {
	if errors.Is(err, replication.ErrSlotNotFound) || errors.Is(err, replication.ErrSlotHeld) {
		return withCode(exitFailed, err)
	}
	return startupError(err)
}

func newSlotStatusCmd() *cobra.Command {
	var (
		sf     slotFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the slot's position, lag, WAL retention and holder",
		Long: `status shows the replication slot's plugin and database, its position
(restart_lsn, confirmed_flush_lsn), its lag in bytes (the server's current WAL
position minus confirmed_flush_lsn), the WAL it retains, wal_status and
safe_wal_size, and the session holding it: the active pid with its
application_name and client address (walcast's connections name themselves
"walcast"), or the walcast instance holding the slot's advisory lock.

Exit status: 0 when the slot exists, 1 when it does not, 2 when the database
cannot be reached or a flag is wrong.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := sf.check("status"); err != nil {
				return err
			}
			info, err := replication.SlotStatus(cmd.Context(), sf.databaseURL, sf.slot)
			if err != nil {
				return slotError(err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				err = enc.Encode(info)
			} else {
				err = info.WriteText(out)
			}
			return withCode(exitFailed, err)
		},
	}
	sf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	return cmd
}

func newSlotDropCmd() *cobra.Command {
	var (
		sf  slotFlags
		yes bool
	)
	cmd := &cobra.Command{
		Use:   "drop",
		Short: "Drop the slot (needs --yes; refuses while it is in use)",
		Long: `drop removes the replication slot so PostgreSQL stops retaining WAL for it.
Its position is lost: the next 'walcast run' on this journal stops (exit 1)
unless started with --recreate-lost-slot, which creates a new slot and
journals a resync entry telling clients to refetch.

drop refuses without --yes, and refuses while a session streams from the slot
or a walcast instance holds its advisory lock (it names the pid): stop every
'walcast run' using the slot, standbys included, first. While it drops, it
holds the slot's advisory lock itself so no standby can take over in between.

Exit status: 0 when the slot was dropped, 1 when it does not exist or is in
use, 2 without --yes, when the database cannot be reached or a flag is wrong.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := sf.check("drop"); err != nil {
				return err
			}
			if !yes {
				return usageErrorf("slot drop: refusing to drop slot %q without --yes: its position is lost, and the next 'walcast run' "+
					"stops unless started with --recreate-lost-slot (clients then resync)", sf.slot)
			}
			if err := replication.DropSlot(cmd.Context(), sf.databaseURL, sf.slot); err != nil {
				return slotError(err)
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "dropped replication slot %s\n", sf.slot)
			return withCode(exitFailed, err)
		},
	}
	sf.register(cmd)
	cmd.Flags().BoolVar(&yes, "yes", false, "really drop the slot (command line only; never read from the environment)")
	_ = cmd.Flags().SetAnnotation("yes", noEnv, []string{"true"})
	return cmd
}
