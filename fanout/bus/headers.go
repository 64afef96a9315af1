package bus

// NATS headers set on every published change. Nats-Msg-Id makes a JetStream
// stream bound to the subjects drop republished copies.
const (
	HeaderMsgID         = "Nats-Msg-Id"            // <journal id hex>:<seq>
	HeaderSeq           = "Walcast-Seq"            // journal seq
	HeaderEntitySeq     = "Walcast-Entity-Seq"     // per-entity sequence
	HeaderEntity        = "Walcast-Entity"         // envelope entity
	HeaderCommitLSN     = "Walcast-Commit-Lsn"     // X/X
	HeaderTenant        = "Walcast-Tenant"         // only when the change has a tenant
	HeaderTenantUnknown = "Walcast-Tenant-Unknown" // "true" only for a tenant-unknown change
)
