package cli_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/moat-shield/moat/internal/syncookie"
)

// goneReader runs moat in the server namespace with its standard output a
// pipe whose reader has gone, as in `moat ... | head -1` once head has
// exited: the first write to it ends the process (SIGPIPE).
func (sl *shieldLab) goneReader(args ...string) {
	sl.t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		sl.t.Fatal(err)
	}
	r.Close()
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := sl.lab.Server.Command(ctx, moatBin, append(append([]string{}, args...), "--root", sl.root)...)
	cmd.Stdout = w
	err = cmd.Run() // killed by SIGPIPE at its first line: the error says nothing
	sl.t.Logf("moat %v with no reader: %v", args, err)
}

// TestGoneReaderLeavesNoHalfChange: commands that make their change in
// steps (a port after another, an interface after another) make all of
// it before they write what they did, so that a reader that has gone
// never leaves the change half made.
func TestGoneReaderLeavesNoHalfChange(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	sl.mustMoat("attach", toClient, toAttacker)

	args := []string{"syn", "protect"}
	const ports = 40
	for i := range ports {
		args = append(args, fmt.Sprintf("tcp/%d", 20000+i))
	}
	sl.goneReader(append(args, "--mode", "always")...)
	var st struct {
		Ports []syncookie.PortStatus `json:"ports"`
	}
	sl.moatJSON(&st, "syn", "status", "--json")
	if len(st.Ports) != ports {
		t.Errorf("syn protect of %d ports with no reader protected %d", ports, len(st.Ports))
	}

	sl.goneReader("detach", "--all")
	for _, iface := range []string{toClient, toAttacker} {
		if sl.xdpAttached(iface) {
			t.Errorf("detach --all with no reader left XDP on %s", iface)
		}
	}
	if _, err := os.Stat(sl.root); !os.IsNotExist(err) {
		t.Errorf("detach --all with no reader left %s (%v)", sl.root, err)
	}
}
