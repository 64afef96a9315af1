package pgcapture

import (
	"bytes"
	"context"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/walcast/walcast/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestCaptureRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.NewDatabase(t)
	conn, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR ALL TABLES`).ReadAll(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, url, Options{Publication: "p"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	// The marker must be its own transaction: a non-transactional message
	// is decoded at once, ahead of its transaction's commit.
	for _, q := range []string{`INSERT INTO t VALUES (1)`, MarkerSQL("end.")} {
		if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatal(err)
		}
	}
	frames, err := s.Until(ctx, "end.", nil)
	if err != nil {
		t.Fatal(err)
	}
	var types []byte
	for _, f := range frames {
		types = append(types, f.Data[0])
		if f.WALStart == 0 && f.Data[0] != 'R' { // Relation messages carry no position
			t.Fatalf("frame without a WAL position: %q", f.Data)
		}
	}
	if string(types) != "BRIC" {
		t.Fatalf("message types %q, want BRIC", types)
	}
	var buf bytes.Buffer
	if err := Write(&buf, frames); err != nil {
		t.Fatal(err)
	}
	back, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, frames) {
		t.Fatalf("round trip changed the frames")
	}
}
