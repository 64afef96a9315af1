package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit codes (DESIGN §2).
const (
	exitOK      = 0
	exitFailed  = 1 // a check or the run failed
	exitUsage   = 2 // usage or configuration error, unreachable database at start-up
	exitStandby = 3 // another replicator holds the slot and --standby=false
)

// Env is what a command may touch of the process: its output streams and its
// environment. Tests pass their own.
type Env struct {
	Stdout, Stderr io.Writer
	LookupEnv      func(string) (string, bool)
}

// exitError carries the exit code for an error; errors without one are usage
// errors from flag parsing.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

// usageErrorf reports a bad flag or missing setting (exit 2).
func usageErrorf(format string, args ...any) error {
	return withCode(exitUsage, fmt.Errorf(format, args...))
}

// Run executes walcast with args and returns the process exit code.
func Run(ctx context.Context, args []string, env Env) int {
	root := newRootCmd(env)
	root.SetArgs(args)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintf(env.Stderr, "walcast: %v\n", ee.err)
		}
		return ee.code
	}
	// Cobra's own errors: unknown command or flag, bad flag value.
	fmt.Fprintf(env.Stderr, "walcast: %v\nRun 'walcast --help' for usage.\n", err)
	return exitUsage
}

func newRootCmd(env Env) *cobra.Command {
	root := &cobra.Command{
		Use:   "walcast",
		Short: "Stream every committed PostgreSQL row change to a durable journal and live clients",
		Long: `walcast runs next to a PostgreSQL database. It holds a logical replication
slot on a publication, journals every committed change durably before
acknowledging it, and fans the stream out over NATS and WebSockets.

Every flag can also be set with an environment variable WALCAST_<FLAG>, e.g.
--database-url as WALCAST_DATABASE_URL. A flag on the command line wins.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return applyEnv(cmd, env.LookupEnv)
		},
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageErrorf("%v\nRun '%s --help' for usage.", err, cmd.CommandPath())
	})
	root.AddCommand(newVersionCmd(), newVerifyCmd(env), newRunCmd(env), newTailCmd(env), newSyncCmd(env), newSlotCmd(env), newSnapshotCmd(env), newTypesCmd(env), newHealthcheckCmd(), newTokenCmd())
	annotateEnv(root)
	return root
}

// envName is the environment variable that sets a flag: WALCAST_ and the
// flag's name in upper snake case.
func envName(flag string) string {
	return "WALCAST_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// noEnv marks a flag that only the command line may set: a confirmation such
// as `slot drop --yes` must never come from an environment left behind.
const noEnv = "walcast_no_env"

func commandLineOnly(f *pflag.Flag) bool {
	_, ok := f.Annotations[noEnv]
	return ok || f.Name == "help"
}

// applyEnv sets every flag of cmd that was not given on the command line from
// its environment variable, if that is set. A bad value is a usage error that
// names the variable.
func applyEnv(cmd *cobra.Command, lookup func(string) (string, bool)) error {
	if lookup == nil {
		return nil
	}
	var firstErr error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || firstErr != nil || commandLineOnly(f) {
			return
		}
		name := envName(f.Name)
		val, ok := lookup(name)
		if !ok {
			return
		}
		if err := cmd.Flags().Set(f.Name, val); err != nil {
			firstErr = usageErrorf("environment variable %s: %v", name, err)
		}
	})
	return firstErr
}

// annotateEnv appends each flag's environment variable to its help text, for
// every command in the tree.
func annotateEnv(cmd *cobra.Command) {
	note := func(f *pflag.Flag) {
		if commandLineOnly(f) || strings.Contains(f.Usage, "[$WALCAST_") {
			return
		}
		f.Usage += " [$" + envName(f.Name) + "]"
	}
	cmd.Flags().VisitAll(note)
	cmd.PersistentFlags().VisitAll(note)
	for _, c := range cmd.Commands() {
		annotateEnv(c)
	}
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print walcast's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "walcast %s\n", version)
			return err
		},
	}
}
