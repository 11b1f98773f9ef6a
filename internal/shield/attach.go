package shield

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/syncookie"
)

// Mode is how the XDP program is attached.
type Mode string

const (
	ModeAuto    Mode = ""        // native, falling back to generic
	ModeNative  Mode = "native"  // in the driver
	ModeGeneric Mode = "generic" // after the kernel has built an skb
)

// ParseMode reads a --mode value.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "auto":
		return ModeAuto, nil
	case "native", "drv", "driver":
		return ModeNative, nil
	case "generic", "skb":
		return ModeGeneric, nil
	}
	return "", userErrorf("invalid mode %q: want auto, native or generic", s)
}

func (s *Shield) ifacesDir() string { return filepath.Join(s.root, "ifaces") }
func (s *Shield) ifaceDir(name string) string {
	return filepath.Join(s.ifacesDir(), pinName(name))
}

// pinName turns an interface name into a bpffs name: bpffs refuses dots,
// which VLAN devices such as eth0.100 have. The escape is reversible.
func pinName(iface string) string {
	return strings.NewReplacer("%", "%25", ".", "%2e").Replace(iface)
}

func ifaceName(pin string) string {
	return strings.NewReplacer("%2e", ".", "%25", "%").Replace(pin)
}

// filterObjects is what an interface needs from the object: its program and
// its own counters; the shared maps come from the pins.
type filterObjects struct {
	Filter *ebpf.Program `ebpf:"moat_filter"`
	// SynAccept completes handshakes whose cookie the filter issued; it
	// runs at tcx ingress because the kfunc that hands the kernel a request
	// socket exists only for skb programs.
	SynAccept *ebpf.Program `ebpf:"moat_syn_accept"`
	Counters  *ebpf.Map     `ebpf:"counters"`
	// HHSeed keys the heavy-hitter gate's fingerprints (bpf/include/
	// ratelimit_maps.h), drawn afresh for every filter loaded.
	HHSeed *ebpf.Variable `ebpf:"hh_seed"`
}

func (o *filterObjects) Close() {
	for _, c := range []interface{ Close() error }{o.Filter, o.SynAccept, o.Counters} {
		if c != nil && !reflect.ValueOf(c).IsNil() {
			c.Close()
		}
	}
}

// loadFilter loads the XDP program against the shared maps. counters is
// the interface's existing counters map, or nil for a new one.
func (s *Shield) loadFilter(counters *ebpf.Map) (*filterObjects, error) {
	spec := s.spec.Copy()
	repl := make(map[string]*ebpf.Map, len(s.maps)+1)
	for name, m := range s.maps {
		repl[name] = m
	}
	if counters != nil {
		repl[datapath.MoatMapCounters] = counters
	}
	for name, m := range repl {
		spec.Maps[name].Flags = withAccessFlags(spec.Maps[name].Flags, m)
	}
	if err := PrepareFilter(spec); err != nil {
		return nil, err
	}
	var objs filterObjects
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		return nil, fmt.Errorf("load XDP program: %w", err)
	}
	return &objs, nil
}

// PrepareFilter writes into spec what a filter takes at its load: a
// heavy-hitter seed (hh_seed) drawn from the CSPRNG, and what it must
// know of the running kernel (datapath.SetKernelConstants).
func PrepareFilter(spec *ebpf.CollectionSpec) error {
	if err := datapath.SetKernelConstants(spec); err != nil {
		return err
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return fmt.Errorf("draw the heavy-hitter seed: %w", err)
	}
	v, ok := spec.Variables[datapath.MoatVarHhSeed]
	if !ok {
		return fmt.Errorf("the BPF object has no %s", datapath.MoatVarHhSeed)
	}
	if err := v.Set(binary.NativeEndian.Uint64(seed[:])); err != nil {
		return fmt.Errorf("set the heavy-hitter seed: %w", err)
	}
	return nil
}

// AttachResult says what Attach did.
type AttachResult struct {
	Iface    string
	Mode     Mode
	Replaced bool   // an attached program was replaced in place
	Warning  string // e.g. the fallback to generic mode
}

// warn adds w to the result's warnings.
func (r *AttachResult) warn(w string) {
	if w == "" {
		return
	}
	if r.Warning != "" {
		r.Warning += "; "
	}
	r.Warning += w
}

// Attach loads the filter on an interface and pins it. If moat is attached
// there already, the program is replaced through the link (link.Update), so
// there is no moment without a filter; the counters carry over.
func (s *Shield) Attach(name string, mode Mode) (AttachResult, error) {
	res, err := s.attach(name, mode)
	if err != nil {
		return res, err
	}
	// The filter replaced may have been the last of an older moat.
	if err := errors.Join(s.ensureSummary(), s.ensureSynSlots()); err != nil {
		return res, &FollowUpError{Done: "attached to", Iface: name, Err: err}
	}
	return res, nil
}

// FollowUpError is an error of Attach or Detach after the interface was
// attached or detached: the state around the filters (the deny summary,
// the SYN counters' slots) could not be brought up to date. What was
// asked of the interface is done, and undoing it would not mend the rest.
type FollowUpError struct {
	Done  string // "attached to" or "detached from"
	Iface string
	Err   error
}

func (e *FollowUpError) Error() string {
	return fmt.Sprintf("%s %s, but: %s", e.Done, e.Iface, strings.ReplaceAll(e.Err.Error(), "\n", "; "))
}

func (e *FollowUpError) Unwrap() error { return e.Err }

// FollowUp splits err into the warning of a FollowUpError, and what is
// left of err: nil when it was one.
func FollowUp(err error) (warning string, rest error) {
	if fe := (*FollowUpError)(nil); errors.As(err, &fe) {
		return fe.Error(), nil
	}
	return "", err
}

func (s *Shield) attach(name string, mode Mode) (AttachResult, error) {
	iface, err := net.InterfaceByName(name)
	if err != nil {
		return AttachResult{}, userErrorf("no interface %q", name)
	}
	res := AttachResult{Iface: name}
	// An interface renamed since attach takes its pins along first: the
	// pins of the old name are then its own no more, and the new name
	// finds its filter to replace.
	renamed, err := s.followRenames()
	if err != nil {
		return res, err
	}
	res.Warning = strings.Join(renamed, "; ")
	dir := s.ifaceDir(name)
	if _, err := os.Stat(dir); err == nil {
		if !pinnedLinkGone(dir, iface.Index) {
			r, err := s.replace(name, iface.Index, mode)
			w := r.Warning
			r.Warning = res.Warning
			r.warn(w)
			return r, err
		}
		// The interface was deleted since moat attached to it, and one of
		// the same name made since: the pinned links died with the old
		// one. Their pins go, and the new interface gets a filter of its
		// own, with counters from zero.
		if err := os.RemoveAll(dir); err != nil {
			return res, fmt.Errorf("remove the pins of the deleted %s: %w", name, err)
		}
		res.warn(fmt.Sprintf("%s was deleted and made again since moat attached to it; attached anew, counters from zero", name))
	}

	objs, err := s.loadFilter(nil)
	if err != nil {
		return res, err
	}
	defer objs.Close()

	attach := func(flags link.XDPAttachFlags) (link.Link, error) {
		return link.AttachXDP(link.XDPOptions{Program: objs.Filter, Interface: iface.Index, Flags: flags})
	}
	var l link.Link
	switch mode {
	case ModeNative:
		l, err = attach(link.XDPDriverMode)
		res.Mode = ModeNative
	case ModeGeneric:
		l, err = attach(link.XDPGenericMode)
		res.Mode = ModeGeneric
	default:
		res.Mode = ModeNative
		l, err = attach(link.XDPDriverMode)
		if err != nil {
			res.Mode = ModeGeneric
			res.warn(fmt.Sprintf("native XDP is not available on %s (%v); attached in generic mode, which is much slower", name, err))
			l, err = attach(link.XDPGenericMode)
		}
	}
	if err != nil {
		// EEXIST: a program in the other mode; EBUSY: a link or program in
		// this mode. Either way the interface is taken: the user's call.
		if errors.Is(err, os.ErrExist) || errors.Is(err, unix.EBUSY) || errors.Is(err, ebpf.ErrNotSupported) {
			return res, userErrorf("attach to %s: %v (is another XDP program attached?)", name, err)
		}
		return res, fmt.Errorf("attach to %s: %w", name, err)
	}
	defer l.Close()
	tcIndex, bridge := acceptorIfindex(iface.Index)
	tcl, err := syncookie.AttachTC(objs.SynAccept, tcIndex)
	if err != nil {
		return res, err
	}
	defer tcl.Close()
	if bridge != "" {
		res.warn(bridgeNote(name, bridge))
	}

	// Pin into a temporary directory and rename it into place, so that a
	// reader finds either nothing or the whole set.
	if err := os.MkdirAll(s.ifacesDir(), 0o700); err != nil {
		return res, err
	}
	tmp, err := os.MkdirTemp(s.ifacesDir(), tmpPrefix+"attach-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	for path, pin := range map[string]func(string) error{
		"link": l.Pin, "prog": objs.Filter.Pin, "counters": objs.Counters.Pin,
		"tc-link": tcl.Pin, "tc-prog": objs.SynAccept.Pin,
	} {
		if err := pin(filepath.Join(tmp, path)); err != nil {
			return res, fmt.Errorf("pin %s: %w", path, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return res, fmt.Errorf("pin %s: %w", dir, err)
	}
	return res, nil
}

// pinnedLinkGone says whether the XDP link pinned in dir no longer
// attaches to the interface ifindex: the interface it was made for was
// deleted (the kernel reports ifindex 0) or is another one now. When the
// link cannot be read it is not called gone: replace reports the error.
func pinnedLinkGone(dir string, ifindex int) bool {
	idx, _, ok := pinnedIfindex(dir)
	return ok && idx != ifindex
}

// pinnedIfindex is the interface that the XDP link pinned in dir attaches
// to, 0 for one deleted since, and the link's program; ok is false when
// the link cannot be read.
func pinnedIfindex(dir string) (ifindex int, prog ebpf.ProgramID, ok bool) {
	l, err := link.LoadPinnedLink(filepath.Join(dir, "link"), nil)
	if err != nil {
		return 0, 0, false
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil || info.XDP() == nil {
		return 0, 0, false
	}
	return int(info.XDP().Ifindex), info.Program, true
}

// renamePrefix names the pins that followRenames moves in two steps, between
// them: a tmpPrefix name, which the pin listings skip.
var renamePrefix = tmpPrefix + "rename-"

// RenamedTo says whether this Shield moved the pins of interface name to
// its new name, and which (followRenames).
func (s *Shield) RenamedTo(name string) (string, bool) {
	to, ok := s.renamed[name]
	return to, ok
}

// followRenames moves the pins of each interface renamed since moat
// attached to it under its new name, and says which it moved. Pins go by
// name, links by index: a renamed interface keeps its filter, but under
// its old name no command found it (status showed the old name, attach to
// the new one met moat's own program), and attaching to a new interface of
// the old name took the filter away from the renamed one.
//
// Pins already under the new name are a deleted interface's (their link
// reports no interface), which go, or another live interface's, whose
// pins stay where they are unless that interface was renamed too: names
// swapped between interfaces move through temporary names.
func (s *Shield) followRenames() ([]string, error) {
	pins, err := PinnedInterfaces(s.root)
	if err != nil {
		return nil, err
	}
	// Pins that a move cut short left under a temporary name (below)
	// are moved to their interface's name like the others.
	if ents, err := os.ReadDir(s.ifacesDir()); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), renamePrefix) {
				pins = append(pins, PinnedInterface{Dir: filepath.Join(s.ifacesDir(), e.Name())})
			}
		}
	}
	type move struct{ from, to, dir string }
	var moves []move
	leaving := map[string]bool{}
	for _, p := range pins {
		idx, prog, ok := pinnedIfindex(p.Dir)
		if !ok || idx == 0 {
			continue
		}
		// An index names an interface of this network namespace only:
		// the interface there must run the link's program, or the link
		// is another namespace's (attached from within it), and its
		// pins are left alone.
		nl, err := netlink.LinkByIndex(idx)
		if err != nil || nl.Attrs().Xdp == nil || nl.Attrs().Xdp.ProgId != uint32(prog) {
			continue
		}
		if name := nl.Attrs().Name; name != p.Name {
			moves = append(moves, move{p.Name, name, p.Dir})
			leaving[p.Name] = true
		}
	}
	var todo []move
	for _, m := range moves {
		to := s.ifaceDir(m.to)
		if _, err := os.Stat(to); err == nil && !leaving[m.to] {
			idx, _, ok := pinnedIfindex(to)
			if !ok || idx != 0 {
				continue // a live interface's pins, or unreadable ones
			}
			if err := s.detach(m.to); err != nil {
				return nil, fmt.Errorf("remove the pins of the deleted %s: %w", m.to, err)
			}
		}
		todo = append(todo, m)
	}
	// Two steps, through temporary names, so that names swapped between
	// interfaces never meet.
	var moved []string
	tmp := make([]string, len(todo))
	for i, m := range todo {
		tmp[i] = filepath.Join(s.ifacesDir(), fmt.Sprintf("%s%d-%d", renamePrefix, os.Getpid(), i))
		if err := os.Rename(m.dir, tmp[i]); err != nil {
			for j := i - 1; j >= 0; j-- {
				os.Rename(tmp[j], todo[j].dir)
			}
			return nil, fmt.Errorf("move the pins of %s, renamed %s: %w", m.from, m.to, err)
		}
	}
	var errs []error
	for i, m := range todo {
		if err := os.Rename(tmp[i], s.ifaceDir(m.to)); err != nil {
			// Back where they were; or else left under the temporary
			// name, which the next look moves on.
			os.Rename(tmp[i], m.dir)
			errs = append(errs, fmt.Errorf("move the pins of %s, renamed %s: %w", m.from, m.to, err))
			continue
		}
		if s.renamed == nil {
			s.renamed = map[string]string{}
		}
		if m.from == "" {
			moved = append(moved, fmt.Sprintf("the pins of %s, left aside by a move cut short, are back under its name", m.to))
			continue
		}
		s.renamed[m.from] = m.to
		moved = append(moved, fmt.Sprintf("%s was renamed %s since moat attached to it; its filter and counters follow it", m.from, m.to))
	}
	return moved, errors.Join(errs...)
}

// replace swaps the program behind an interface's pinned link.
func (s *Shield) replace(name string, ifindex int, mode Mode) (AttachResult, error) {
	res := AttachResult{Iface: name, Replaced: true}
	dir := s.ifaceDir(name)
	cur, err := currentMode(ifindex)
	if err != nil {
		return res, err
	}
	res.Mode = cur
	if mode != ModeAuto && mode != cur {
		return res, userErrorf("%s is attached in %s mode; detach it first to change the mode", name, cur)
	}
	l, err := link.LoadPinnedLink(filepath.Join(dir, "link"), nil)
	if err != nil {
		return res, fmt.Errorf("open pinned link of %s: %w", name, err)
	}
	defer l.Close()
	counters, err := ebpf.LoadPinnedMap(filepath.Join(dir, "counters"), nil)
	if err != nil {
		return res, fmt.Errorf("open counters of %s: %w", name, err)
	}
	defer counters.Close()
	objs, err := s.loadFilter(counters)
	newCounters := false
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// This version counts more reasons than the one that attached:
		// the interface gets a new counters map and starts from zero.
		objs, err = s.loadFilter(nil)
		newCounters = true
	}
	if err != nil {
		return res, err
	}
	defer objs.Close()
	tcl, err := link.LoadPinnedLink(filepath.Join(dir, "tc-link"), nil)
	if err != nil {
		return res, fmt.Errorf("open pinned tc link of %s: %w", name, err)
	}
	defer tcl.Close()
	// The acceptor goes where acceptorIfindex says (an interface made a
	// bridge port since moat attached to it gets it on the bridge, one
	// taken out of its bridge gets it back), and first in the tcx chain
	// there (syncookie.AttachTC): one with programs ahead of it (attached
	// by an older moat, which took the tail, or put behind by a tool
	// attached at the head since) moves to the head. The new program gets
	// its link before the old link goes, so no cookie ACK meets neither.
	tcIndex, bridge := acceptorIfindex(ifindex)
	moved, ahead := false, 0
	if info, err := tcl.Info(); err == nil && info.TCX() != nil {
		if int(info.TCX().Ifindex) == tcIndex {
			if n, ok, err := syncookie.TCXAhead(tcIndex, info.Program); err == nil && ok {
				ahead = n
			}
		}
		moved = int(info.TCX().Ifindex) != tcIndex || ahead > 0
	}
	if moved {
		nl, err := syncookie.AttachTC(objs.SynAccept, tcIndex)
		if err != nil {
			return res, err
		}
		defer nl.Close()
		// The old link loses its pin here, and goes with tcl.Close.
		if err := pinOver(dir, "tc-link", nl); err != nil {
			return res, err
		}
		switch {
		case ahead > 0:
			res.warn(fmt.Sprintf("moat's SYN acceptor on %s ran behind %d other tcx ingress program(s), "+
				"which could keep cookie handshakes from it; it runs first now", name, ahead))
		case bridge != "":
			res.warn(bridgeNote(name, bridge))
		}
	}
	// The acceptor first, so that it knows every cookie the new filter
	// can issue.
	for _, u := range []struct {
		l    link.Link
		prog *ebpf.Program
		pin  string
	}{{tcl, objs.SynAccept, "tc-prog"}, {l, objs.Filter, "prog"}} {
		if u.pin == "tc-prog" && moved {
			// Attached above, on a link of its own.
		} else if err := u.l.Update(u.prog); err != nil {
			return res, fmt.Errorf("replace program on %s: %w", name, err)
		}
		if err := pinOver(dir, u.pin, u.prog); err != nil {
			return res, err
		}
	}
	if newCounters {
		if err := pinOver(dir, "counters", objs.Counters); err != nil {
			return res, err
		}
	}
	return res, nil
}

// pinOver pins p at dir/name in place of what is pinned there: through
// dir/name-new, renamed onto it, so that a reader opens one or the other,
// never neither. A name-new that a replacement cut short left behind goes
// first: it would keep its object (a second acceptor, say) alive for good,
// and make every later replacement fail.
func pinOver(dir, name string, p interface {
	Pin(string) error
	Unpin() error
}) error {
	next := filepath.Join(dir, name+"-new")
	if err := os.Remove(next); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := p.Pin(next); err != nil {
		return err
	}
	if err := os.Rename(next, filepath.Join(dir, name)); err != nil {
		p.Unpin()
		return err
	}
	return nil
}

// acceptorIfindex is the interface at whose tcx ingress moat's SYN
// acceptor runs for a filter attached to interface ifindex: that
// interface, or for a port of a bridge the bridge, with its name. Frames
// for this host arrive at a bridge port and go up through the bridge
// device; on the way the bridge's netfilter (br_netfilter, with
// net.bridge.bridge-nf-call-iptables or -ip6tables on, as on hosts of
// Kubernetes, Docker or Proxmox) orphans the skb, which drops the request
// socket an acceptor at the port handed the kernel, and the kernel resets
// the handshake. At the bridge's ingress the acceptor runs after that.
//
// The bridge may be more than one master up: a NIC enslaved to a bond
// that is a port of the bridge (a hypervisor's usual uplink) has its
// frames go NIC, bond, bridge, through the same netfilter.
func acceptorIfindex(ifindex int) (int, string) {
	return acceptorIfindexWith(ifindex, netlink.LinkByIndex)
}

// maxMasters bounds the walk up a chain of masters (a bond's slave, the
// bond, its bridge): the kernel nests no deeper in practice.
const maxMasters = 4

func acceptorIfindexWith(ifindex int, byIndex func(int) (netlink.Link, error)) (int, string) {
	idx := ifindex
	for range maxMasters {
		l, err := byIndex(idx)
		if err != nil || l.Attrs().MasterIndex == 0 {
			return ifindex, ""
		}
		m, err := byIndex(l.Attrs().MasterIndex)
		if err != nil {
			return ifindex, ""
		}
		if m.Type() == "bridge" {
			return m.Attrs().Index, m.Attrs().Name
		}
		idx = m.Attrs().Index
	}
	return ifindex, ""
}

// bridgeNote tells that iface's acceptor runs at its bridge's ingress.
// The daemon logs it too, where `moat attach` is refused and the daemon
// follows the bridge itself: the note says both.
func bridgeNote(iface, bridge string) string {
	return fmt.Sprintf("%s is a port of bridge %s: moat's SYN acceptor runs at %s's tcx ingress, "+
		"where this host's frames arrive past the bridge's netfilter; if %s leaves the bridge or the bridge is made anew, "+
		"moat must attach to %s again: a daemon whose config names it does so itself within a sample period, otherwise run `moat attach %s`",
		iface, bridge, bridge, iface, iface, iface)
}

// currentMode asks the kernel how XDP is attached to an interface.
func currentMode(ifindex int) (Mode, error) {
	nl, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return "", fmt.Errorf("read interface %d: %w", ifindex, err)
	}
	if x := nl.Attrs().Xdp; x != nil {
		switch x.AttachMode {
		case nlXDPAttachedDrv:
			return ModeNative, nil
		case nlXDPAttachedSkb:
			return ModeGeneric, nil
		}
	}
	return "", nil
}

const (
	nlXDPAttachedDrv = nl.XDP_ATTACHED_DRV
	nlXDPAttachedSkb = nl.XDP_ATTACHED_SKB
)

// Detach removes moat from an interface: the link is unpinned and closed,
// which detaches the program, and the interface's pins are removed.
func (s *Shield) Detach(name string) error {
	if err := s.detach(name); err != nil {
		return err
	}
	if _, err := os.Stat(s.root); err != nil {
		return nil // the last detach removed the state
	}
	if err := errors.Join(s.ensureSummary(), s.ensureSynSlots()); err != nil {
		return &FollowUpError{Done: "detached from", Iface: name, Err: err}
	}
	return nil
}

func (s *Shield) detach(name string) error {
	dir := s.ifaceDir(name)
	if _, err := os.Stat(dir); err != nil {
		return userErrorf("moat is not attached to %s", name)
	}
	// Removing the pins drops the last references to the links, which
	// detaches the programs; but the kernel frees a link whose last
	// reference was its pin later, from a work queue, and on a busy host
	// the programs stayed on the interface a while after detach returned.
	// Held across the removal, each link is freed when it is closed here.
	var held []link.Link
	for _, pin := range []string{"link", "tc-link"} {
		if l, err := link.LoadPinnedLink(filepath.Join(dir, pin), nil); err == nil {
			held = append(held, l)
		}
	}
	err := os.RemoveAll(dir)
	for _, l := range held {
		l.Close()
	}
	return err
}

// IsPinned tells whether moat has pins for the interface name.
func (s *Shield) IsPinned(name string) bool {
	_, err := os.Stat(s.ifaceDir(name))
	return err == nil
}

// attachedNames lists the interfaces moat has pins for.
func (s *Shield) attachedNames() ([]string, error) {
	pins, err := PinnedInterfaces(s.root)
	var out []string
	for _, p := range pins {
		out = append(out, p.Name)
	}
	return out, err
}

// PinnedInterface is an interface with pins under a root, and the
// directory that holds them.
type PinnedInterface struct {
	Name, Dir string
}

// PinnedInterfaces lists, sorted by name, the interfaces that have pins
// under root, skipping directories still being filled. It only reads the
// directory, without the state's lock, for readers such as the metrics.
func PinnedInterfaces(root string) ([]PinnedInterface, error) {
	dir := filepath.Join(root, "ifaces")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []PinnedInterface
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), tmpPrefix) {
			out = append(out, PinnedInterface{Name: ifaceName(e.Name()), Dir: filepath.Join(dir, e.Name())})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Attachment describes moat on one interface.
type Attachment struct {
	Iface     string `json:"iface"`
	Ifindex   int    `json:"ifindex"`
	Mode      Mode   `json:"mode"`
	ProgramID uint32 `json:"program_id"`
	LinkID    uint32 `json:"link_id"`
	Present   bool   `json:"present"` // false when the interface has gone away
	// AcceptorIfindex is the interface at whose tcx ingress the SYN
	// acceptor runs (the interface, or its bridge), 0 when its link is
	// gone (the bridge was deleted) or cannot be read.
	AcceptorIfindex int `json:"acceptor_ifindex"`
	// AcceptorMisplaced: the acceptor is not where acceptorIfindex puts
	// it now (the interface joined, left or changed bridges, or the
	// bridge was made anew): cookie handshakes fail until `moat attach`.
	AcceptorMisplaced bool `json:"acceptor_misplaced"`
}

// acceptorPlacement reads where the SYN acceptor pinned in dir runs (0 if
// its link is gone, with the bridge it was on) and whether that is
// elsewhere than acceptorIfindex puts it for a filter (program prog) on
// ifindex, which is present. An index names an interface of this network
// namespace only: where the interface at ifindex does not run prog, the
// pins are another namespace's (attached from within it, as
// followRenames knows), whose bridges this one cannot see, and nothing
// is said to be misplaced.
func acceptorPlacement(dir string, ifindex int, prog ebpf.ProgramID, present bool) (at int, misplaced bool) {
	if l, err := link.LoadPinnedLink(filepath.Join(dir, "tc-link"), nil); err == nil {
		if info, err := l.Info(); err == nil && info.TCX() != nil {
			at = int(info.TCX().Ifindex)
		}
		l.Close()
	}
	if !present {
		return at, false
	}
	if nl, err := netlink.LinkByIndex(ifindex); err != nil || nl.Attrs().Xdp == nil || nl.Attrs().Xdp.ProgId != uint32(prog) {
		return at, false
	}
	want, _ := acceptorIfindex(ifindex)
	return at, at != want
}

// MisplacedAcceptors names the interfaces under root whose SYN acceptor is
// not where their filter needs it any more (the bridge it ran on was
// deleted, or the interface joined, left or changed bridges), so that
// moat's cookie handshakes there fail until it is attached again. It reads
// the pins without the state's lock, for the daemon's periodic check.
func MisplacedAcceptors(root string) ([]string, error) {
	pins, err := PinnedInterfaces(root)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pins {
		l, err := link.LoadPinnedLink(filepath.Join(p.Dir, "link"), nil)
		if err != nil {
			continue
		}
		info, err := l.Info()
		l.Close()
		if err != nil || info.XDP() == nil || info.XDP().Ifindex == 0 {
			continue // the interface is gone: nothing to put back
		}
		if _, misplaced := acceptorPlacement(p.Dir, int(info.XDP().Ifindex), info.Program, true); misplaced {
			out = append(out, p.Name)
		}
	}
	return out, nil
}

// AcceptorsBehind says, for each interface moat is attached to whose
// tcx ingress chain runs other programs before moat's SYN acceptor, how
// many. A program there that ends the chain (TCX_PASS, as Cilium's do)
// keeps the third ACKs of moat's cookies from the acceptor, and the
// kernel resets those handshakes; `moat attach` moves the acceptor first.
func (s *Shield) AcceptorsBehind() (map[string]int, error) {
	names, err := s.attachedNames()
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, name := range names {
		l, err := link.LoadPinnedLink(filepath.Join(s.ifaceDir(name), "tc-link"), nil)
		if err != nil {
			continue
		}
		info, err := l.Info()
		l.Close()
		// Ifindex 0: the link is defunct (its bridge was deleted), no
		// chain to ask about; Attachments calls it misplaced.
		if err != nil || info.TCX() == nil || info.TCX().Ifindex == 0 {
			continue
		}
		n, ok, err := syncookie.TCXAhead(int(info.TCX().Ifindex), info.Program)
		if err != nil {
			return nil, err
		}
		if ok && n > 0 {
			out[name] = n
		}
	}
	return out, nil
}

// Attachments lists the interfaces moat is attached to.
func (s *Shield) Attachments() ([]Attachment, error) {
	names, err := s.attachedNames()
	if err != nil {
		return nil, err
	}
	var out []Attachment
	for _, name := range names {
		a := Attachment{Iface: name}
		if l, err := link.LoadPinnedLink(filepath.Join(s.ifaceDir(name), "link"), nil); err == nil {
			if info, err := l.Info(); err == nil {
				a.ProgramID = uint32(info.Program)
				a.LinkID = uint32(info.ID)
				if x := info.XDP(); x != nil {
					a.Ifindex = int(x.Ifindex)
				}
			}
			l.Close()
		}
		if a.Ifindex != 0 {
			if m, err := currentMode(a.Ifindex); err == nil && m != "" {
				a.Mode, a.Present = m, true
			}
		}
		a.AcceptorIfindex, a.AcceptorMisplaced = acceptorPlacement(s.ifaceDir(name), a.Ifindex, ebpf.ProgramID(a.ProgramID), a.Present)
		out = append(out, a)
	}
	return out, nil
}
