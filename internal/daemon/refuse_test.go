package daemon_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/shield"
)

// attached lists the interfaces moat is attached to under the env's root.
func (e *env) attached() []string {
	e.t.Helper()
	var out []string
	for _, a := range e.attachments() {
		out = append(out, a.Iface)
	}
	sort.Strings(out)
	return out
}

// refusedReload reloads and wants the reload refused: exit 2, one line on
// stderr that says so and contains want, and no change to the rules, the
// limits or the attachments.
func (e *env) refusedReload(want string) {
	e.t.Helper()
	rules, limits, atts := e.rulesNow(), fmt.Sprint(e.limits()), e.attached()
	r := e.moat("reload")
	stderr := strings.TrimSpace(r.stderr)
	if r.code != 2 || strings.Contains(stderr, "\n") || !strings.HasPrefix(stderr, "moat: reload refused") || !strings.Contains(stderr, want) {
		e.t.Fatalf("reload: exit %d, stderr %q; want exit 2 and one line saying it was refused and %q\ndaemon log:\n%s", r.code, r.stderr, want, e.log)
	}
	if now := e.rulesNow(); strings.Join(now, "\n") != strings.Join(rules, "\n") {
		e.t.Errorf("the refused reload changed the rules:\n%s\nto\n%s", strings.Join(rules, "\n"), strings.Join(now, "\n"))
	}
	if now := fmt.Sprint(e.limits()); now != limits {
		e.t.Errorf("the refused reload changed the limits: %s to %s", limits, now)
	}
	if now := e.attached(); strings.Join(now, ",") != strings.Join(atts, ",") {
		e.t.Errorf("the refused reload changed the attachments: %v to %v", atts, now)
	}
}

// A reload whose new interface cannot be attached (lo in native mode) is
// refused and changes nothing: not the deny entry, port rule and limit it
// also changes, and not the other new interface, attached on the way and
// detached again. Without the bad interface, the same config applies.
func TestReloadThatCannotAttachChangesNothing(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf(`interfaces:
  - name: %s
deny:
  - 203.0.113.0/24
ports:
  - rule: udp/19
    action: drop
limits:
  - kind: source
    scope: udp/53
    pps: 100
`, e.attackerIf()))
	e.start()
	next := fmt.Sprintf(`interfaces:
  - name: %s
  - name: %s
    mode: generic
%%s
deny:
  - 203.0.113.0/25
ports:
  - rule: udp/19
    action: drop
  - rule: tcp/7
    action: drop
limits:
  - kind: source
    scope: udp/53
    pps: 200
`, e.attackerIf(), e.clientIf())
	e.writeConfig(fmt.Sprintf(next, "  - name: lo\n    mode: native"))
	e.refusedReload("attach to lo")
	if !strings.Contains(e.log.String(), "reload refused") {
		t.Errorf("the daemon's log does not say the reload was refused:\n%s", e.log)
	}

	e.writeConfig(fmt.Sprintf(next, ""))
	e.mustMoat("reload")
	want := []string{e.attackerIf(), e.clientIf()}
	sort.Strings(want)
	if got := e.attached(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("attached to %v after the good reload, want %v", got, want)
	}
	now := e.rulesNow()
	for _, want := range []string{"deny 203.0.113.0/25", "port tcp/7 drop"} {
		if !contains(now, want) {
			t.Errorf("after the good reload %q is missing: %v", want, now)
		}
	}
	if l := e.limits(); len(l) != 1 || l[0].PPS != 200 {
		t.Errorf("limits after the good reload: %+v", l)
	}
}

// Reloads refused before anything is written are reported as refusals
// (exit 2, the error on one line), not as failures part way.
func TestReloadRefusalsAreRefusals(t *testing.T) {
	e := newEnv(t)
	base := fmt.Sprintf("interfaces:\n  - name: %s\n    mode: generic\ndeny:\n  - 203.0.113.0/24\n", e.attackerIf())
	e.writeConfig(base)
	e.start()

	e.writeConfig(strings.Replace(base, "deny:", "  - name: fxd-nosuch0\ndeny:", 1))
	e.refusedReload(`interfaces: no interface "fxd-nosuch0"`)

	e.writeConfig(strings.Replace(base, "mode: generic", "mode: native", 1))
	e.refusedReload("the mode changes from generic to native; that needs a restart")

	if err := e.lab.Server.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_syncookies", []byte("0"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	e.writeConfig(base + "syn:\n  ports:\n    - port: 443\n")
	e.refusedReload("net.ipv4.tcp_syncookies is 0")
}

// TestReloadRefusalNamesTheKeysThatChanged: a reload that changes what
// only a restart can change is refused naming the keys that changed, and
// no other: the operator must know which edit to take back.
func TestReloadRefusalNamesTheKeysThatChanged(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf()))
	e.start()
	good, err := os.ReadFile(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	logFormat := strings.NewReplacer("  log_level: debug\n", "  log_level: debug\n  log_format: json\n")
	topEntries := strings.NewReplacer("metrics:\n  enabled: false\n", "metrics:\n  enabled: false\n  top_entries: 5\n")
	for _, tc := range []struct {
		edits []*strings.Replacer
		want  string
	}{
		{[]*strings.Replacer{logFormat}, "daemon.log_format changes only with a restart"},
		{[]*strings.Replacer{topEntries}, "metrics changes only with a restart"},
		{[]*strings.Replacer{logFormat, topEntries}, "daemon.log_format and metrics change only with a restart"},
	} {
		text := string(good)
		for _, r := range tc.edits {
			text = r.Replace(text)
		}
		if err := os.WriteFile(e.cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		r := e.moat("reload")
		if stderr := strings.TrimSpace(r.stderr); r.code != 2 || !strings.HasSuffix(stderr, "unchanged: "+tc.want) {
			t.Errorf("reload: exit %d, stderr %q; want exit 2 and a refusal that ends %q", r.code, stderr, tc.want)
		}
	}
}

// A change whose old and new entries do not fit in a map together (new
// ones are written before stale ones go) is refused before the first
// write, naming the map and the numbers; so is one with too many port
// rules at once.
func TestReloadRefusedWhenOldAndNewDoNotFit(t *testing.T) {
	e := newEnv(t)
	const hosts = 40_000 // twice as many do not fit in the allowlist's 65,536
	writeHosts(t, filepath.Join(e.dir, "a.list"), netip.MustParseAddr("10.1.0.0"), hosts)
	writeHosts(t, filepath.Join(e.dir, "b.list"), netip.MustParseAddr("10.2.0.0"), hosts)
	ports := func(from int) string {
		var b strings.Builder
		b.WriteString("ports:\n")
		for p := from; p < from+600; p++ { // 1,023 port rules fit
			fmt.Fprintf(&b, "  - rule: udp/%d\n    action: drop\n", p)
		}
		return b.String()
	}
	ifaces := fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf())
	e.writeConfig(ifaces + "lists:\n  - file: a.list\n    list: allow\n" + ports(1000))
	e.start()

	e.writeConfig(ifaces + "lists:\n  - file: b.list\n    list: allow\n" + ports(1000))
	e.refusedReload("allowlist: IPv4 hosts: the change needs room for 80000 entries at once (40000 wanted, 40000 stale")

	e.writeConfig(ifaces + "lists:\n  - file: a.list\n    list: allow\n" + ports(2000))
	e.refusedReload("ports: no room for 600 more port rules: 1023 rules is the limit and 600 are held")

	// Within the limits, the same kind of change applies.
	e.writeConfig(ifaces + "lists:\n  - file: a.list\n    list: allow\n" + ports(1300))
	e.mustMoat("reload")
	if now := e.rulesNow(); !contains(now, "port udp/1899 drop") || contains(now, "port udp/1000 drop") {
		t.Errorf("the port rules did not move to udp/1300-1899")
	}
}

// A second daemon on the same root, with its own socket and state file,
// is refused at start with one line naming the root and the daemon that
// holds it; the first daemon's runtime rules stay.
func TestSecondDaemonOnTheRootRefused(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf()))
	e.start()
	e.mustMoat("block", "192.0.2.77")

	cfg2 := filepath.Join(e.dir, "second.yaml")
	text := fmt.Sprintf("interfaces:\n  - name: %s\nmetrics:\n  enabled: false\ndaemon:\n  bpffs_root: %s\n  state_file: %s\n  socket: %s\n",
		e.attackerIf(), e.root, filepath.Join(e.dir, "second.json"), filepath.Join(e.dir, "second.sock"))
	if err := os.WriteFile(cfg2, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := e.runToExit(cfg2)
	line := strings.TrimSpace(out)
	want := fmt.Sprintf("moat: another moat daemon manages %s (pid %d, socket %s)", e.root, e.daemon.Process.Pid, e.sock)
	if code == 0 || !strings.HasPrefix(line, want) || strings.Contains(line, "\n") {
		t.Errorf("second daemon: exit %d, output %q; want one line starting %q", code, out, want)
	}
	if !contains(e.rulesNow(), "deny 192.0.2.77/32") {
		t.Errorf("the first daemon's runtime rule is gone")
	}
	if _, err := os.Stat(filepath.Join(e.dir, "second.sock")); err == nil {
		t.Errorf("the refused daemon left its socket")
	}
}

// runToExit runs a daemon with cfg in the server's namespace, which must
// exit by itself, and returns its output and exit status.
func (e *env) runToExit(cfg string) (string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.lab.Server.Command(ctx, moatBin, "run", "--config", cfg).CombinedOutput()
	if ctx.Err() != nil {
		e.t.Fatalf("the daemon did not exit:\n%s", out)
	}
	code := 0
	if err != nil {
		code = 1
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			code = ee.ExitCode()
		}
	}
	return string(out), code
}

// A start whose metrics address is taken fails before it applies
// anything: a fresh root is not even made.
func TestMetricsAddressTakenRefusesStart(t *testing.T) {
	e := newEnv(t)
	ln := e.listenLoopback()
	defer ln.Close()
	text := fmt.Sprintf("interfaces:\n  - name: %s\ndeny:\n  - 203.0.113.0/24\nmetrics:\n  address: %s\ndaemon:\n  bpffs_root: %s\n  state_file: %s\n  socket: %s\n",
		e.attackerIf(), ln.Addr(), e.root, e.stateFile, e.sock)
	if err := os.WriteFile(e.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := e.runToExit(e.cfg)
	if code != 1 || !strings.Contains(out, "moat: metrics: listen tcp "+ln.Addr().String()) {
		t.Errorf("start with a taken metrics address: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(e.root); err == nil {
		t.Errorf("the refused start left %s behind", e.root)
	}
}

// `moat --root R reload` reloads only a daemon that manages R.
func TestReloadChecksTheRoot(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf()))
	e.start()
	other := e.root + "-fxd-other"
	r := e.moat("--root", other, "reload")
	if r.code != 2 || !strings.Contains(r.stderr, "manages "+e.root+", not "+other) {
		t.Errorf("reload with another root: exit %d, stderr %q", r.code, r.stderr)
	}
	if strings.Contains(e.log.String(), "msg=reloaded") {
		t.Errorf("the daemon reloaded for another root")
	}
	e.mustMoat("--root", e.root, "reload")

	// With MOAT_SOCKET elsewhere, the root's daemon is found by the lock
	// it holds, as every other command finds it.
	elsewhere := filepath.Join(t.TempDir(), "none.sock")
	if r := e.moatOn(elsewhere, "reload"); r.code != 0 || !strings.Contains(r.stdout, "reloaded") {
		t.Errorf("reload with MOAT_SOCKET at %s: exit %d, stdout %q, stderr %q", elsewhere, r.code, r.stdout, r.stderr)
	}
	// And a root no daemon manages, with no socket there either.
	if r := e.moatOn(elsewhere, "--root", other, "reload"); r.code == 0 || !strings.Contains(r.stderr, "no moat daemon manages "+other) {
		t.Errorf("reload of a root no daemon manages: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestPortRulesThatDoNotFitChangeNothing: port rules added through the
// daemon that the port maps cannot all hold are refused, none is added
// and the state file does not name them, so later changes, reloads and
// restarts keep working.
func TestPortRulesThatDoNotFitChangeNothing(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\nports:\n  - rule: tcp/22\n    action: allow\n", e.attackerIf()))
	e.start()
	e.mustMoat("port", "drop", "udp/999")
	before := e.rulesNow()
	args := []string{"port", "drop"}
	for p := 1000; p < 2022; p++ { // 1,022 more where 1,021 fit
		args = append(args, fmt.Sprintf("udp/%d", p))
	}
	r := e.moat(args...)
	if r.code != 2 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "1023 rules is the limit") {
		t.Fatalf("1,022 port rules where 1,021 fit: exit %d, stderr %q; want 2 and one line naming the limit", r.code, r.stderr)
	}
	if after := e.rulesNow(); !slices.Equal(after, before) {
		t.Fatalf("a refused port change changed the rules: %d rules, were %d", len(after), len(before))
	}
	b, err := os.ReadFile(e.stateFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "udp/2021") || strings.Contains(string(b), "udp/1000") {
		t.Fatal("the state file names port rules that were refused")
	}
	e.mustMoat("port", "remove", "udp/999")
	e.mustMoat("reload")
}

// TestReloadAttachesAnInterfaceThatLostItsFilter: an interface the config
// names whose filter went away behind the daemon's back (detached by
// another moat, or deleted and made again) is attached again at the next
// reload, not left unprotected until a restart.
func TestReloadAttachesAnInterfaceThatLostItsFilter(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf()))
	e.start()
	xdpOn := func() bool {
		on := false
		if err := e.lab.Server.Do(func() error {
			l, err := netlink.LinkByName(e.attackerIf())
			if err != nil {
				return err
			}
			on = l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return on
	}
	if !xdpOn() {
		t.Fatal("no XDP program on the interface after start")
	}
	if err := e.lab.Server.Do(func() error {
		s, err := shield.Open(e.root)
		if err != nil {
			return err
		}
		defer s.Close()
		return s.Detach(e.attackerIf())
	}); err != nil {
		t.Fatal(err)
	}
	// The link goes when its last reference does: the daemon's sampling
	// may hold one for a moment.
	for deadline := time.Now().Add(2 * time.Second); xdpOn() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if xdpOn() {
		t.Fatal("the interface kept its XDP program after the detach")
	}
	r := e.mustMoat("reload")
	if !xdpOn() {
		t.Fatalf("after the reload the interface has no XDP program; reload said:\n%s%s\nlog:\n%s", r.stdout, r.stderr, e.log)
	}
	if !strings.Contains(e.log.String(), "had lost moat's filter") {
		t.Errorf("the daemon did not say it attached the interface again:\n%s", e.log)
	}
}

// A daemon whose socket path holds a file that is not a socket refuses to
// start and leaves the file alone; the config refuses a socket that is
// also the state file.
func TestSocketPathThatIsNotASocket(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf()))
	if err := os.WriteFile(e.sock, []byte("someone's file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := e.runToExit(e.cfg)
	if code == 0 || !strings.Contains(out, "exists and is not a socket") {
		t.Errorf("start with a file at the socket path: exit %d\n%s", code, out)
	}
	if b, err := os.ReadFile(e.sock); err != nil || string(b) != "someone's file\n" {
		t.Errorf("the file at the socket path: %q, %v", b, err)
	}
	text := fmt.Sprintf("interfaces:\n  - name: %s\ndaemon:\n  bpffs_root: %s\n  state_file: %s\n  socket: %s\n",
		e.attackerIf(), e.root, e.stateFile, e.stateFile)
	if err := os.WriteFile(e.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := e.runToExit(e.cfg); code != 2 || !strings.Contains(out, "is also daemon.state_file") {
		t.Errorf("socket equal to the state file: exit %d\n%s", code, out)
	}
}

// TestChangesThatCannotBeSavedAreTakenBack: a change through the daemon
// that cannot be written to the state file (here a directory stands where
// the file goes) fails, and the filter does not keep it: a restart would
// lose it.
func TestChangesThatCannotBeSavedAreTakenBack(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf()))
	e.start()
	e.mustMoat("block", "198.51.100.1")
	e.mustMoat("port", "drop", "udp/19")
	before := e.rulesNow()
	if err := os.Remove(e.stateFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(e.stateFile, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"port", "drop", "udp/7000", "udp/7001"},
		{"port", "remove", "udp/19"},
		{"block", "198.51.100.2", "198.51.100.3"},
		{"unblock", "198.51.100.1"},
	} {
		if r := e.moat(args...); r.code == 0 {
			t.Errorf("moat %s with an unwritable state file: exit 0", strings.Join(args, " "))
		}
		if after := e.rulesNow(); !slices.Equal(after, before) {
			t.Fatalf("moat %s left the rules changed:\n%v\nwere\n%v", strings.Join(args, " "), after, before)
		}
	}
}

// A reload after the operator renamed an interface and changed the config
// to match: the pins follow the rename, the filter on the interface is
// taken over in place, and the old name, now without pins, is not
// detached. Before, the reload failed part way on detaching the old name,
// and so did every reload after it.
func TestReloadAfterRename(t *testing.T) {
	e := newEnv(t)
	old := e.attackerIf()
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", old))
	e.start()
	const renamed = "mtrenamed0"
	if err := e.lab.Server.Do(func() error {
		l, err := netlink.LinkByName(old)
		if err == nil {
			err = netlink.LinkSetDown(l)
		}
		if err == nil {
			err = netlink.LinkSetName(l, renamed)
		}
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", renamed))
	for i := 0; i < 2; i++ {
		if r := e.moat("reload"); r.code != 0 {
			t.Fatalf("reload %d after the rename: exit %d, stderr %q\ndaemon log:\n%s", i+1, r.code, r.stderr, e.log)
		}
	}
	var attached bool
	if err := e.lab.Server.Do(func() error {
		l, err := netlink.LinkByName(renamed)
		if err == nil {
			attached = l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !attached {
		t.Errorf("%s has no XDP program after the reloads", renamed)
	}
	if !strings.Contains(e.log.String(), old+" was renamed "+renamed) {
		t.Errorf("the daemon's log does not say that %s was renamed %s:\n%s", old, renamed, e.log)
	}
}
