package syncookie

import (
	"net/netip"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestMonitorModeMarksNewConnections: a connection made while monitor mode
// is on (its SYN and SYN-ACK go to the kernel, past the SYN defence, or
// past a drop that monitor mode turns into a pass) must keep its pure ACKs
// and data once monitor mode is turned off, also before the next census
// pass has seen its socket: the census may not take its unmarked tuple for
// the listener's.
func TestMonitorModeMarksNewConnections(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before sets up what the SYN meets in monitor mode.
		before func(t *testing.T, objs *datapath.MoatObjects)
	}{
		{"past the SYN defence", nil},
		{"past a monitor-mode auto-block", func(t *testing.T, objs *datapath.MoatObjects) {
			// As a limit writes it in monitor mode: in force only while
			// monitoring (RULE_F_AUTO | RULE_F_MONITOR).
			v := datapath.MoatPrefixRule{Prefixlen: 32, Flags: 2 | 4}
			if err := objs.DenyV4Hosts.Put(datapath.MoatHostV4{Addr: client4.As4()}, v); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { monitorModeMarks(t, tc.before) })
	}
}

func monitorModeMarks(t *testing.T, before func(t *testing.T, objs *datapath.MoatObjects)) {
	objs := setup(t)
	if before != nil {
		before(t, objs)
	}
	setMonitor := func(on bool) { t.Helper(); setMonitorMode(t, objs, on) }
	const cport = 41000
	client := netip.AddrPortFrom(client4, cport)
	server := netip.AddrPortFrom(server4, protectedPort)
	ownedACK := testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4},
		L4: testpkt.TCP{SrcPort: cport, DstPort: protectedPort, Seq: 12345, Ack: 67890, ACK: true}}.Bytes()
	warm := synOf(netip.AddrPortFrom(client4, cport+1), server)
	var got uint32
	inScratchNetns(t, func() {
		if err := loUpWith(client4, server4); err != nil {
			t.Errorf("addresses on lo: %v", err)
			return
		}
		ln := listen(t, protectedPort)
		defer ln.Close()
		c, err := NewCensus(objs.MoatSynCensus, objs.SynCensus)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		for range 2 { // trusted from here
			if _, err := c.Take(time.Second); err != nil {
				t.Error(err)
				return
			}
		}
		setMonitor(true)
		// The connection's SYN as moat sees it in monitor mode, then the
		// connection itself, both before the next pass.
		if ret, _ := run(t, objs.MoatFilter, synOf(client, server)); ret != 2 {
			t.Errorf("syn in monitor mode: verdict %d, want XDP_PASS", ret)
		}
		conn, srv, err := dialFrom(ln, client, server)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		defer srv.Close()
		setMonitor(false)
		// The warm-up finds the listener, which this CPU then remembers
		// for the jiffy: the connection's ACK is judged on its census
		// slot alone.
		for try := 0; try < 20; try++ {
			run(t, objs.MoatFilter, warm)
			if got, _ = run(t, objs.MoatFilter, ownedACK); got != 2 {
				break
			}
		}
	})
	if got != 2 {
		t.Errorf("ACK of a connection made in monitor mode: verdict %d after monitor off, want XDP_PASS (2)", got)
	}
}
