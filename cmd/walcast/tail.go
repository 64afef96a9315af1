package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

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

--count N stops after N envelopes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := bufio.NewWriter(cmd.OutOrStdout())
			defer out.Flush()
			p := &printer{w: out, left: count}
			sources := 0
			for _, set := range []bool{nf.cfg.URL != "", journalURL != "", socketURL != ""} {
				if set {
					sources++
				}
			}
			switch {
			case sources > 1:
				return usageErrorf("tail: give one of --nats-url, --journal-url or --socket")
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
				j, err := journal.Open(cmd.Context(), journal.Config{URL: journalURL, Schema: schema, CursorSecret: []byte(cursorSecret)})
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
	return cmd
}

// errDone ends a tail after --count envelopes.
var errDone = errors.New("done")

type printer struct {
	w    *bufio.Writer
	left int // 0: unlimited
}

func (p *printer) print(env []byte) error {
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
