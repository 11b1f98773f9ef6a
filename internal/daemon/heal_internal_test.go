package daemon

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/config"
	"github.com/moat-shield/moat/internal/shield"
)

// misplacedAcceptor attaches moat to a veth that is a port of a bridge,
// then deletes the bridge: the acceptor is no longer where the filter
// needs it. It returns the root and the interface.
func misplacedAcceptor(t *testing.T) (root, port string) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Skip("no bpffs at /sys/fs/bpf")
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	port = "mh" + hex.EncodeToString(rnd[:])
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port}, PeerName: port + "p"}); err != nil {
		t.Skipf("no veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(port); err == nil {
			netlink.LinkDel(l)
		}
	})
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: port + "b"}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(port)
	if err == nil {
		err = netlink.LinkSetMaster(l, br)
	}
	if err != nil {
		netlink.LinkDel(br)
		t.Fatal(err)
	}
	netlink.LinkSetUp(l)
	root = filepath.Join("/sys/fs/bpf", "moat-test-"+hex.EncodeToString(rnd[:]))
	s, err := shield.Open(root)
	if err != nil {
		netlink.LinkDel(br)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(root)
		locks, _ := filepath.Glob("/run/moat-*" + filepath.Base(root) + "*.lock")
		for _, l := range locks {
			os.Remove(l)
		}
	})
	_, err = s.Attach(port, shield.ModeNative)
	s.Close()
	netlink.LinkDel(br)
	if err != nil {
		t.Fatal(err)
	}
	names, err := shield.MisplacedAcceptors(root)
	if err != nil || len(names) != 1 || names[0] != port {
		t.Fatalf("MisplacedAcceptors %v, %v; want %s", names, err, port)
	}
	return root, port
}

// TestHealLeavesHandAttachedAlone: an interface attached by hand (not in
// the config) whose acceptor is misplaced is not the daemon's to mend,
// and the daemon must not open (lock) the state every sample tick for
// it: here a command holds the state's lock, and the tick must not wait
// for it.
func TestHealLeavesHandAttachedAlone(t *testing.T) {
	root, _ := misplacedAcceptor(t)
	var logs bytes.Buffer
	d := &Daemon{root: root, cfg: &config.Config{}, log: slog.New(slog.NewTextHandler(&logs, nil))}
	lock, err := os.OpenFile("/run/moat-"+shield.RootLockID(root)+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		d.healAcceptors()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Errorf("the sample tick waited for the state's lock over an interface not in the config")
		unix.Flock(int(lock.Fd()), unix.LOCK_UN)
		<-done
	}
}

// TestHealFailureLoggedOnce: an interface of the config that cannot be
// mended (here it is attached in native mode and the config asks for
// generic, which only a detach can change) is tried again later, not
// every tick, and its error is logged once, not every second.
func TestHealFailureLoggedOnce(t *testing.T) {
	root, port := misplacedAcceptor(t)
	var logs bytes.Buffer
	d := &Daemon{root: root, cfg: &config.Config{Interfaces: []config.Interface{{Name: port, Mode: "generic"}}},
		log: slog.New(slog.NewTextHandler(&logs, nil))}
	for range 3 {
		d.healAcceptors()
	}
	if n := strings.Count(logs.String(), "put moat's SYN acceptor back"); n != 1 {
		t.Errorf("%d error lines for one failure, want 1:\n%s", n, logs.String())
	}
}
