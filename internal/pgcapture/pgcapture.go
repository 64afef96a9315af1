// Package pgcapture records a real pgoutput stream for tests: it opens a
// logical replication session the way walcast's replication loop does
// (protocol version 2, streaming and messages on, the session settings of
// DESIGN §4.7), and returns the raw XLogData payloads with their WAL
// positions. It also reads and writes capture files.
//
// It is test support: only tests import it, so the decoder's own
// dependencies stay free of network code.
package pgcapture

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// SessionParams are the settings the replication session fixes, because the
// text form of values depends on them (DESIGN §4.7).
var SessionParams = map[string]string{
	"TimeZone":           "UTC",
	"DateStyle":          "ISO",
	"IntervalStyle":      "iso_8601",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
}

// Frame is one XLogData message: its WAL start and its payload.
type Frame struct {
	WALStart uint64
	Data     []byte
}

// Options configure a capture session.
type Options struct {
	Slot        string            // created as a temporary logical slot; default "capture"
	Publication string            // required
	Params      map[string]string // extra session settings, e.g. logical_decoding_work_mem
}

// Stream is a running logical replication session.
type Stream struct {
	conn      *pgconn.PgConn
	last      uint64
	lastReply time.Time
}

// Open connects to url (a database URL of a superuser or replication role),
// creates a temporary pgoutput slot and starts streaming from it. Changes
// committed after Open returns are captured.
func Open(ctx context.Context, url string, opts Options) (*Stream, error) {
	if opts.Slot == "" {
		opts.Slot = "capture"
	}
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pgcapture: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	for k, v := range SessionParams {
		cfg.RuntimeParams[k] = v
	}
	for k, v := range opts.Params {
		cfg.RuntimeParams[k] = v
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgcapture: connect: %w", err)
	}
	s := &Stream{conn: conn}
	q := fmt.Sprintf("CREATE_REPLICATION_SLOT %s TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT", quoteIdent(opts.Slot))
	if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("pgcapture: %s: %w", q, err)
	}
	q = fmt.Sprintf(`START_REPLICATION SLOT %s LOGICAL 0/0 (proto_version '2', publication_names %s, streaming 'on', messages 'true')`,
		quoteIdent(opts.Slot), quoteLiteral(quoteIdent(opts.Publication)))
	conn.Frontend().SendQuery(&pgproto3.Query{String: q})
	if err := conn.Frontend().Flush(); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("pgcapture: send START_REPLICATION: %w", err)
	}
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			conn.Close(ctx)
			return nil, fmt.Errorf("pgcapture: START_REPLICATION: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyBothResponse:
			return s, nil
		case *pgproto3.ErrorResponse:
			conn.Close(ctx)
			return nil, fmt.Errorf("pgcapture: START_REPLICATION: %w", pgconn.ErrorResponseToPgError(msg))
		}
	}
}

// Next returns the next XLogData frame, answering keepalives on the way.
func (s *Stream) Next(ctx context.Context) (Frame, error) {
	for {
		if time.Since(s.lastReply) > 5*time.Second {
			if err := s.status(false); err != nil {
				return Frame{}, err
			}
		}
		msg, err := s.conn.ReceiveMessage(ctx)
		if err != nil {
			return Frame{}, fmt.Errorf("pgcapture: receive: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			d := msg.Data
			switch {
			case len(d) >= 25 && d[0] == 'w':
				f := Frame{WALStart: binary.BigEndian.Uint64(d[1:]), Data: append([]byte(nil), d[25:]...)}
				s.last = f.WALStart
				return f, nil
			case len(d) >= 18 && d[0] == 'k':
				if d[17] == 1 {
					if err := s.status(false); err != nil {
						return Frame{}, err
					}
				}
			default:
				return Frame{}, fmt.Errorf("pgcapture: unexpected CopyData %q", d[:min(len(d), 1)])
			}
		case *pgproto3.ErrorResponse:
			return Frame{}, fmt.Errorf("pgcapture: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return Frame{}, errors.New("pgcapture: server ended the stream")
		}
	}
}

// status confirms the last received position: a capture never needs a
// transaction again once it has it.
func (s *Stream) status(reply bool) error {
	b := []byte{'r'}
	for i := 0; i < 3; i++ {
		b = binary.BigEndian.AppendUint64(b, s.last)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(time.Since(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()))
	if reply {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	buf, err := (&pgproto3.CopyData{Data: b}).Encode(nil)
	if err != nil {
		return err
	}
	s.lastReply = time.Now()
	if err := s.conn.Frontend().SendUnbufferedEncodedCopyData(buf); err != nil {
		return fmt.Errorf("pgcapture: send status: %w", err)
	}
	return nil
}

// MarkerSQL emits the non-transactional logical message Until waits for.
func MarkerSQL(marker string) string {
	return "SELECT pg_logical_emit_message(false, " + quoteLiteral(marker) + ", '')"
}

// Until collects frames until the non-transactional logical message with
// prefix marker (see MarkerSQL), which it leaves out. fn, if not nil, sees
// every frame instead of it being collected (for streams too large to hold).
func (s *Stream) Until(ctx context.Context, marker string, fn func(Frame) error) ([]Frame, error) {
	var out []Frame
	for {
		f, err := s.Next(ctx)
		if err != nil {
			return out, err
		}
		if isMarker(f.Data, marker) {
			return out, nil
		}
		if fn != nil {
			if err := fn(f); err != nil {
				return out, err
			}
			continue
		}
		out = append(out, f)
	}
}

// isMarker matches 'M', flags 0 (non-transactional, so no xid), LSN, prefix.
func isMarker(d []byte, marker string) bool {
	if len(d) < 10+len(marker)+1 || d[0] != 'M' || d[1] != 0 {
		return false
	}
	p := d[10:]
	return string(p[:len(marker)]) == marker && p[len(marker)] == 0
}

// Close ends the session; the temporary slot goes with it.
func (s *Stream) Close(ctx context.Context) error {
	return s.conn.Close(ctx)
}

// Capture files are gzip-compressed sequences of frames, each a big-endian
// u64 WAL start, u32 length and the payload.

// Write writes frames in the capture file format.
func Write(w io.Writer, frames []Frame) error {
	zw := gzip.NewWriter(w)
	bw := bufio.NewWriter(zw)
	var hdr [12]byte
	for _, f := range frames {
		binary.BigEndian.PutUint64(hdr[:], f.WALStart)
		binary.BigEndian.PutUint32(hdr[8:], uint32(len(f.Data)))
		bw.Write(hdr[:])
		bw.Write(f.Data)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return zw.Close()
}

// Read reads a capture file's frames.
func Read(r io.Reader) ([]Frame, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("pgcapture: %w", err)
	}
	br := bufio.NewReader(zr)
	var out []Frame
	var hdr [12]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if err == io.EOF {
				return out, nil
			}
			return nil, fmt.Errorf("pgcapture: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[8:])
		if n > 64<<20 {
			return nil, fmt.Errorf("pgcapture: frame of %d bytes", n)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(br, data); err != nil {
			return nil, fmt.Errorf("pgcapture: %w", err)
		}
		out = append(out, Frame{WALStart: binary.BigEndian.Uint64(hdr[:]), Data: data})
	}
}

// WriteFile writes frames to path.
func WriteFile(path string, frames []Frame) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := Write(f, frames); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadFile reads the frames of the capture file at path.
func ReadFile(path string) ([]Frame, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f)
}

func quoteIdent(s string) string {
	out := []byte{'"'}
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			out = append(out, '"')
		}
		out = append(out, s[i])
	}
	return string(append(out, '"'))
}

func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
