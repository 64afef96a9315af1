// Package fanout holds nothing itself: its subpackages move journaled changes
// outward, one role each (DESIGN §1).
//
//   - fanout/bus: the NATS contract both sides import (subjects and their
//     escaping, headers, connecting to NATS, the embedded server);
//   - fanout/publish: journal → NATS, part of `walcast run`;
//   - fanout/sync: the sync node (sockets, HTTP reads, auth, drop windows,
//     gap repair), `walcast sync`;
//   - fanout/client: the Go client of a sync node;
//   - fanout/filter: the row filter language of filtered subscriptions
//     (parse, type check, evaluate against row images), pure.
//
// publish and sync never import each other; the layering test in this
// directory keeps it so.
package fanout
