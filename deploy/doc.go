// Package deploy holds walcast's deployment files: the container image
// (Dockerfile), a compose file, Kubernetes manifests, systemd units, the
// PostgreSQL setup SQL and a Grafana dashboard. It has no Go code; its tests
// parse those files and check them against the real CLI (every WALCAST_*
// variable and --flag they use must exist on the command they run) and
// against the metrics walcast exports.
package deploy
