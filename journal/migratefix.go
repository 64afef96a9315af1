package journal

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// grantCreateFix is the remedy when the journal role may not create the
// journal's schema or tables.
const grantCreateFix = "check that the journal role may CREATE in the database (GRANT CREATE ON DATABASE …) and that --journal-url points at the right database"

// migrateFix is the remedy for a failure to create or migrate the journal
// schema. That is the journal's first use of the database, so a wrong
// password, a missing database or an unreachable server show up here too:
// the remedy follows the SQLSTATE, or the network error, rather than
// assuming a missing privilege.
func migrateFix(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "28P01":
			return "the password was rejected: check the user and password in --journal-url (or PGPASSWORD / ~/.pgpass)"
		case pgErr.Code == "28000":
			return "the server refused this role: check that the role in --journal-url exists and that pg_hba.conf has a line allowing it from this host, then SELECT pg_reload_conf();"
		case pgErr.Code == "3D000":
			return "the database in --journal-url does not exist: fix its name, or create it with CREATE DATABASE"
		case pgErr.Code == "53300":
			return "the server has no free connection slots: raise max_connections (needs a restart) or close idle sessions"
		case pgErr.Code == "57P03":
			return "the server is starting up, shutting down or in recovery: wait and retry"
		case pgErr.Code == "25006":
			return "the journal database is read-only (a standby, or default_transaction_read_only): point --journal-url at the primary"
		case strings.HasPrefix(pgErr.Code, "08"):
			return "check that the server in --journal-url is up and reachable"
		}
		return grantCreateFix
	}
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case errors.As(err, &dnsErr):
		return "the host name does not resolve: check the host in --journal-url"
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()):
		return "the server did not answer in time: check the host and port in --journal-url, firewalls, and connect_timeout"
	case errors.As(err, &netErr):
		return "nothing accepted the connection: check that PostgreSQL is running and that the host and port in --journal-url are right (listen_addresses, port)"
	}
	return grantCreateFix
}
