package daemon_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/daemon"
)

// TestStopFinishesAReload: SIGTERM while a reload through the API runs
// (`systemctl restart moat` or a shutdown during `moat reload`) lets the
// reload finish and answer before the daemon exits. The daemon returned
// at once, which ended the process in the middle of the apply: the maps
// kept half the change, and `moat reload` got only EOF.
func TestStopFinishesAReload(t *testing.T) {
	e := newEnv(t)
	// A rule file whose removal takes a while.
	list := e.bigList(200000)
	base := fmt.Sprintf("interfaces:\n  - name: %s\ndeny:\n  - 203.0.113.0/24\n", e.attackerIf())
	e.writeConfig(base + "lists:\n  - file: " + list + "\n")
	e.start()
	e.writeConfig(base)

	type answer struct {
		res daemon.ReloadResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		a.res, a.err = e.postReload()
		done <- a
	}()
	// The config is read and checked (log_level debug): what is left is
	// the apply, which deletes 200,000 entries.
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(e.log.String(), "reload: config read and checked"); {
		if time.Now().After(deadline) {
			t.Fatalf("the reload did not start:\n%s", e.log)
		}
		time.Sleep(time.Millisecond)
	}
	e.stop(syscall.SIGTERM)
	a := <-done
	if a.err != nil || !a.res.OK {
		t.Fatalf("a reload under way when the daemon stopped answered %+v, %v; want it finished and answered\ndaemon log:\n%s", a.res, a.err, e.log)
	}
	if got := e.rulesNow(); len(got) != 1 || !contains(got, "deny 203.0.113.0/24") {
		t.Errorf("rules after the reload and the stop: %d, want only the config's deny 203.0.113.0/24 (first: %.200q)", len(got), strings.Join(got, "\n"))
	}
}
