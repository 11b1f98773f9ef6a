package shield

import (
	"strings"
	"testing"
)

// TestBridgeNoteUnderADaemon: the note on a bridge port's acceptor is
// also what the daemon logs when it attaches or mends such a port, where
// `moat attach` is refused and the daemon follows the bridge itself. It
// told the operator only to run `moat attach` again.
func TestBridgeNoteUnderADaemon(t *testing.T) {
	n := bridgeNote("eth1", "br0")
	for _, want := range []string{"daemon", "does so itself", "`moat attach eth1`", "made anew"} {
		if !strings.Contains(n, want) {
			t.Errorf("bridge note %q lacks %q", n, want)
		}
	}
}
