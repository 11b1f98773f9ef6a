package cli_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeHosts writes n IPv4 hosts from base, one per line, or as moat JSON
// deny entries with a comment each.
func writeHosts(t *testing.T, path, base string, n int, asJSON bool) string {
	t.Helper()
	var b strings.Builder
	a := netip.MustParseAddr(base)
	if asJSON {
		b.WriteString("{\"deny\": [\n")
	}
	for i := range n {
		switch {
		case !asJSON:
			fmt.Fprintln(&b, a)
		case i < n-1:
			fmt.Fprintf(&b, "  {\"prefix\": \"%s/32\", \"comment\": \"c%d\"},\n", a, i)
		default:
			fmt.Fprintf(&b, "  {\"prefix\": \"%s/32\", \"comment\": \"c%d\"}\n]}\n", a, i)
		}
		a = a.Next()
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCapacityRefusals: a command that would take a list or the comment
// map over its size (the real sizes: 65536 allowlist IPv4 hosts, 65536
// comments) is refused with one line and exit 2 before it writes
// anything, so that later commands still work; a list filled exactly to
// its size is accepted.
func TestCapacityRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root := newRoot(t)
	seedRules(t, root) // one comment among them
	before := pinnedState(t, root)
	refused := func(t *testing.T, errPart string, args ...string) {
		t.Helper()
		checkUsageError(t, runMain(root, args...), errPart)
		if after := pinnedState(t, root); after != before {
			t.Fatalf("moat %s changed the state", strings.Join(args, " "))
		}
	}

	tooMany := writeHosts(t, filepath.Join(dir, "big.txt"), "10.64.0.0", 65537, false)
	refused(t, "the allowlist holds at most 65536 IPv4 hosts; this change needs 65537", "import", "--list", "allow", tooMany)
	refused(t, "the allowlist holds at most 65536 IPv4 hosts; this change needs 65537", "import", "--replace", "--list", "allow", tooMany)
	comments := writeHosts(t, filepath.Join(dir, "big_comments.json"), "10.128.0.0", 65536, true)
	refused(t, "holds at most 65536 comments (allowlist and denylist together); this change needs 65537", "import", comments)
	mustRun(t, root, "block", "--comment", "still room", "100.64.0.1")
	mustRun(t, root, "unblock", "100.64.0.1")

	full := writeHosts(t, filepath.Join(dir, "full.txt"), "10.64.0.0", 65536, false)
	mustRun(t, root, "import", "--list", "allow", full)
	before = pinnedState(t, root)
	// A change of a few entries counts nothing: the full map refuses it.
	refused(t, "the allowlist holds at most 65536 IPv4 hosts; it has no room for this change", "allow", "2001:db8::1", "10.200.0.1", "10.201.0.0/16")
}
