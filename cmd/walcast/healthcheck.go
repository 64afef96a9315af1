package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// newHealthcheckCmd is a container health check that needs no shell or curl
// in the image: it asks the running walcast's own endpoint. It reads the same
// --http-listen (WALCAST_HTTP_LISTEN) as `run` and `sync`, so in a container
// configured through the environment `walcast healthcheck` finds the port by
// itself.
func newHealthcheckCmd() *cobra.Command {
	var (
		listen  string
		url     string
		path    string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 when the local walcast's /healthz answers 200 (for container health checks)",
		Long: `healthcheck sends GET http://<--http-listen><--path> (or --url) and exits 0
when the answer is 2xx, 1 otherwise, printing why. A wildcard listen address
(0.0.0.0, [::] or an empty host) is reached on the loopback address.

Use --path /readyz to check readiness instead (200 for an active or a standby
walcast run).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			target := url
			if target == "" {
				host, port, err := net.SplitHostPort(listen)
				if err != nil {
					return usageErrorf("healthcheck: --http-listen %q: %v", listen, err)
				}
				if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
					host = "127.0.0.1"
					if ip != nil && ip.To4() == nil {
						host = "::1"
					}
				}
				if !strings.HasPrefix(path, "/") {
					path = "/" + path
				}
				target = "http://" + net.JoinHostPort(host, port) + path
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
			if err != nil {
				return usageErrorf("healthcheck: %v", err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return withCode(exitFailed, fmt.Errorf("healthcheck: %w", err))
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			detail := strings.TrimSpace(string(body))
			if resp.StatusCode/100 != 2 {
				return withCode(exitFailed, fmt.Errorf("healthcheck: %s answered %s: %s", target, resp.Status, detail))
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", target, detail)
			return withCode(exitFailed, err)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "http-listen", "127.0.0.1:9187", "the --http-listen of the walcast to check")
	f.StringVar(&url, "url", "", "full URL to check instead of --http-listen and --path")
	f.StringVar(&path, "path", "/healthz", "endpoint to check: /healthz or /readyz")
	f.DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
	return cmd
}
