package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// noteCommandLine is a PersistentPreRunE that records in *into the flags
// given on the command line, then runs the root's hook, which sets the
// others from the environment (and marks them changed too). It lets a
// command prefer what its command line says over what the environment
// says when the two name different things of which only one may be used.
func noteCommandLine(into *map[string]bool) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		m := map[string]bool{}
		cmd.Flags().Visit(func(f *pflag.Flag) { m[f.Name] = true })
		*into = m
		if pre := cmd.Root().PersistentPreRunE; pre != nil {
			return pre(cmd, args)
		}
		return nil
	}
}
