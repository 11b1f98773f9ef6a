package daemon_test

import (
	"fmt"
	"testing"
	"time"
)

// TestReloadsApplyInOrder: two reloads through the API close together (a
// config management run that writes the config twice, each write with
// its `moat reload`) leave the maps on the config the file holds at the
// end. The config was read before the daemon's lock: a first reload still
// reading a long rule file applied after a second that had read the file
// as corrected, so the maps went back to the first version while both
// answered OK.
func TestReloadsApplyInOrder(t *testing.T) {
	e := newEnv(t)
	list := e.bigList(500000)
	base := fmt.Sprintf("interfaces:\n  - name: %s\ndeny:\n  - 203.0.113.0/24\n", e.attackerIf())
	e.writeConfig(base)
	e.start()

	post := e.postReload
	// The first version names the long list; its reload reads it a while.
	e.writeConfig(base + "lists:\n  - file: " + list + "\n")
	first := make(chan error, 1)
	go func() {
		res, err := post()
		if err == nil && !res.OK {
			err = fmt.Errorf("%+v", res)
		}
		first <- err
	}()
	time.Sleep(100 * time.Millisecond) // the first reload has read the config file
	select {
	case err := <-first:
		t.Skipf("the first reload was done within 100ms (%v): no overlap to test", err)
	default:
	}
	// The corrected version, and its reload.
	e.writeConfig(base)
	if res, err := post(); err != nil || !res.OK {
		t.Fatalf("second reload: %+v, %v", res, err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first reload: %v", err)
	}
	if got := e.rulesNow(); len(got) != 1 || !contains(got, "deny 203.0.113.0/24") {
		t.Errorf("after both reloads the maps hold %d rules, want only the config file's deny 203.0.113.0/24", len(got))
	}
}
