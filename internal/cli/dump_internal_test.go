package cli

import (
	"errors"
	"testing"

	"github.com/moat-shield/moat/internal/capture"
	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
)

// An IPv4-mapped --net becomes the IPv4 prefix it maps; one shorter than
// /96 maps none and is refused.
func TestDumpFilterMappedNet(t *testing.T) {
	for _, c := range []struct{ net, want string }{
		{"::ffff:198.51.100.0/120", "198.51.100.0/24"},
		{"::ffff:198.51.100.7/128", "198.51.100.7/32"},
		{"::ffff:0:0/96", "0.0.0.0/0"},
		{"::ffff:0:0/90", ""},
		{"::ffff:0:0/0", ""},
	} {
		cmd := newDumpCmd(&globals{})
		if err := cmd.ParseFlags([]string{"--net", c.net}); err != nil {
			t.Fatal(err)
		}
		var d dumpFlags
		d.verdict, d.net = "all", c.net
		f, err := d.filter(cmd)
		var ue *usageError
		switch {
		case c.want == "" && !errors.As(err, &ue):
			t.Errorf("--net %s: %v (prefix %s), want a usage error", c.net, err, f.Prefix)
		case c.want != "" && (err != nil || f.Prefix.String() != c.want):
			t.Errorf("--net %s: prefix %s, %v; want %s", c.net, f.Prefix, err, c.want)
		}
	}
}

// TestCommentCacheTellsMonitoredApart: a frame that monitor mode passed
// and one the policy passed share action, reason and rule; the cache must
// not give one the other's comment.
func TestCommentCacheTellsMonitoredApart(t *testing.T) {
	cc := newCommentCache(nil)
	reason := shield.Reason(datapath.MoatVerdictReasonREASON_MALFORMED)
	passed := capture.Packet{Action: capture.ActionPass, Reason: reason}
	monitored := passed
	monitored.Monitored = true
	for _, c := range []struct {
		p    capture.Packet
		want string
	}{{passed, "moat: pass malformed"}, {monitored, "moat: monitored malformed"}, {passed, "moat: pass malformed"}} {
		if got := cc.get(c.p); got != c.want {
			t.Errorf("comment %q, want %q", got, c.want)
		}
	}
}
