package main

import (
	"github.com/spf13/cobra"

	"github.com/walcast/walcast/fanout/bus"
)

// natsFlags are the NATS connection flags shared by run, sync and tail.
type natsFlags struct {
	cfg bus.NATSConfig
}

func (n *natsFlags) register(cmd *cobra.Command, urlHelp string) {
	f := cmd.Flags()
	f.StringVar(&n.cfg.URL, "nats-url", "", urlHelp)
	f.StringVar(&n.cfg.User, "nats-user", "", "NATS user name")
	f.StringVar(&n.cfg.Password, "nats-password", "", "NATS password (prefer the environment variable)")
	f.StringVar(&n.cfg.Token, "nats-token", "", "NATS authentication token (prefer the environment variable)")
	f.StringVar(&n.cfg.CredsFile, "nats-creds", "", "NATS credentials file (user JWT and NKey seed)")
	f.StringVar(&n.cfg.NKeyFile, "nats-nkey", "", "NATS NKey seed file")
	f.StringVar(&n.cfg.CAFile, "nats-ca", "", "CA certificate that signed the NATS server's TLS certificate")
	f.StringVar(&n.cfg.CertFile, "nats-cert", "", "client TLS certificate for NATS")
	f.StringVar(&n.cfg.KeyFile, "nats-key", "", "client TLS key for NATS")
}
