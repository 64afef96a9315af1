package main

import (
	"runtime/debug"
)

// setGoMemoryLimit gives the Go runtime a soft memory limit of budget bytes
// (--memory-budget), unless the operator set GOMEMLIMIT, which the runtime
// has applied already.
//
// The budget's shares (replication.Config.MemoryBudget) assume the Go heap
// peaks at about twice what is live, and hold the decoder's and the queue's
// share to half the budget. What else is live beside them — the snapshot
// loop's ring of recent transactions, the journal's copy of its newest
// appends, the publisher's batches, the embedded NATS server — would, at
// GOGC's doubling, take the process well past the budget plus
// replication.MemoryOverhead. With the limit the collector runs sooner
// instead, so the runtime's memory (heap, garbage included, stacks and its
// own metadata) stays within the budget while what is live fits in it, and
// the binary's resident pages and the rest fit in MemoryOverhead. Should
// what is live outgrow the budget, the collector works harder (the
// runtime caps it at half the CPU) and the process grows past it: raise
// --memory-budget.
func setGoMemoryLimit(env Env, budget int64) {
	if v, ok := env.LookupEnv("GOMEMLIMIT"); ok && v != "" {
		return
	}
	if budget <= 0 {
		budget = 64 << 20 // replication.Config's default
	}
	debug.SetMemoryLimit(budget)
}
