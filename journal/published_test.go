package journal

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPublishedStreamPosition: the stream position is saved and read with
// the published position as one row; SetPublishedStream states what the
// stream holds, even backwards (a new epoch), and SetPublished, which
// counts no stream, forgets it.
func TestPublishedStreamPosition(t *testing.T) {
	j, _, _ := newJournal(t)
	ctx := testCtx(t)
	if p, err := j.PublishedStream(ctx); err != nil || p != (StreamPosition{}) {
		t.Fatalf("a new journal's stream position %+v (%v), want none", p, err)
	}
	want := StreamPosition{Seq: 300, Epoch: 7, Stream: "WAL'CAST@2026-12-02T07:18:36.323Z", StreamSeq: 1 << 40}
	if err := j.SetPublishedStream(ctx, want); err != nil {
		t.Fatal(err)
	}
	if p, err := j.PublishedStream(ctx); err != nil || p != want {
		t.Fatalf("stream position %+v (%v), want %+v", p, err, want)
	}
	if p, err := j.Published(ctx); err != nil || p != 300 {
		t.Fatalf("published %d (%v), want 300", p, err)
	}
	back := StreamPosition{Seq: 120, Epoch: 8, Stream: want.Stream, StreamSeq: want.StreamSeq}
	if err := j.SetPublishedStream(ctx, back); err != nil {
		t.Fatal(err)
	}
	if p, err := j.PublishedStream(ctx); err != nil || p != back {
		t.Fatalf("stream position %+v (%v), want %+v", p, err, back)
	}
	if err := j.SetPublished(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if p, err := j.PublishedStream(ctx); err != nil || p != (StreamPosition{Seq: 120}) {
		t.Fatalf("after SetPublished the stream position is %+v (%v), want seq 120 and no stream", p, err)
	}
	if err := j.SetPublishedStream(ctx, StreamPosition{Seq: 1}); err == nil {
		t.Fatal("a stream position without a stream was saved")
	}
}

// TestPublishedStreamMigration: a journal of the schema before stream
// positions keeps its published position, with no stream position.
func TestPublishedStreamMigration(t *testing.T) {
	_, _, url := newJournal(t)
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// Back to version 5, with a position saved (the later migrations undone).
	for _, s := range []string{
		`ALTER TABLE walcast.published DROP COLUMN epoch, DROP COLUMN stream, DROP COLUMN stream_seq`,
		`DROP TABLE walcast.catalog`,
		unchunkSQL,
		`ALTER TABLE walcast.entries DROP COLUMN xid8`,
		`DELETE FROM walcast.migrations WHERE version >= 6`,
		`UPDATE walcast.published SET seq = 42`,
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	j := openAt(t, url)
	if p, err := j.PublishedStream(ctx); err != nil || p != (StreamPosition{Seq: 42}) {
		t.Fatalf("migrated stream position %+v (%v), want seq 42 and no stream", p, err)
	}
}
