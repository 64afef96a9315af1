package sync

import "github.com/gorilla/websocket"

// Close codes of /v1/socket (docs/sync.md, "Tokens and close codes"). The
// private codes are grouped by what the client should do, in the spirit of
// Centrifugo's: 4000–4099 reconnect (with backoff), 4100–4199 get a new
// token and reconnect at once, 4400–4499 do not reconnect (the client is at
// fault and would be refused again). DESIGN §6 fixes 1001 for idle eviction
// and 1013 for backpressure; both mean reconnect with backoff. The Go
// client (fanout/client) keeps the same table; a test checks they agree.
const (
	// CloseIdle: the socket sent nothing for --idle-timeout. Reconnect.
	CloseIdle = websocket.CloseGoingAway // 1001
	// CloseBackpressure: the client fell too far behind (drops within the
	// window, behind for longer than --max-lag, a write not taken within
	// the write timeout, or the control reserve full). Reconnect after a
	// backoff and resume from the cursors.
	CloseBackpressure = websocket.CloseTryAgainLater // 1013
	// CloseShutdown: the node is shutting down. Reconnect (another node).
	CloseShutdown = 4000
	// CloseTokenExpired: the token's exp (plus the leeway) passed without a
	// refresh. Get a new token and reconnect at once.
	CloseTokenExpired = 4100
	// CloseBadFrame: a frame that is not JSON, or larger than
	// --max-frame-bytes. Do not reconnect: the client is broken.
	CloseBadFrame = 4400
	// CloseFlood: more frames than the inbound budget allows. Do not
	// reconnect automatically: the client would flood again.
	CloseFlood = 4429
)
