package bus

// CoveredSubject is where a sync node asks the active `walcast run` how far
// the source's WAL is journaled (a NATS request; no journal entry is
// published on it). The request's body is a WAL position ("16/B374D848");
// the replicator answers, within a few seconds, with the position up to
// which every committed change of the publication is in the journal —
// at least the one asked for when it gets there in time. A standby does not
// answer. A sync node uses it to end a snapshot's catch-up on an idle
// source, whose watermark may not move for a long time (docs/sync.md).
func CoveredSubject(prefix string) string { return prefix + ".covered" }
