package ratelimit_test

import (
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestGateChargesNoPhantomBytes: the gate passes a source's first packets
// before the source has a bucket, and charges them to the new bucket
// without knowing their lengths. A source under its byte rate and burst is
// never dropped for that, with any gate:
//   - frames longer than a full frame (jumbo, GRO in generic mode) at half
//     the rate: charged at their own length, the packets before one would
//     leave the bucket over its burst at birth, and with --block the
//     source was denied for a minute after a few frames;
//   - small packets, then two full frames: charged at the full frame's
//     length, the small ones filled the bucket, and the second frame was
//     dropped and the source blocked, having sent a fraction of its burst.
//     The sampling gate now charges no bytes for them, and gate none
//     passes no packet before the bucket. The sketch gate still charges
//     them at the crossing packet's length up to a full frame (README,
//     rate limits), and is left out of this case.
func TestGateChargesNoPhantomBytes(t *testing.T) {
	f := newFilter(t)
	big := testpkt.UDPv4(src4, dst4, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: make([]byte, 2958)}) // 3000-byte frame
	small := testpkt.UDPv4(src4, dst4, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: make([]byte, 18)})
	full := testpkt.UDPv4(src4, dst4, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: make([]byte, 1472)}) // 1514
	for _, g := range []ratelimit.Gate{ratelimit.GateSample, ratelimit.GateSketch, ratelimit.GateNone} {
		// 125 kB/s, a burst of 12.5 kB; a gate threshold of 8 packets.
		limit := ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), BPS: 1_000_000,
			Block: ratelimit.Duration(time.Minute)}
		t.Run(g.String()+" long frames at half the rate", func(t *testing.T) {
			f.reset(ratelimit.Config{Gate: g})
			f.add(limit)
			passed := 0
			for range 24 { // 60 kB/s
				passed += f.send(big, 1)
				time.Sleep(50 * time.Millisecond)
			}
			if passed != 24 || f.dropsFor(datapath.MoatVerdictReasonREASON_RATELIMIT) != 0 {
				t.Errorf("%d of 24 passed, %d rate-limit drops, %d denylist drops", passed,
					f.dropsFor(datapath.MoatVerdictReasonREASON_RATELIMIT), f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST))
			}
		})
		if g == ratelimit.GateSketch {
			continue
		}
		t.Run(g.String()+" small packets, then full frames", func(t *testing.T) {
			f.reset(ratelimit.Config{Gate: g})
			f.add(limit)
			passed := 0
			for range 7 {
				passed += f.send(small, 1)
				time.Sleep(20 * time.Millisecond)
			}
			passed += f.send(full, 2)
			passed += f.send(small, 1)
			if passed != 10 {
				t.Errorf("%d of 10 passed (some 3.5 kB against a 12.5 kB burst), %d rate-limit drops, %d denylist drops", passed,
					f.dropsFor(datapath.MoatVerdictReasonREASON_RATELIMIT), f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST))
			}
		})
	}
}
