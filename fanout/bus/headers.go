package bus

// NATS headers set on every published change. Nats-Msg-Id makes a JetStream
// stream bound to the subjects drop republished copies; it holds the
// journal's epoch (journal.EpochHex) so that a seq assigned again after a
// restore is a new message, not a duplicate of the lost one.
//
// Headers are informational except for the sequence numbers: nats.go trims
// header values (leading and trailing spaces, CR and LF), so a consumer must
// never route on Walcast-Tenant or Walcast-Entity. The tenant a change is
// delivered under is its subject's tenant token (TenantOf, TenantToken),
// exact for every value. Walcast-Entity and Walcast-Tenant are left out when
// the value is longer than MaxHeaderValueBytes (the envelope and the subject
// carry it), so headers never push a message past the server's max payload.
const (
	HeaderMsgID         = "Nats-Msg-Id"            // <journal id hex>:<epoch hex>:<seq>
	HeaderEpoch         = "Walcast-Epoch"          // the entry's journal epoch, 16 hex digits
	HeaderSeq           = "Walcast-Seq"            // journal seq
	HeaderEntitySeq     = "Walcast-Entity-Seq"     // per-entity sequence
	HeaderEntity        = "Walcast-Entity"         // envelope entity, when at most MaxHeaderValueBytes
	HeaderCommitLSN     = "Walcast-Commit-Lsn"     // X/X
	HeaderTenant        = "Walcast-Tenant"         // the change's tenant (possibly ""), when it has one of at most MaxHeaderValueBytes
	HeaderTenantUnknown = "Walcast-Tenant-Unknown" // "true" only for a tenant-unknown change
	HeaderTxnEnd        = "Walcast-Txn-End"        // TxnEndTenant or TxnEndEntity on a transaction's last message of its class; absent otherwise
)

// Values of HeaderTxnEnd. A source transaction's messages share
// Walcast-Commit-Lsn (its commit end LSN). The last of them on a subject
// (one entity and one tenant token; tenant-unknown changes, which go out
// under the no-tenant token, count as a class of their own) carries
// TxnEndTenant; the last of the entity's messages in the transaction, on
// whichever subject, carries TxnEndEntity instead, which implies
// TxnEndTenant for its subject. So a subscriber of one subject has the
// whole transaction at TxnEndTenant (or TxnEndEntity), and a subscriber of
// an entity's wildcard subject (every tenant) at TxnEndEntity.
const (
	TxnEndTenant = "tenant"
	TxnEndEntity = "entity"
)

// MaxHeaderValueBytes bounds the Walcast-Entity and Walcast-Tenant values.
const MaxHeaderValueBytes = 1024
