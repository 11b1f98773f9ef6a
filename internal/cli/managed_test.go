package cli_test

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeDaemon answers the daemon's status call on a socket of its own, as a
// daemon that manages root would, and returns the socket's path.
func fakeDaemon(t *testing.T, root string) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "moat.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"root": root, "pid": os.Getpid()})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return socket
}

// runManaged runs the real binary with MOAT_SOCKET set, which a test in
// this process cannot set without keeping other tests from running beside
// it.
func runManaged(t *testing.T, socket, root string, args ...string) result {
	t.Helper()
	return runBinary(t, []string{"MOAT_SOCKET=" + socket}, root, args...)
}

// TestManagedRootRefusals: the commands that change what a daemon's
// config owns refuse, with exit 2, while a daemon manages the root, and
// change nothing; reading still works.
func TestManagedRootRefusals(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	mustRun(t, root, "limit", "add", "source", "all", "--pps", "10k")
	mustRun(t, root, "limit", "add", "budget", "udp/53", "--pps", "50k")
	before := pinnedState(t, root) + mustRun(t, root, "limit", "list", "--json").stdout
	socket := fakeDaemon(t, root)
	for _, args := range [][]string{
		{"limit", "remove", "source", "all"},
		{"limit", "add", "budget", "udp/123", "--pps", "1k"},
		{"limit", "config", "--shape", "off"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			checkUsageError(t, runManaged(t, socket, root, args...), "a moat daemon manages "+root)
		})
	}
	if r := runManaged(t, socket, root, "limit", "list"); r.code != 0 {
		t.Errorf("limit list under a daemon: %v", r)
	}
	if after := pinnedState(t, root) + mustRun(t, root, "limit", "list", "--json").stdout; after != before {
		t.Errorf("a refused command changed the state:\nbefore %s\nafter %s", before, after)
	}
}
