package state

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/rules"
)

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "state.json")
	st, err := Load(path)
	if err != nil || len(st.Deny)+len(st.Allow)+len(st.Ports) != 0 {
		t.Fatalf("a missing file must be an empty state: %+v, %v", st, err)
	}
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	st.Deny = []rules.PrefixEntry{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Comment: "c", Expires: &exp}}
	st.Allow = []rules.PrefixEntry{{Prefix: netip.MustParsePrefix("2001:db8::1/128")}}
	spec, _ := rules.ParsePortSpec("udp/19")
	st.Ports = []rules.PortEntry{{Spec: spec, Action: rules.Drop}}
	if err := Save(path, st); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v (%v), want 0600", fi.Mode(), err)
	}
	// Nothing but the state file is left in the directory.
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("directory holds %d files after a save, want 1 (temporary files left?)", len(ents))
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Deny) != 1 || got.Deny[0].Comment != "c" || !got.Deny[0].Expires.Equal(exp) ||
		len(got.Allow) != 1 || len(got.Ports) != 1 || got.Ports[0].Spec != spec {
		t.Errorf("read back %+v", got)
	}
}

// A save that cannot complete leaves no temporary file behind.
func TestFailedSaveLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	st := &State{Deny: []rules.PrefixEntry{{Prefix: netip.MustParsePrefix("192.0.2.1/32")}}}
	if err := Save(path, st); err != nil {
		t.Fatal(err)
	}
	// A directory where the temporary file's rename target is: the
	// rename fails after the new contents were written and synced.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(path, "x"), nil, 0o600)
	if err := Save(path, st); err == nil {
		t.Fatal("save over a directory succeeded")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("a failed save left %d entries in the directory, want 1", len(ents))
	}
}

func TestLoadRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"newer":   `{"version": 99}`,
		"unknown": `{"version": 1, "bogus": 1}`,
		"bad":     `{"version": 1, "deny": [{"prefix": "10.0.0.1/8"}]}`,
		"twice":   `{"version": 1, "deny": [{"prefix": "10.0.0.1/32"}, {"prefix": "10.0.0.1/32"}]}`,
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(text), 0o600)
		if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %v, want one naming the file", name, err)
		}
	}
	// A newer format with fields of its own is refused for its format,
	// not for a field this moat does not know.
	p := filepath.Join(dir, "newer-fields")
	os.WriteFile(p, []byte(`{"version": 2, "limits": []}`), 0o600)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "has format 2; this moat reads up to 1") {
		t.Errorf("newer format with a new field: %v", err)
	}
}

func TestDropExpired(t *testing.T) {
	past, future := time.Now().Add(-time.Second), time.Now().Add(time.Hour)
	st := &State{Deny: []rules.PrefixEntry{
		{Prefix: netip.MustParsePrefix("192.0.2.1/32"), Expires: &past},
		{Prefix: netip.MustParsePrefix("192.0.2.2/32"), Expires: &future},
		{Prefix: netip.MustParsePrefix("192.0.2.3/32")},
	}}
	if n := st.DropExpired(time.Now()); n != 1 || len(st.Deny) != 2 || st.Deny[0].Prefix.String() != "192.0.2.2/32" {
		t.Errorf("dropped %d, left %v", n, st.Deny)
	}
}
