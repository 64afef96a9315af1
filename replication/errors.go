package replication

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Code classifies an error an operator can hit, so callers can branch on it
// (exit codes, retry or stop) and the operator gets a fix that names the
// setting to change.
type Code string

// The error codes. They are stable: they appear in logs and `verify --json`.
const (
	CodeConfig             Code = "config"              // malformed URL or flag
	CodeTLS                Code = "tls"                 // certificate, sslrootcert, handshake
	CodeAuth               Code = "auth"                // password, pg_hba, unknown role
	CodeUnreachable        Code = "unreachable"         // DNS, refused, timeout
	CodeDatabaseMissing    Code = "database_missing"    // the database does not exist
	CodeWalLevel           Code = "wal_level"           // wal_level is not logical
	CodePublicationMissing Code = "publication_missing" // the publication does not exist
	CodePrivilege          Code = "privilege"           // the role lacks REPLICATION or SELECT
	CodeSlotHeld           Code = "slot_held"           // another process streams from the slot
	CodeSlotLost           Code = "slot_lost"           // the slot is lost or vanished
	CodeInternal           Code = "internal"            // anything not classified
)

// Error is an error an operator can hit: what was being done, what happened,
// and how to fix it.
type Error struct {
	Code Code
	Op   string // what walcast was doing, e.g. "connect to the source database"
	Err  error  // the cause
	Fix  string // what the operator should do; empty when there is nothing to say
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	if e.Fix != "" {
		b.WriteString("\nfix: ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// CodeOf returns the code of the first *Error in err's chain, or CodeInternal.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ClassifyConnectError turns a failed connection attempt into an *Error with a
// code and a fix. what names the database for the message, e.g. "source
// database" or "journal database". It never includes a password.
func ClassifyConnectError(what string, err error) error {
	if err == nil {
		return nil
	}
	op := "connect to the " + what
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	var parseErr *pgconn.ParseConfigError
	if errors.As(err, &parseErr) {
		if strings.Contains(parseErr.Error(), "CA file") || strings.Contains(parseErr.Error(), "sslcert") ||
			strings.Contains(parseErr.Error(), "sslkey") || strings.Contains(parseErr.Error(), "certificate") {
			return &Error{Code: CodeTLS, Op: op, Err: err,
				Fix: "sslrootcert/sslcert/sslkey in the connection URL must name readable PEM files (check the path and the file's permissions for the user walcast runs as)"}
		}
		return &Error{Code: CodeConfig, Op: op, Err: err,
			Fix: "use a libpq URL (postgres://user:password@host:5432/dbname?sslmode=verify-full) or a key=value DSN (host=... dbname=... user=...)"}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "28P01":
			return &Error{Code: CodeAuth, Op: op, Err: err,
				Fix: "the password was rejected: check the user and password in the URL (or PGPASSWORD / ~/.pgpass)"}
		case pgErr.Code == "28000":
			return &Error{Code: CodeAuth, Op: op, Err: err,
				Fix: "the server refused this role: check that the role exists and that pg_hba.conf has a line allowing it from this host (for the replication connection, a line with database \"replication\"), then SELECT pg_reload_conf();"}
		case pgErr.Code == "3D000":
			return &Error{Code: CodeDatabaseMissing, Op: op, Err: err,
				Fix: "the database in the URL does not exist: fix its name, or create it with CREATE DATABASE"}
		case pgErr.Code == "53300":
			return &Error{Code: CodeUnreachable, Op: op, Err: err,
				Fix: "the server has no free connection slots: raise max_connections (needs a restart) or close idle sessions"}
		case pgErr.Code == "57P03":
			return &Error{Code: CodeUnreachable, Op: op, Err: err,
				Fix: "the server is starting up, shutting down or in recovery: wait and retry"}
		case strings.HasPrefix(pgErr.Code, "08"):
			return &Error{Code: CodeUnreachable, Op: op, Err: err, Fix: "check that the server is up and reachable"}
		}
	}
	if isTLSError(err) {
		return &Error{Code: CodeTLS, Op: op, Err: err,
			Fix: "the TLS handshake failed: set sslrootcert in the URL to the CA that signed the server's certificate (sslmode=verify-full also checks the host name), or check that the server has ssl=on"}
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return &Error{Code: CodeUnreachable, Op: op, Err: err,
			Fix: "the server did not answer in time: check the host and port, firewalls, and connect_timeout in the URL"}
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return &Error{Code: CodeUnreachable, Op: op, Err: err, Fix: "the host name does not resolve: check the host in the URL"}
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) || errors.Is(err, os.ErrNotExist) {
		return &Error{Code: CodeUnreachable, Op: op, Err: err,
			Fix: "nothing accepted the connection: check that PostgreSQL is running and that the host and port in the URL are right (listen_addresses, port)"}
	}
	return &Error{Code: CodeInternal, Op: op, Err: err}
}

func isTLSError(err error) bool {
	var (
		verr  *tls.CertificateVerificationError
		uaerr x509.UnknownAuthorityError
		herr  x509.HostnameError
		cierr x509.CertificateInvalidError
		rerr  tls.RecordHeaderError
		aerr  tls.AlertError
	)
	if errors.As(err, &verr) || errors.As(err, &uaerr) || errors.As(err, &herr) ||
		errors.As(err, &cierr) || errors.As(err, &rerr) || errors.As(err, &aerr) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "tls error") || strings.Contains(msg, "server refused TLS") ||
		strings.Contains(msg, "x509:") || strings.Contains(msg, "tls:")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// describeTarget describes a connection target with no secret in
// it: user@host:port/database.
func describeTarget(cfg *pgconn.Config) string {
	host := cfg.Host
	if strings.HasPrefix(host, "/") {
		host = "unix:" + host
	}
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, host, cfg.Port, cfg.Database)
}
