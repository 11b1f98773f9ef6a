package daemon_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/shield"
)

// TestReloadModeTheFilterRunsIn: a reload that writes an interface's mode
// otherwise but asks nothing of its filter (auto for a filter in any
// mode, or the mode it runs in) applies. It was refused as a change that
// needs a restart, "detach, then start": a moment without a filter for
// nothing. A mode the filter does not run in is still refused.
func TestReloadModeTheFilterRunsIn(t *testing.T) {
	e := newEnv(t)
	base := fmt.Sprintf("interfaces:\n  - name: %s\n    mode: generic\ndeny:\n  - 203.0.113.0/24\n", e.attackerIf())
	e.writeConfig(base)
	e.start()
	// Read where the daemon runs: the interface's index names it only
	// in the server's namespace.
	attachment := func() (a shield.Attachment) {
		t.Helper()
		if err := e.lab.Server.Do(func() error {
			s, err := shield.Open(e.root)
			if err != nil {
				return err
			}
			defer s.Close()
			atts, err := s.Attachments()
			if len(atts) == 1 {
				a = atts[0]
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return a
	}
	link := attachment().LinkID
	for _, mode := range []string{"auto", "generic"} {
		e.writeConfig(strings.Replace(base, "mode: generic", "mode: "+mode, 1))
		if r := e.moat("reload"); r.code != 0 {
			t.Fatalf("reload to mode %s (the filter runs in generic mode): exit %d\n%s%s", mode, r.code, r.stdout, r.stderr)
		}
		if a := attachment(); a.Mode != shield.ModeGeneric || a.LinkID != link {
			t.Errorf("after the reload to mode %s: %+v, want the same link (%d) in generic mode", mode, a, link)
		}
	}
	e.writeConfig(strings.Replace(base, "mode: generic", "mode: native", 1))
	e.refusedReload("the mode changes from generic to native; that needs a restart")
}
