//go:build race

package sync

// spoolTestRows is the table a slow client reads in
// TestSnapshotSpoolReleasesTheSource: under the race detector, reading and
// encoding a million rows takes minutes, so a tenth shows the same
// property there.
const spoolTestRows = 100_000
