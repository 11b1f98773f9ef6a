package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCheckConfigFeedFiles: --file-only checks a file meant for another
// host, so the files its feeds name need not be here (the README's feed
// example names /etc/moat/fleet-ca.pem); without it, a missing CA file is
// refused on its line, as the daemon would refuse it.
func TestCheckConfigFeedFiles(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(# on every edge host\n.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no ```yaml block starting with # on every edge host")
	}
	dir := t.TempDir()
	example := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(example, m[1], 0o600); err != nil {
		t.Fatal(err)
	}
	// check-config opens no state: the root is never created.
	root := filepath.Join(dir, "no-root")
	r := runMain(root, "check-config", "--file-only", example)
	if r.code != 0 || !strings.Contains(r.stdout, example+": ok: ") || !strings.Contains(r.stdout, "2 feeds") {
		t.Fatalf("check-config --file-only of the README's feed example:\n%v", r)
	}

	missing := filepath.Join(dir, "missing.yaml")
	ca := filepath.Join(dir, "absent-ca.pem")
	text := "deny:\n  - 192.0.2.1\nlists:\n  - url: https://rules.example/deny.txt\n    ca_file: " + ca + "\n"
	if err := os.WriteFile(missing, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	r = runMain(root, "check-config", missing)
	want := missing + ":4: lists[1]: ca_file: stat " + ca + ": no such file or directory\nmoat: " + missing + ": 1 error\n"
	if r.code != 2 || r.stderr != want || r.stdout != "" {
		t.Fatalf("check-config with a missing CA file:\n%v\nwant stderr:\n%s", r, want)
	}
	if r := runMain(root, "check-config", "--file-only", missing); r.code != 0 {
		t.Fatalf("check-config --file-only with a missing CA file:\n%v", r)
	}
}
