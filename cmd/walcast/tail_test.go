package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/natstest"
)

// TestTailShortenValues: long string values are cut on a character
// boundary with a note of the bytes left out; keys, short values, numbers,
// nesting and field order stay as they were, and the line is still JSON.
func TestTailShortenValues(t *testing.T) {
	long := strings.Repeat("ab", 200)      // 400 bytes
	wide := strings.Repeat("é", 100)       // 200 bytes, two per character
	escaped := strings.Repeat(`\"<&>`, 30) // 150 bytes of JSON, 120 decoded
	longKey := strings.Repeat("k", 90)     // a key is never cut
	in := `{"seq":7,"entity":"public.orders","after":{"id":1,"notes":"` + long + `","name":"` + wide + `","q":"` + escaped +
		`","` + longKey + `":true,"tags":["` + long + `","x"]},"unchanged":["notes"]}`
	out := string(shortenValues([]byte(in), 101))

	if !json.Valid([]byte(out)) {
		t.Fatalf("not JSON: %s", out)
	}
	if !strings.HasPrefix(out, `{"seq":7,"entity":"public.orders","after":{"id":1,"notes":"`) || !strings.HasSuffix(out, `"x"]},"unchanged":["notes"]}`) {
		t.Fatalf("the envelope's shape changed: %s", out)
	}
	var env struct {
		After struct {
			Notes string   `json:"notes"`
			Name  string   `json:"name"`
			Q     string   `json:"q"`
			Tags  []string `json:"tags"`
		} `json:"after"`
	}
	if err := json.Unmarshal([]byte(out), &env); err != nil {
		t.Fatal(err)
	}
	a := env.After
	if want := long[:101] + "… [299 more bytes not shown; --max-value-bytes 0 prints them]"; a.Notes != want {
		t.Fatalf("notes = %q\nwant    %q", a.Notes, want)
	}
	if a.Tags[0] != a.Notes || a.Tags[1] != "x" {
		t.Fatalf("array values: %q", a.Tags)
	}
	if !utf8.ValidString(a.Name) || !strings.HasPrefix(a.Name, strings.Repeat("é", 50)+"… [100 more bytes") {
		t.Fatalf("a two-byte character was split or miscounted: %q", a.Name)
	}
	if want := strings.Repeat(`"<&>`, 25) + `"` + "… [19 more bytes"; !strings.HasPrefix(a.Q, want) {
		t.Fatalf("escaped value: %q, want it to start %q", a.Q, want)
	}
	if !strings.Contains(out, `"`+longKey+`":true`) {
		t.Fatalf("a key was cut: %s", out)
	}

	// Nothing long: the same bytes back.
	short := []byte(`{"seq":1,"after":{"id":1,"s":"` + strings.Repeat("x", 101) + `"}}`)
	if got := shortenValues(short, 101); !bytes.Equal(got, short) {
		t.Fatalf("changed a line with no long value: %s", got)
	}
}

// TestTailCutsLongValuesForDisplay: walcast tail prints a 128 KB value cut
// to --max-value-bytes (256 by default) with a note, and in full with
// --max-value-bytes 0; the envelope published is untouched.
func TestTailCutsLongValuesForDisplay(t *testing.T) {
	ns := natstest.Start(t)
	notes := strings.Repeat("0123456789abcdef", 8192) // 128 KB
	envelope := `{"seq":1,"entitySeq":1,"entity":"public.orders","op":"insert","key":{"id":1},"after":{"id":1,"notes":"` + notes + `"}}`

	for _, tc := range []struct {
		args      []string
		wantNotes string
	}{
		{nil, notes[:256] + "… [130816 more bytes not shown; --max-value-bytes 0 prints them]"},
		{[]string{"--max-value-bytes", "10"}, notes[:10] + "… [131062 more bytes not shown; --max-value-bytes 0 prints them]"},
		{[]string{"--max-value-bytes", "0"}, notes},
	} {
		stdout := tailOne(t, ns.URL(), nil, envelope, tc.args...)
		var env decoder.Envelope
		if err := json.Unmarshal([]byte(stdout), &env); err != nil {
			t.Fatalf("%v: tail printed a line that is not an envelope: %v\n%.300s", tc.args, err, stdout)
		}
		var got string
		if err := json.Unmarshal(env.After["notes"], &got); err != nil {
			t.Fatalf("%v: notes: %v", tc.args, err)
		}
		if got != tc.wantNotes {
			t.Fatalf("%v: notes printed as %.300q…, want %.300q…", tc.args, got, tc.wantNotes)
		}
	}
	code, _, stderr := walcast(t, nil, "tail", "--nats-url", ns.URL(), "--max-value-bytes", "-1")
	if code != exitUsage || !strings.Contains(stderr, "must not be negative") {
		t.Fatalf("--max-value-bytes -1: exit %d, %q", code, stderr)
	}
}

// tailOne runs walcast tail --nats-url url --count 1 in-process with env,
// publishes envelope until tail has printed it, and returns what it printed.
func tailOne(t *testing.T, url string, env map[string]string, envelope string, args ...string) string {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // before wg.Wait: a test that fails stops tail too
	wg.Add(1)
	go func() {
		defer wg.Done()
		var stdout, stderr bytes.Buffer
		code := Run(ctx, append([]string{"tail", "--nats-url", url, "--count", "1"}, args...), Env{Stdout: &stdout, Stderr: &stderr,
			LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
		done <- result{code, stdout.String(), stderr.String()}
	}()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	// tail subscribes some time after it starts: publish until it prints.
	for {
		select {
		case r := <-done:
			if r.code != exitOK {
				t.Fatalf("tail %v: exit %d\n%s", args, r.code, r.stderr)
			}
			return strings.TrimSuffix(r.stdout, "\n")
		case <-tick.C:
			if err := nc.Publish("walcast.change.public.orders._", []byte(envelope)); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("tail %v printed nothing in 30s", args)
		}
	}
}

// TestTailSourceFromCommandLineWinsOverEnvironment: with a sync node's
// settings exported (WALCAST_NATS_URL, WALCAST_JOURNAL_URL), tail reads the
// source its command line names; sources that conflict are named.
func TestTailSourceFromCommandLineWinsOverEnvironment(t *testing.T) {
	ns := natstest.Start(t)
	syncEnv := map[string]string{
		"WALCAST_NATS_URL":    "nats://127.0.0.1:1",
		"WALCAST_JOURNAL_URL": "postgres://walcast@127.0.0.1:1/app",
	}

	// --socket on the command line: tail goes to the socket (nothing
	// listens there, so it says it could not connect) and never complains
	// about the exported sources.
	code, _, stderr := walcast(t, syncEnv, "tail", "--socket", "ws://127.0.0.1:1/v1/socket", "--topic", "public.orders")
	if code != exitUsage || !strings.Contains(stderr, "connect to ws://127.0.0.1:1/v1/socket") {
		t.Fatalf("--socket with the sync env exported: exit %d, %q; want it to try the socket", code, stderr)
	}

	// --nats-url on the command line wins over WALCAST_NATS_URL and
	// WALCAST_SOCKET: tail reads the server the command line names.
	env := map[string]string{"WALCAST_NATS_URL": "nats://127.0.0.1:1", "WALCAST_SOCKET": "ws://127.0.0.1:1/v1/socket"}
	if got := tailOne(t, ns.URL(), env, `{"seq":5}`); got != `{"seq":5}` {
		t.Fatalf("tail printed %q", got)
	}

	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--socket", "ws://127.0.0.1:1/v1/socket", "--nats-url", "nats://127.0.0.1:1"}, "the command line gives --nats-url and --socket; tail reads one source: keep one of them"},
		{syncEnv, nil, "the environment sets WALCAST_NATS_URL and WALCAST_JOURNAL_URL, each a source; give the one to read on the command line"},
		{nil, nil, "give --nats-url (live from NATS), --journal-url (from the journal) or --socket"},
	} {
		code, _, stderr := walcast(t, tc.env, append([]string{"tail"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Fatalf("env %v args %v: exit %d, %q; want 2 and %q", tc.env, tc.args, code, stderr, tc.want)
		}
	}
}
