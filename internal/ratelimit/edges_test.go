package ratelimit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestFrameLongerThanTheByteBurst: a frame longer than a limit's byte
// burst passes when the bucket is full, and empties it. It used to be
// dropped whatever the bucket held, and its source blocked on its first
// packet.
func TestFrameLongerThanTheByteBurst(t *testing.T) {
	f := newFilter(t)
	f.reset(ratelimit.Config{Gate: ratelimit.GateNone})
	f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), BPS: 100_000, BurstBytes: 1518,
		Block: ratelimit.Duration(time.Minute)})
	big, err := testpkt.Frame{Tags: testpkt.QinQ(1, 2), Net: testpkt.IPv4{Src: src4, Dst: dst4},
		L4: testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: make([]byte, 1472)}}.Build()
	if err != nil {
		t.Fatal(err)
	}
	if len(big) <= 1518 {
		t.Fatalf("frame of %d bytes: want one longer than the burst", len(big))
	}
	if got := f.send(big, 1); got != 1 {
		t.Fatalf("the first %d-byte frame of a source was dropped", len(big))
	}
	// The bucket is empty now: at 12,500 bytes a second the next one is
	// over the limit, and the source is blocked.
	if got := f.send(big, 3); got != 0 {
		t.Errorf("%d of 3 frames passed an empty bucket", got)
	}
	if d := f.dropsFor(datapath.MoatVerdictReasonREASON_RATELIMIT); d != 1 {
		t.Errorf("rate-limit drops %d, want 1 (then the denylist)", d)
	}
}

// TestApplyOfManyNewLimits: a config whose limits are all new, with as
// many old ones stored, does not fit in the rule ids side by side; the old
// go first and the new all land, where Apply used to stop part way.
func TestApplyOfManyNewLimits(t *testing.T) {
	f := newFilter(t)
	f.reset(ratelimit.Config{Gate: ratelimit.GateSample})
	set := func(base int) []ratelimit.Limit {
		var ls []ratelimit.Limit
		for i := 0; i < 130; i++ {
			ls = append(ls, ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, fmt.Sprintf("udp/%d", base+i)), PPS: 100})
		}
		return ls
	}
	if err := ratelimit.Apply(f.rl, set(1000)); err != nil {
		t.Fatal(err)
	}
	if err := ratelimit.Apply(f.rl, set(2000)); err != nil {
		t.Fatalf("apply of 130 new limits over 130 old: %v", err)
	}
	st, err := f.rl.Limits()
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 130 || st[0].Scope.String() != "udp/2000" || st[129].Scope.String() != "udp/2129" {
		t.Errorf("%d limits stored, from %v to %v; want udp/2000 to udp/2129", len(st), st[0].Scope, st[len(st)-1].Scope)
	}
}

// TestSampleChangeForgetsHeavyHitters: heavy-hitter counts are read
// scaled by the current sample rate, so a change of the rate starts them
// over; any other change of the switches keeps them.
func TestSampleChangeForgetsHeavyHitters(t *testing.T) {
	f := newFilter(t)
	cfg := ratelimit.Config{HeavyHitters: true, Sample: 1, Gate: ratelimit.GateSample}
	f.reset(cfg)
	count := func() int {
		t.Helper()
		hh, err := f.rl.HeavyHitters()
		if err != nil {
			t.Fatal(err)
		}
		return len(hh)
	}
	// Every packet is sampled; a source enters the table at its second.
	f.send(udp4(src4, 53), 4)
	if count() != 1 {
		t.Fatalf("%d heavy hitters after 4 sampled packets of one source, want 1", count())
	}
	cfg.Shape = true
	if err := f.rl.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	if count() != 1 {
		t.Errorf("turning the shape on dropped the heavy hitters")
	}
	cfg.Sample = 64
	if err := f.rl.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Errorf("%d heavy hitters after the sample changed, want none", n)
	}
}

// TestScopeChangeLeavesNoGap: a config that widens a limit's scope
// (udp/53 to udp/50-60) moves the shared slot from the old rule to the
// new in one write. A reader of the slot never finds it empty, where the
// old order cleared it and spent a scan of the source buckets before the
// new rule took it.
func TestScopeChangeLeavesNoGap(t *testing.T) {
	f := newFilter(t)
	f.reset(ratelimit.Config{Gate: ratelimit.GateSample})
	old := ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp/53"), PPS: 100}
	wide := ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp/50-60"), PPS: 200}
	slot := uint32(datapath.MoatPortClassPORT_CLASS_UDP)<<16 | 53
	for round := 0; round < 20; round++ {
		from, to := old, wide
		if round%2 == 1 {
			from, to = wide, old
		}
		if err := ratelimit.Apply(f.rl, []ratelimit.Limit{from}); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		empty := make(chan int, 1)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					empty <- n
					return
				default:
				}
				var s datapath.MoatRlSlot
				if err := f.rl.PortScopes.Lookup(slot, &s); err == nil && s.Source == 0 {
					n++
				}
			}
		}()
		err := ratelimit.Apply(f.rl, []ratelimit.Limit{to})
		close(stop)
		if n := <-empty; n > 0 {
			t.Fatalf("round %d, %s to %s: the udp/53 slot was read empty %d times", round, from.Scope, to.Scope, n)
		}
		if err != nil {
			t.Fatal(err)
		}
		st, err := f.rl.Limits()
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 1 || st[0].Scope != to.Scope {
			t.Fatalf("round %d: stored %+v, want only %s", round, st, to.Scope)
		}
	}
	// The last round narrowed udp/50-60 to udp/53: the slots only the wide
	// limit had are cleared.
	var s datapath.MoatRlSlot
	if err := f.rl.PortScopes.Lookup(uint32(datapath.MoatPortClassPORT_CLASS_UDP)<<16|50, &s); err != nil || s.Source != 0 {
		t.Errorf("udp/50 slot %+v, %v: want it cleared", s, err)
	}
}
