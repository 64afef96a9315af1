// Package filter is the row filter language of filtered subscriptions: a
// JSON form of a predicate over a table's published columns (comparisons,
// in, is null, and, or, not) with typed JSON values, never SQL text; a
// compiler that checks it against the columns' types under hard bounds; and
// an evaluator over the row images of change envelopes (after, before or
// key). Projection is the companion column list.
//
// The language is specified in docs/filters.md. In short:
//
//	{"and":[{"col":"status","op":"=","value":"paid"},
//	        {"or":[{"col":"amount","op":">","value":100},
//	               {"col":"region","op":"in","values":["eu","us"]}]},
//	        {"not":{"col":"deleted_at","op":"is null"}}]}
//
// Semantics follow PostgreSQL's for the same predicate with typed
// parameters, with the exceptions the documentation lists: text orders by
// bytes (COLLATE "C"), NaN equals NaN and sorts above every number, NULL
// makes comparisons unknown (three-valued logic) and an unknown filter
// does not match.
//
// The package owns parsing, type checking and evaluation only. It does not
// read the journal, talk to clients or decide what a caller does with a row
// it cannot judge (Undecided); it imports decoder for column types and
// nothing of the sync node.
package filter
