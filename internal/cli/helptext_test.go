package cli_test

import (
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/cli"
)

// TestSynProtectHelpMSS checks that `moat syn protect --help` says what the
// data path announces: the device's MSS (or the listener's TCP_MAXSEG),
// as the README says, not the fixed 1460/1440 of an older moat.
func TestSynProtectHelpMSS(t *testing.T) {
	cmd, _, err := cli.NewRoot().Find([]string{"syn", "protect"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(cmd.Long, "fixed MSS") {
		t.Errorf("syn protect --help still claims a fixed MSS:\n%s", cmd.Long)
	}
	if !strings.Contains(cmd.Long, "MTU") || !strings.Contains(cmd.Long, "TCP_MAXSEG") {
		t.Errorf("syn protect --help does not say where the MSS comes from:\n%s", cmd.Long)
	}
}
