package syncookie

import (
	"slices"
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

// TestProtectAgainMidFloodKeepsCookies: protecting an auto-mode port again
// in the middle of a flood (a daemon's reload that changes its threshold,
// `moat syn protect` again) writes its entry with the flood flag clear and
// keeps the per-CPU windows, which are already past the threshold and
// would not cross it again until they end. The next SYN of such a window
// turns the port to cookies again at once, rather than up to 100 ms of
// the flood later, all of it handed to the kernel.
func TestProtectAgainMidFloodKeepsCookies(t *testing.T) {
	objs := setup(t)
	syn := synFrame(nil, client4, server4, testpkt.TCP{})
	// The four runs must fall in one 100 ms window of the data path: a
	// slow turn tries again.
	for try := 0; ; try++ {
		if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, protectedPort, ModeAuto, 1); err != nil {
			t.Fatal(err)
		}
		var rets []uint32
		var took time.Duration
		withListener(t, func() {
			start := time.Now()
			for i := 0; i < 3; i++ {
				ret, _ := run(t, objs.MoatFilter, syn)
				rets = append(rets, ret)
			}
			// A threshold of 1 per window stays 1: only the flood
			// flag and the detection state change.
			if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, protectedPort, ModeAuto, 1); err != nil {
				t.Fatal(err)
			}
			ret, _ := run(t, objs.MoatFilter, syn)
			rets = append(rets, ret)
			took = time.Since(start)
		})
		if took > 50*time.Millisecond && try < 5 {
			t.Logf("runs took %v: again", took)
			time.Sleep(150 * time.Millisecond)
			continue
		}
		// The first SYN of a window goes to the kernel; the second is
		// over the threshold of one.
		if want := []uint32{2, 3, 3, 3}; !slices.Equal(rets, want) {
			t.Errorf("verdicts %v, want %v: the SYN after protecting the port again went to the kernel", rets, want)
		}
		return
	}
}
