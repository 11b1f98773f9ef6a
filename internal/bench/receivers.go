package bench

import (
	"bytes"
	"context"
	"fmt"
	"regexp"

	"golang.org/x/sys/unix"
	"strconv"
	"strings"

	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/shield"
)

// receiver is one thing that can sit on the server's attacker-facing
// interface and drop the flood. Only one is attached at a time.
type receiver interface {
	Name() string
	// What says exactly what runs, for the results.
	What() string
	Attach(ctx context.Context) error
	// Dropped is the receiver's own count of packets it dropped, read from
	// its own counters; only differences between two reads mean anything.
	Dropped(ctx context.Context) (uint64, error)
	Detach(ctx context.Context) error
}

// floorRx is an XDP program that returns XDP_DROP and nothing else: no
// filter can drop faster on this interface.
type floorRx struct {
	b *Bench
	d *flood.Dropper
}

func (r *floorRx) Name() string { return "xdp-drop" }
func (r *floorRx) What() string {
	return "XDP program that only returns XDP_DROP (flood_drop in bpf/flood.bpf.c), native mode; its drops are read from the veth's rx_queue_*_xdp_drops counters"
}

func (r *floorRx) Attach(context.Context) error {
	return r.b.lab.Server.Do(func() error {
		var err error
		r.d, err = flood.AttachDropper(r.b.serverIf().Index)
		return err
	})
}

func (r *floorRx) Dropped(ctx context.Context) (uint64, error) {
	return r.b.vethXDPDrops(ctx)
}

func (r *floorRx) Detach(context.Context) error {
	if r.d == nil {
		return nil
	}
	err := r.d.Close()
	r.d = nil
	return err
}

// vethXDPDrops sums the server interface's per-queue XDP drop counters,
// which veth keeps whatever program is attached.
func (b *Bench) vethXDPDrops(ctx context.Context) (uint64, error) {
	return vethStat(ctx, b.lab.Server, b.serverIf().Name, "rx_queue_", "_xdp_drops")
}

// vethStat sums the ethtool statistics of a veth whose names have the
// given prefix and suffix (one per queue).
func vethStat(ctx context.Context, h *lab.Host, ifname, prefix, suffix string) (uint64, error) {
	out, err := h.Command(ctx, "ethtool", "-S", ifname).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ethtool -S %s: %v: %s", ifname, err, out)
	}
	n, err := lab.SumEthtoolStats(out, prefix, suffix)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", ifname, err)
	}
	return n, nil
}

// moatRx is moat's own filter, attached through the shield like
// `moat attach` does, with the denylist already loaded.
type moatRx struct {
	b *Bench
	s *shield.Shield
}

func (r *moatRx) Name() string { return "moat" }
func (r *moatRx) What() string {
	return fmt.Sprintf("moat_filter attached in native mode through internal/shield (as `moat attach`), denylist of %d prefixes (%s); drops read from moat's denylist counter", len(r.b.deny), r.b.denyMixText())
}

func (r *moatRx) Attach(context.Context) error {
	return r.b.lab.Server.Do(func() error {
		_, err := r.s.Attach(r.b.serverIf().Name, shield.ModeNative)
		return err
	})
}

func (r *moatRx) Dropped(context.Context) (uint64, error) {
	c, err := r.s.Counters(r.b.serverIf().Name)
	if err != nil {
		return 0, err
	}
	return c.ByReason["denylist"].Dropped.Packets, nil
}

func (r *moatRx) Detach(context.Context) error {
	return r.b.lab.Server.Do(func() error { return r.s.Detach(r.b.serverIf().Name) })
}

// xdpFilterRx is xdp-filter from xdp-tools. Its address map stays pinned
// (unload --keep-maps) between repetitions, so the addresses are added
// once, with the tool itself.
type xdpFilterRx struct {
	b        *Bench
	features string
	status   string // what `xdp-filter status` said about the program, first attach
}

func (r *xdpFilterRx) Name() string { return "xdp-filter" }
func (r *xdpFilterRx) What() string {
	s := fmt.Sprintf("xdp-filter (%s) `load -m native -f %s`, every flood source added with `xdp-filter ip ADDR -m src` (it matches exact addresses only; %d addresses); drops read from its XDP_DROP statistics", r.b.versions["xdp-tools"], r.features, numAddrs(r.b.floodSources))
	if r.status != "" {
		s += "; status reports: " + r.status
	}
	return s
}

func (r *xdpFilterRx) run(ctx context.Context, args ...string) (string, error) {
	out, err := r.b.lab.Server.Command(ctx, "xdp-filter", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("xdp-filter %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

func (r *xdpFilterRx) Attach(ctx context.Context) error {
	_, err := r.run(ctx, "load", "-m", "native", "-f", r.features, r.b.serverIf().Name)
	return err
}

func (r *xdpFilterRx) Detach(ctx context.Context) error {
	_, err := r.run(ctx, "unload", "--keep-maps", r.b.serverIf().Name)
	return err
}

var (
	xdpFilterDrop  = regexp.MustCompile(`(?m)^\s*XDP_DROP\s+(\d+)\s+pkts`)
	xdpFilterIface = regexp.MustCompile(`(?m)^\s+(\S+)\s+\((\w+) mode\)\s+(\S+)\s*$`)
	xdpFilterAddr  = regexp.MustCompile(`(?m)^\s+\d+\.\d+\.\d+\.\d+\s+src\s+\d+\s*$`)
)

func (r *xdpFilterRx) Dropped(ctx context.Context) (uint64, error) {
	out, err := r.run(ctx, "status")
	if err != nil {
		return 0, err
	}
	if r.status == "" {
		if m := xdpFilterIface.FindStringSubmatch(out); m != nil {
			r.status = fmt.Sprintf("%s mode, features %s, %d source addresses", m[2], m[3], len(xdpFilterAddr.FindAllString(out, -1)))
		}
	}
	m := xdpFilterDrop.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("xdp-filter status shows no XDP_DROP count:\n%s", out)
	}
	return strconv.ParseUint(m[1], 10, 64)
}

// nftRx is an nftables netdev ingress chain on the interface whose rules
// look the source up in the interval sets that hold the denylist. The
// table and sets are filled once; only the chain comes and goes.
type nftRx struct {
	b *Bench
}

const nftChain = "ingress"

func (r *nftRx) Name() string { return "nftables" }
func (r *nftRx) What() string {
	return fmt.Sprintf("nftables %s: table netdev %s, chain `type filter hook ingress device %s priority -500`, rules `ip saddr @%s counter name ... drop` and `ip6 saddr @%s counter name ... drop`; the interval sets hold %s; drops read from the rules' counters",
		r.b.versions["nftables"], nftTable, r.b.serverIf().Name, nftSetV4, nftSetV6, r.b.nftSetsText())
}

func (r *nftRx) nft(ctx context.Context, script string) (string, error) {
	cmd := r.b.lab.Server.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("nft: %v: %s", err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

func (r *nftRx) Attach(ctx context.Context) error {
	_, err := r.nft(ctx, fmt.Sprintf(`add chain netdev %[1]s %[2]s { type filter hook ingress device "%[3]s" priority -500; policy accept; }
add rule netdev %[1]s %[2]s ip saddr @%[4]s counter name %[6]s drop
add rule netdev %[1]s %[2]s ip6 saddr @%[5]s counter name %[7]s drop
`, nftTable, nftChain, r.b.serverIf().Name, nftSetV4, nftSetV6, nftCounterV4, nftCounterV6))
	return err
}

// Dropped reads the rules' named counters through netlink: listing them
// with nft would take minutes with a million set elements.
func (r *nftRx) Dropped(context.Context) (uint64, error) {
	var total uint64
	err := r.b.lab.Server.Do(func() error {
		for _, c := range []string{nftCounterV4, nftCounterV6} {
			n, err := nftCounterPackets(unix.NFPROTO_NETDEV, nftTable, c)
			if err != nil {
				return err
			}
			total += n
		}
		return nil
	})
	return total, err
}

func (r *nftRx) Detach(ctx context.Context) error {
	_, err := r.nft(ctx, fmt.Sprintf("flush chain netdev %[1]s %[2]s\ndelete chain netdev %[1]s %[2]s\n", nftTable, nftChain))
	return err
}

// kernelRx is no filter at all: the kernel's stack takes the flood.
type kernelRx struct{}

func (kernelRx) Name() string                            { return "kernel" }
func (kernelRx) What() string                            { return "no filter: the kernel's stack receives the flood" }
func (kernelRx) Attach(context.Context) error            { return nil }
func (kernelRx) Dropped(context.Context) (uint64, error) { return 0, nil }
func (kernelRx) Detach(context.Context) error            { return nil }
