// Command walcast streams every committed row change of a PostgreSQL
// publication into a durable journal and out to live clients.
//
// main owns signals and exit codes only; the commands parse flags and wire
// packages together.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first signal asks for a graceful stop; a second one aborts.
		<-sigs
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "walcast: second signal, aborting")
		os.Exit(130)
	}()
	code := Run(ctx, os.Args[1:], Env{Stdout: os.Stdout, Stderr: os.Stderr, LookupEnv: os.LookupEnv})
	cancel()
	os.Exit(code)
}
