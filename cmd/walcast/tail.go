package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/fanout/client"
	"github.com/walcast/walcast/journal"
)

func newTailCmd(env Env) *cobra.Command {
	var (
		nf           natsFlags
		subject      string
		journalURL   string
		schema       string
		fromSeq      int64
		fromCursor   string
		cursorSecret string
		topics       []string
		tenant       string
		count        int
		socketURL    string
		token        string
		snapshot     bool
		// maxValueBytes is the longest string value printed in full
		// (0: no limit).
		maxValueBytes int
		// onCommandLine holds the flags given on the command line, as
		// opposed to set from the environment.
		onCommandLine map[string]bool
	)
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Print change envelopes as JSON lines, live from NATS or from the journal",
		Long: `tail prints one envelope per line on standard output, for operators
debugging a stream.

From NATS (--nats-url): every message on --subject (default: all of walcast's
subjects), as it is published.

From a sync node (--socket ws://host:8080/v1/socket, with --token): the
changes of every --topic, as a client sees them (from --from-cursor when given,
one topic only); resync notices go to standard error. With --snapshot (the
token needs the "snapshot": true claim, the node --database-url) it first
prints each topic's current rows (op "read"), then its changes; where each
snapshot begins and ends, and the cursor to resume from, go to standard
error.

From the journal (--journal-url): entries after --from-seq (0: the oldest
retained; default: only new ones), or after --from-cursor (a cursor issued by a
sync node, with the same --cursor-secret, --topic and --tenant it was issued
for); it keeps following new entries.

A source given on the command line wins over one set in the environment
(WALCAST_NATS_URL, WALCAST_JOURNAL_URL, WALCAST_SOCKET), so tail works in a
shell that exported a sync node's settings.

String values longer than --max-value-bytes (default 256) are cut for the
screen, ending in a note of how many bytes were left out; the rest of each
line is the envelope as published. --max-value-bytes 0 prints every value in
full, for piping into other tools.

--count N stops after N envelopes.`,
		Args:              cobra.NoArgs,
		PersistentPreRunE: noteCommandLine(&onCommandLine),
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := bufio.NewWriter(cmd.OutOrStdout())
			defer out.Flush()
			if maxValueBytes < 0 {
				return usageErrorf("tail: --max-value-bytes must not be negative (0 prints every value in full)")
			}
			p := &printer{w: out, left: count, maxValue: maxValueBytes}
			if err := chooseTailSource(onCommandLine, map[string]*string{"nats-url": &nf.cfg.URL, "journal-url": &journalURL, "socket": &socketURL}); err != nil {
				return err
			}
			switch {
			case socketURL != "":
				if len(topics) == 0 {
					return usageErrorf("tail: --socket needs at least one --topic")
				}
				if fromCursor != "" && len(topics) != 1 {
					return usageErrorf("tail: --from-cursor with --socket takes exactly one --topic")
				}
				return tailSocket(cmd.Context(), socketURL, token, topics, fromCursor, snapshot, p, cmd.ErrOrStderr())
			case snapshot:
				return usageErrorf("tail: --snapshot needs --socket (a sync node serves the rows)")
			case nf.cfg.URL != "":
				nf.cfg.Name = "walcast tail"
				return tailNATS(cmd.Context(), nf.cfg, subject, p)
			case journalURL != "":
				if fromCursor != "" && cursorSecret == "" {
					return usageErrorf("tail: --from-cursor needs the --cursor-secret the cursor was signed with")
				}
				if fromCursor != "" && cmd.Flags().Changed("from-seq") {
					return usageErrorf("tail: give either --from-seq or --from-cursor, not both")
				}
				j, err := journal.Open(cmd.Context(), journal.Config{URL: journalURL, Schema: schema, CursorSecret: []byte(cursorSecret), ReadOnly: true})
				if err != nil {
					return startupError(err)
				}
				defer j.Close()
				if fromCursor != "" {
					return tailCursor(cmd.Context(), j, journal.Query{Cursor: fromCursor, Entities: topics, Tenant: tenant}, p)
				}
				if !cmd.Flags().Changed("from-seq") {
					st, err := j.ReadAfter(cmd.Context(), 1<<62, 1)
					if err != nil {
						return withCode(exitFailed, err)
					}
					fromSeq = st.Horizon
				}
				return tailJournal(cmd.Context(), j, fromSeq, p)
			}
			return usageErrorf("tail: give --nats-url (live from NATS), --journal-url (from the journal) or --socket (from a sync node)")
		},
	}
	nf.register(cmd, "NATS server to read live envelopes from")
	f := cmd.Flags()
	f.StringVar(&subject, "subject", "walcast.>", "NATS subject to follow (with --nats-url)")
	f.StringVar(&journalURL, "journal-url", "", "journal database to read from")
	f.StringVar(&schema, "journal-schema", journal.DefaultSchema, "schema of the journal")
	f.Int64Var(&fromSeq, "from-seq", 0, "print entries after this seq (0: from the oldest retained; default: only new ones)")
	f.StringVar(&fromCursor, "from-cursor", "", "print entries after this cursor")
	f.StringVar(&cursorSecret, "cursor-secret", "", "secret the cursor was signed with (with --from-cursor)")
	f.StringSliceVar(&topics, "topic", nil, "entities to follow (with --socket), or the cursor was issued for (with --journal-url --from-cursor)")
	f.StringVar(&socketURL, "socket", "", "sync node socket to follow, e.g. ws://127.0.0.1:8080/v1/socket")
	f.StringVar(&token, "token", "", "JWT for --socket (prefer the environment variable)")
	f.BoolVar(&snapshot, "snapshot", false, "with --socket: print each topic's current rows first, then its changes")
	f.StringVar(&tenant, "tenant", "", "tenant the cursor was issued for (with --from-cursor)")
	f.IntVar(&count, "count", 0, "stop after this many envelopes (0: never)")
	f.IntVar(&maxValueBytes, "max-value-bytes", 256, "cut string values longer than this for display, noting the bytes left out (0: print values in full)")
	return cmd
}

// errDone ends a tail after --count envelopes.
var errDone = errors.New("done")

// tailSources are tail's source flags, in the order the messages name them.
var tailSources = []string{"nats-url", "journal-url", "socket"}

// chooseTailSource leaves set only the one source tail reads, clearing the
// others in vals (keyed by flag name). A source given on the command line
// wins over those set from the environment; two on the command line, or
// none there and two in the environment, are a usage error that names them.
func chooseTailSource(onCommandLine map[string]bool, vals map[string]*string) error {
	var given, fromEnv []string
	for _, name := range tailSources {
		switch {
		case *vals[name] == "":
		case onCommandLine[name]:
			given = append(given, "--"+name)
		default:
			fromEnv = append(fromEnv, envName(name))
		}
	}
	keep := func(flag string) {
		for _, name := range tailSources {
			if "--"+name != flag {
				*vals[name] = ""
			}
		}
	}
	switch {
	case len(given) > 1:
		return usageErrorf("tail: the command line gives %s; tail reads one source: keep one of them", strings.Join(given, " and "))
	case len(given) == 1:
		keep(given[0])
	case len(fromEnv) > 1:
		return usageErrorf("tail: the environment sets %s, each a source; give the one to read on the command line "+
			"(--nats-url, --journal-url or --socket), which wins over the environment", strings.Join(fromEnv, " and "))
	}
	return nil
}

type printer struct {
	w        *bufio.Writer
	left     int // 0: unlimited
	maxValue int // longest string value printed in full; 0: no limit
}

func (p *printer) print(env []byte) error {
	if p.maxValue > 0 {
		env = shortenValues(env, p.maxValue)
	}
	if _, err := p.w.Write(env); err != nil {
		return err
	}
	if err := p.w.WriteByte('\n'); err != nil {
		return err
	}
	if err := p.w.Flush(); err != nil {
		return err
	}
	if p.left > 0 {
		p.left--
		if p.left == 0 {
			return errDone
		}
	}
	return nil
}

func finish(err error) error {
	if err == nil || errors.Is(err, errDone) || errors.Is(err, context.Canceled) {
		return nil
	}
	if errors.Is(err, io.ErrClosedPipe) {
		return nil
	}
	return withCode(exitFailed, err)
}

func tailNATS(ctx context.Context, cfg bus.NATSConfig, subject string, p *printer) error {
	nc, err := bus.ConnectNATS(cfg)
	if err != nil {
		return withCode(exitUsage, err)
	}
	defer nc.Close()
	msgs := make(chan *nats.Msg, 4096)
	sub, err := nc.ChanSubscribe(subject, msgs)
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("subscribe to %q: %w", subject, err))
	}
	defer sub.Unsubscribe()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			if strings.HasSuffix(m.Subject, ".position") && len(m.Data) == 0 && m.Header.Get(bus.HeaderSeq) != "" {
				continue // the publisher's position (bus.PositionSubject), not an entry
			}
			if err := p.print(m.Data); err != nil {
				return finish(err)
			}
		}
	}
}

func tailJournal(ctx context.Context, j *journal.Journal, after int64, p *printer) error {
	for {
		lg, err := j.ReadAfter(ctx, after, journal.MaxLimit)
		if err != nil {
			return finish(err)
		}
		for _, e := range lg.Entries {
			if err := p.print(e.Envelope); err != nil {
				return finish(err)
			}
			after = e.Seq
		}
		if len(lg.Entries) == 0 {
			if _, err := j.Wait(ctx, lg.Horizon); err != nil {
				return finish(err)
			}
		}
	}
}

func tailCursor(ctx context.Context, j *journal.Journal, q journal.Query, p *printer) error {
	for {
		res, err := j.Changes(ctx, q)
		if err != nil {
			return finish(err)
		}
		if res.ResyncRequired {
			return withCode(exitFailed, fmt.Errorf("the cursor needs a resync (%s): its entries are gone or were superseded; restart from --from-seq 0 or a fresh cursor", res.Reason))
		}
		for _, e := range res.Changes {
			if err := p.print(e.Envelope); err != nil {
				return finish(err)
			}
		}
		q.Cursor = res.Cursor
		if len(res.Changes) == 0 {
			if _, err := j.Wait(ctx, res.Horizon); err != nil {
				return finish(err)
			}
		}
	}
}

func tailSocket(ctx context.Context, url, token string, topics []string, cursor string, snapshot bool, p *printer, stderr io.Writer) error {
	c, err := client.Dial(ctx, url, client.Options{Token: token})
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("connect to %s: %w", url, err))
	}
	defer c.Close()
	for _, t := range topics {
		sub := c.Subscribe
		if snapshot {
			sub = c.SubscribeSnapshot
		}
		if err := sub(t, cursor); err != nil {
			return withCode(exitFailed, err)
		}
	}
	for {
		ev, err := c.Next(ctx)
		if err != nil {
			return finish(err)
		}
		switch ev.Type {
		case client.EventChange, client.EventRow:
			if err := p.print(ev.Change); err != nil {
				return finish(err)
			}
		case client.EventSnapshotBegin:
			why := ""
			if ev.Reason != "" {
				why = " (" + ev.Reason + ")"
			}
			fmt.Fprintf(stderr, "walcast tail: snapshot %d of %s%s: about %d rows\n", ev.SnapshotID, ev.Topic, why, ev.Rows)
		case client.EventSnapshotEnd:
			fmt.Fprintf(stderr, "walcast tail: snapshot %d of %s complete: %d rows; changes follow; resume with --from-cursor %s\n", ev.SnapshotID, ev.Topic, ev.Rows, ev.Cursor)
		case client.EventResync:
			fmt.Fprintf(stderr, "walcast tail: resync on %s: refetch the state; changes continue after cursor %s\n", ev.Topic, ev.Cursor)
		case client.EventError:
			return withCode(exitFailed, fmt.Errorf("the sync node refused: %s: %s", ev.Code, ev.Msg))
		}
	}
}

// shortenValues returns env with every JSON string value longer than max
// bytes (decoded) cut to its first max bytes (whole UTF-8 characters) and a
// note of how many bytes were left out. Object keys and everything else are
// kept byte for byte, in their order. Input that is not JSON comes back
// unchanged. It is for display only: what tail prints, never what walcast
// stores or sends.
func shortenValues(env []byte, max int) []byte {
	if len(env) <= max {
		return env
	}
	var out []byte // nil until the first cut
	last := 0
	for i := 0; i < len(env); i++ {
		if env[i] != '"' {
			continue
		}
		j := i + 1 // the closing quote
		for ; j < len(env) && env[j] != '"'; j++ {
			if env[j] == '\\' {
				j++
			}
		}
		if j >= len(env) {
			return env // unterminated string: not JSON
		}
		lit := env[i : j+1]
		k := j + 1
		for k < len(env) && (env[k] == ' ' || env[k] == '\t' || env[k] == '\n' || env[k] == '\r') {
			k++
		}
		isKey := k < len(env) && env[k] == ':'
		var s string
		if !isKey && len(lit)-2 > max && json.Unmarshal(lit, &s) == nil && len(s) > max {
			cut := max
			for cut > 0 && !utf8.RuneStart(s[cut]) {
				cut--
			}
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			if enc.Encode(fmt.Sprintf("%s… [%d more bytes not shown; --max-value-bytes 0 prints them]", s[:cut], len(s)-cut)) == nil {
				out = append(append(out, env[last:i]...), bytes.TrimRight(b.Bytes(), "\n")...)
				last = j + 1
			}
		}
		i = j
	}
	if out == nil {
		return env
	}
	return append(out, env[last:]...)
}
