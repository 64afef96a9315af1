package decoder

import (
	"errors"
	"fmt"
)

// Sentinel causes of a ProtocolError, for errors.Is.
var (
	// ErrTruncated: the payload ended before the message did.
	ErrTruncated = errors.New("message truncated")
	// ErrMalformed: a field holds a value the protocol does not allow.
	ErrMalformed = errors.New("malformed message")
	// ErrUnknownRelation: a change names a relation OID for which no
	// Relation message has been received on this connection.
	ErrUnknownRelation = errors.New("change for a relation never described by a Relation message")
	// ErrSequence: a message arrived where the protocol does not allow it (a
	// change outside a transaction, a Begin inside one, a stream chunk for a
	// transaction whose first chunk was never seen).
	ErrSequence = errors.New("message out of sequence")
)

// ProtocolError reports pgoutput input the decoder cannot accept. The
// decoder's state after one is unspecified: the replication loop must drop
// the connection and call Reset before decoding the next stream.
type ProtocolError struct {
	Type   byte   // the pgoutput message type ('B', 'I', 'U', ...)
	WAL    LSN    // the WAL start of the XLogData payload
	Offset int    // byte offset in the payload where decoding failed
	Detail string // what was wrong, for people
	Err    error  // one of the sentinels above
}

func (e *ProtocolError) Error() string {
	s := fmt.Sprintf("decoder: pgoutput message %q at %s, offset %d: %v", e.Type, e.WAL, e.Offset, e.Err)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the sentinel cause.
func (e *ProtocolError) Unwrap() error { return e.Err }
