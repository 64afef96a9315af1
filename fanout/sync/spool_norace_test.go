//go:build !race

package sync

// spoolTestRows is the table a slow client reads in
// TestSnapshotSpoolReleasesTheSource.
const spoolTestRows = 1_000_000
