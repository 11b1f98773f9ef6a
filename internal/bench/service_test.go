package bench

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/flood"
)

// TestFreshServiceDropsHalfOpen: the kernel keeps the half-open
// connections of a SYN flood on its listener and answers each again a
// second later; a fresh listener leaves none of them behind, so none is
// answered again, and it serves requests.
func TestFreshServiceDropsHalfOpen(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a lab needs root")
	}
	ctx := context.Background()
	b := &Bench{cfg: Config{Log: io.Discard}}
	t.Cleanup(func() {
		if err := b.cleanup(); err != nil {
			t.Error(err)
		}
	})
	if err := b.setup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sysctl(b.lab.Server, "net.ipv4.tcp_syncookies", "1"); err != nil {
		t.Fatal(err)
	}
	sink, err := b.attackerSink()
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	halfOpen := func() int {
		t.Helper()
		out, err := b.lab.Server.Command(ctx, "ss", "-Htn", "state", "syn-recv").Output()
		if err != nil {
			t.Fatalf("ss: %v", err)
		}
		return strings.Count(string(out), "\n")
	}
	answers := func() uint64 {
		t.Helper()
		n, err := sink.answers()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	const syns = 1000
	if _, err := b.flood(ctx, flood.Config{Kind: flood.KindSYN, Sources: synSources, DstPort: servicePort, Count: syns}); err != nil {
		t.Fatal(err)
	}
	open := halfOpen()
	if open < syns*9/10 {
		t.Fatalf("%d half-open connections after %d SYNs, want nearly all", open, syns)
	}
	// The first SYN-ACKs are sent again after a second, all at once: the
	// attacker's 256-frame ring takes what it can of the burst (and drops
	// the rest, as it would drop a client's frames arriving then).
	a0 := answers()
	time.Sleep(1300 * time.Millisecond)
	again := answers() - a0
	if again < 200 {
		t.Fatalf("%d SYN-ACKs sent again a second after %d SYNs, want a ring's worth: the listener does not keep them", again, syns)
	}
	t.Logf("%d half-open connections; %d SYN-ACKs counted again after a second", open, again)

	if err := b.freshService(); err != nil {
		t.Fatal(err)
	}
	// The next SYN-ACKs would go 3 s after the flood.
	a1 := answers()
	time.Sleep(2500 * time.Millisecond)
	if again := answers() - a1; again > syns/100 {
		t.Errorf("%d SYN-ACKs sent again after the fresh listener", again)
	}
	if n := halfOpen(); n != 0 {
		t.Errorf("%d half-open connections left after the fresh listener", n)
	}
	target := b.placements()[0].target.String()
	if err := b.lab.Client.Do(func() error { _, _, err := request(target); return err }); err != nil {
		t.Errorf("request to the fresh service: %v", err)
	}
}
