package syncookie

import (
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/testpkt"
)

// TestFloodEndStaysPut: once the hold time of an auto-mode flood runs out
// with no SYN since, `moat syn status` (and the daemon's "SYN flood ended",
// and the flooding_last_change metric) date the end of the flood at the
// end of the hold. The next SYN, seconds or hours later, clears the data
// path's flag: the flood's end must not move to that SYN's time, as
// nothing changed then.
func TestFloodEndStaysPut(t *testing.T) {
	objs := setup(t)
	// One SYN per CPU window is the threshold: the second SYN is a flood.
	if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, protectedPort, ModeAuto, 1); err != nil {
		t.Fatal(err)
	}
	const hold = 100 * time.Millisecond
	if err := Configure(objs.SynSettings, Config{Hold: hold, ResetsPerSec: -1}); err != nil {
		t.Fatal(err)
	}
	syn := synFrame(nil, client4, server4, testpkt.TCP{})
	var ended, after PortStatus
	withListener(t, func() {
		run(t, objs.MoatFilter, syn)
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 3 {
			t.Fatalf("second SYN in the window: verdict %d, want XDP_TX (flood)", ret)
		}
		time.Sleep(hold + 100*time.Millisecond)
		ended = portStatus(t, objs, protectedPort)
		time.Sleep(300 * time.Millisecond)
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 2 {
			t.Fatalf("SYN after the hold: verdict %d, want XDP_PASS", ret)
		}
		after = portStatus(t, objs, protectedPort)
	})
	if ended.Flooding || after.Flooding {
		t.Fatalf("flooding after the hold: %+v, then %+v", ended, after)
	}
	// Status reads the clocks twice: allow a little skew.
	if d := after.LastChange.Sub(ended.LastChange); d > 20*time.Millisecond || d < -20*time.Millisecond {
		t.Errorf("the flood ended at %v; after a SYN %v later status says %v", ended.LastChange.Format(time.StampMicro),
			d, after.LastChange.Format(time.StampMicro))
	}
}
