package journal

import (
	"errors"
	"strings"
)

// Sentinel errors for the conditions callers branch on. Test with errors.Is;
// they arrive wrapped in an *Error that says which operation failed and how
// to fix it.
var (
	// ErrFenced: the caller's fencing generation is no longer the current one;
	// another replicator has taken over. Nothing was written. Terminal for the
	// caller: it must stop appending (and may Acquire again only if it is
	// legitimately the leader).
	ErrFenced = errors.New("fenced: a newer replicator holds the journal")

	// ErrCursorTampered: the cursor is malformed or its HMAC does not verify
	// under the current or any previous cursor secret.
	ErrCursorTampered = errors.New("cursor is malformed or not signed by this deployment")

	// ErrCursorScope: the cursor is authentic but was issued for a different
	// scope (entities or tenant) than the query presents it with.
	ErrCursorScope = errors.New("cursor was issued for a different scope")

	// ErrForeignJournal: the cursor is authentic but was issued by a different
	// journal (journal id mismatch). Returned only when
	// Config.RejectForeignJournal is set; otherwise such a cursor leads to a
	// resync (DESIGN §5).
	ErrForeignJournal = errors.New("cursor was issued by a different journal")

	// ErrNoCursorSecret: cursors were needed but Config.CursorSecret is empty.
	ErrNoCursorSecret = errors.New("no cursor secret configured")

	// ErrClosed: the journal was closed.
	ErrClosed = errors.New("journal is closed")

	// ErrSchemaTooNew: the journal schema was migrated by a newer walcast.
	ErrSchemaTooNew = errors.New("journal schema is newer than this walcast")

	// ErrSchemaTooOld: a read-only Open (Config.ReadOnly) found the journal
	// at an older schema version, which only a migrating Open upgrades.
	ErrSchemaTooOld = errors.New("journal schema is older than this walcast")

	// ErrNoJournal: a read-only Open found no journal in the schema.
	ErrNoJournal = errors.New("no journal")
)

// Error is the journal's error type: the operation that failed, its cause and,
// where a person can act on it, a fix.
type Error struct {
	Op  string // e.g. "journal.Append"
	Err error  // the cause; never nil
	Fix string // operator-facing remedy; may be empty
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	if e.Fix != "" {
		b.WriteString(" (fix: ")
		b.WriteString(e.Fix)
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

func opErr(op string, err error, fix string) error {
	return &Error{Op: op, Err: err, Fix: fix}
}
