package daemon_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/daemon"
	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/state"
	"github.com/moat-shield/moat/internal/syncookie"
)

// moatBin is the moat binary, built once: the daemon runs as a real
// process so that it can be killed.
var moatBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "moat-daemon-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		moatBin = filepath.Join(dir, "moat")
		out, err := exec.Command("go", "build", "-o", moatBin, "github.com/moat-shield/moat/cmd/moat").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build moat: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}())
}

// env is one daemon's world: a lab, its own pins, config, state file and
// socket.
type env struct {
	t                    *testing.T
	lab                  *lab.Lab
	dir, root, cfg, sock string
	stateFile            string
	daemon               *exec.Cmd
	log                  *syncBuffer
	exited               chan struct{}
	startWait            time.Duration // how long start waits for the API (default 20s)
	notifySocket         string        // $NOTIFY_SOCKET for the daemon, if set
	expireEvery          string        // daemon.expire_every (default 1s)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvIn(t, nil)
}

// newEnvIn is newEnv in lab l (nil: a lab of its own): two daemons in one
// lab are two hosts of a fleet, each with its pins, config and socket.
func newEnvIn(t *testing.T, l *lab.Lab) *env {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
			t.Skipf("no bpffs: %v", err)
		}
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	base := "moat-dtest-" + hex.EncodeToString(rnd[:])
	if l == nil {
		l = lab.NewT(t)
	}
	e := &env{t: t, lab: l, dir: t.TempDir(), root: filepath.Join("/sys/fs/bpf", base)}
	e.cfg = filepath.Join(e.dir, "moat.yaml")
	e.sock = filepath.Join(e.dir, "moat.sock")
	e.stateFile = filepath.Join(e.dir, "state.json")
	t.Cleanup(func() {
		e.stop(syscall.SIGTERM)
		os.RemoveAll(e.root)
		locks, _ := filepath.Glob("/run/moat-*" + base + "*.lock")
		for _, l := range locks {
			os.Remove(l)
		}
	})
	return e
}

// writeConfig writes the config with the daemon section of this env
// appended.
func (e *env) writeConfig(body string) {
	e.t.Helper()
	every := e.expireEvery
	if every == "" {
		every = "1s"
	}
	text := body + fmt.Sprintf("metrics:\n  enabled: false\ndaemon:\n  bpffs_root: %s\n  state_file: %s\n  feed_dir: %s\n  socket: %s\n  expire_every: %s\n  log_level: debug\n",
		e.root, e.stateFile, filepath.Join(e.dir, "feeds"), e.sock, every)
	if err := os.WriteFile(e.cfg, []byte(text), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// start runs the daemon in the server's network namespace and waits
// until its API answers.
func (e *env) start() {
	e.t.Helper()
	e.log = &syncBuffer{}
	e.daemon = e.lab.Server.Command(context.Background(), moatBin, "run", "--config", e.cfg)
	if e.notifySocket != "" {
		e.daemon.Env = append(os.Environ(), "NOTIFY_SOCKET="+e.notifySocket)
	}
	e.daemon.Stdout, e.daemon.Stderr = e.log, e.log
	if err := e.daemon.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(e.daemon, e.exited)
	wait := e.startWait
	if wait == 0 {
		wait = 20 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		if e.ready() {
			return
		}
		select {
		case <-e.exited:
			e.t.Fatalf("daemon exited at start:\n%s", e.log)
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("daemon not ready after %s:\n%s", wait, e.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) ready() bool {
	c, err := net.Dial("unix", e.sock)
	if err != nil {
		return false
	}
	c.Close()
	return strings.Contains(e.log.String(), "msg=ready")
}

// stop sends sig to the daemon and waits for it to exit.
func (e *env) stop(sig syscall.Signal) {
	if e.daemon == nil || e.daemon.Process == nil {
		return
	}
	select {
	case <-e.exited:
		return
	default:
	}
	e.daemon.Process.Signal(sig)
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		e.daemon.Process.Kill()
		<-e.exited
	}
}

type result struct {
	code           int
	stdout, stderr string
}

// moat runs the CLI on the host, pointed at this env's pins and socket.
func (e *env) moat(args ...string) result {
	e.t.Helper()
	return e.moatOn(e.sock, args...)
}

// moatOn is moat with MOAT_SOCKET at socket, which may be another than
// the daemon's.
func (e *env) moatOn(socket string, args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, moatBin, args...)
	cmd.Env = append(os.Environ(), "MOAT_SOCKET="+socket, "MOAT_ROOT="+e.root)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("moat %v: %v", args, err)
	}
	return result{code, out.String(), errb.String()}
}

func (e *env) mustMoat(args ...string) result {
	e.t.Helper()
	r := e.moat(args...)
	if r.code != 0 {
		e.t.Fatalf("moat %s: exit %d\n%s%s\ndaemon log:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr, e.log)
	}
	return r
}

// rulesNow lists the rules in the maps, without hits, as sorted lines.
func (e *env) rulesNow() []string {
	e.t.Helper()
	var rs rules.Ruleset
	r := e.mustMoat("list", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &rs); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, x := range rs.Allow {
		out = append(out, "allow "+x.Prefix.String()+" "+x.Comment)
	}
	for _, x := range rs.Deny {
		out = append(out, "deny "+x.Prefix.String()+" "+x.Comment)
	}
	for _, p := range rs.Ports {
		out = append(out, "port "+p.Spec.String()+" "+p.Action.String())
	}
	sort.Strings(out)
	return out
}

func contains(lines []string, want string) bool {
	for _, l := range lines {
		if strings.TrimSpace(l) == want {
			return true
		}
	}
	return false
}

// counters reads the server's attacker-facing interface counters.
func (e *env) counters() shield.Counters {
	e.t.Helper()
	s, err := shield.Open(e.root)
	if err != nil {
		e.t.Fatal(err)
	}
	defer s.Close()
	c, err := s.Counters(e.attackerIf())
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// limits reads the stored rate limits.
// withLimitMaps runs f on the rate-limit maps of the env's root.
func (e *env) withLimitMaps(f func(ratelimit.Maps) error) {
	e.t.Helper()
	s, err := shield.Open(e.root)
	if err != nil {
		e.t.Fatal(err)
	}
	defer s.Close()
	m, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := f(m); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) limits() []ratelimit.Status {
	e.t.Helper()
	var l []ratelimit.Status
	e.withLimitMaps(func(m ratelimit.Maps) (err error) { l, err = m.Limits(); return err })
	return l
}

// attachments lists moat's attachments under the env's root.
func (e *env) attachments() []shield.Attachment {
	e.t.Helper()
	s, err := shield.Open(e.root)
	if err != nil {
		e.t.Fatal(err)
	}
	defer s.Close()
	atts, err := s.Attachments()
	if err != nil {
		e.t.Fatal(err)
	}
	return atts
}

func (e *env) attachment() shield.Attachment {
	e.t.Helper()
	atts := e.attachments()
	for _, a := range atts {
		if a.Iface == e.attackerIf() {
			return a
		}
	}
	e.t.Fatalf("moat is not attached to %s: %+v", e.attackerIf(), atts)
	return shield.Attachment{}
}

// listenLoopback listens on a free TCP port of loopback in the lab's
// server namespace, where the daemon runs.
func (e *env) listenLoopback() net.Listener {
	e.t.Helper()
	var ln net.Listener
	if err := e.lab.Server.Do(func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return ln
}

func (e *env) attackerIf() string { return e.lab.Server.Ifaces[1].Name }
func (e *env) clientIf() string   { return e.lab.Server.Ifaces[0].Name }

// floodRun is a spoofed UDP flood from the attacker, capped in rate, that
// runs until stopped.
type floodRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	res    flood.Result
	err    error
}

func (e *env) startFlood(rate uint64, port uint16) *floodRun {
	e.t.Helper()
	ifc := e.lab.Attacker.Ifaces[0]
	ctx, cancel := context.WithCancel(context.Background())
	f := &floodRun{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.err = e.lab.Attacker.Do(func() error {
			var err error
			f.res, err = flood.Run(ctx, flood.Config{
				Kind: flood.KindUDP, IfIndex: ifc.Index, DstMAC: ifc.PeerMAC,
				Sources: e.lab.SpoofV4, Dst: ifc.PeerIPv4, DstPort: port, Rate: rate,
			})
			return err
		})
	}()
	e.t.Cleanup(f.stop)
	return f
}

func (f *floodRun) stop() {
	f.cancel()
	<-f.done
}

// udpSink counts datagrams received by a server socket.
type udpSink struct {
	port uint16
	mu   sync.Mutex
	n    int
	got  map[string]bool
}

func (e *env) listenUDP() *udpSink {
	e.t.Helper()
	s := &udpSink{got: map[string]bool{}}
	err := e.lab.Server.Do(func() error {
		pc, err := net.ListenPacket("udp4", "0.0.0.0:0")
		if err != nil {
			return err
		}
		e.t.Cleanup(func() { pc.Close() })
		s.port = uint16(pc.LocalAddr().(*net.UDPAddr).Port)
		go func() {
			buf := make([]byte, 2048)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				s.mu.Lock()
				s.n++
				s.got[string(buf[:n])] = true
				s.mu.Unlock()
			}
		}()
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (s *udpSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// sendFromClient sends one datagram from the client and tells whether it
// arrived within wait.
func (e *env) sendFromClient(s *udpSink, wait time.Duration) bool {
	e.t.Helper()
	var b [6]byte
	rand.Read(b[:])
	payload := "client-" + hex.EncodeToString(b[:])
	ifc := e.lab.Client.Ifaces[0]
	err := e.lab.Client.Do(func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ifc.PeerIPv4, s.port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		ok := s.got[payload]
		s.mu.Unlock()
		if ok {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// writeHosts writes n distinct /32s from base as a plain list.
func writeHosts(t *testing.T, path string, base netip.Addr, n int) {
	t.Helper()
	var b strings.Builder
	a := base
	for range n {
		b.WriteString(a.String())
		b.WriteByte('\n')
		a = a.Next()
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A reload under a flood: a bad config is refused and changes nothing; a
// good one that changes 100,000 entries, including the ones that drop the
// flood (one /16 replaced by two /17s), lets not one flood packet through.
func TestReloadUnderFlood(t *testing.T) {
	e := newEnv(t)
	sink := e.listenUDP()
	const hosts = 50_000
	writeHosts(t, filepath.Join(e.dir, "a.list"), netip.MustParseAddr("10.1.0.0"), hosts)
	writeHosts(t, filepath.Join(e.dir, "b.list"), netip.MustParseAddr("10.2.0.0"), hosts)
	client := e.lab.Client.Ifaces[0].IPv4.Addr()
	ifaces := fmt.Sprintf("interfaces:\n  - name: %s\n  - name: %s\n", e.attackerIf(), e.clientIf())
	good1 := ifaces + fmt.Sprintf(`deny:
  - %s
  - prefix: %s
    comment: client, until the reload
lists:
  - file: a.list
ports:
  - rule: udp/19
    action: drop
`, e.lab.SpoofV4, client)
	half := e.lab.SpoofV4.Bits() + 1
	lo := netip.PrefixFrom(e.lab.SpoofV4.Addr(), half)
	hiAddr := e.lab.SpoofV4.Addr().As4()
	bit := half - 1
	hiAddr[bit/8] |= 0x80 >> (bit % 8)
	hi := netip.PrefixFrom(netip.AddrFrom4(hiAddr), half)
	good2 := ifaces + fmt.Sprintf(`deny:
  - %s
  - %s
lists:
  - file: b.list
ports:
  - rule: udp/19
    action: drop
  - rule: tcp/7
    action: drop
limits:
  - kind: source
    scope: udp/53
    pps: 100
`, lo, hi)
	bad := strings.Replace(good2, "limits:", "  - rule: udp/70000\n    action: drop\nlimitz: 3\nlimits:", 1)

	e.writeConfig(good1)
	e.start()
	if e.sendFromClient(sink, 300*time.Millisecond) {
		t.Fatal("the client is denied by the first config, yet its datagram arrived")
	}
	before := e.rulesNow()
	if len(before) != hosts+3 {
		t.Fatalf("%d rules loaded, want %d", len(before), hosts+3)
	}
	c0 := e.counters()

	f := e.startFlood(100_000, sink.port)
	time.Sleep(300 * time.Millisecond)

	// A bad config: refused with every error and its line; nothing changes.
	e.writeConfig(bad)
	r := e.moat("reload")
	if r.code != 2 {
		t.Fatalf("reload of a bad config: exit %d, want 2\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"moat.yaml:14: ports[3]: invalid port rule", `moat.yaml:16: unknown key "limitz"`, "unchanged"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("reload errors do not say %q:\n%s", want, r.stderr)
		}
	}
	if after := e.rulesNow(); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("a refused reload changed the rules")
	}

	// A good config, applied while the flood runs.
	e.writeConfig(good2)
	r = e.mustMoat("reload")
	t.Logf("%s", strings.TrimSpace(r.stdout))
	time.Sleep(300 * time.Millisecond)
	f.stop()
	if f.err != nil {
		t.Fatalf("flood: %v", f.err)
	}

	after := e.rulesNow()
	for _, want := range []string{"deny " + lo.String(), "deny " + hi.String(), "deny 10.2.0.0/32", "port tcp/7 drop", "port udp/19 drop"} {
		if !contains(after, want) {
			t.Errorf("after the reload, %q is missing", want)
		}
	}
	for _, gone := range []string{"deny " + e.lab.SpoofV4.String(), "deny 10.1.0.0/32", "deny " + client.String() + "/32 client, until the reload"} {
		if contains(after, gone) {
			t.Errorf("after the reload, %q is still there", gone)
		}
	}
	if l := e.limits(); len(l) != 1 || l[0].Scope.String() != "udp/53" || l[0].PPS != 100 {
		t.Errorf("rate limits after the reload: %+v, want a source limit of 100 pps on udp/53", l)
	}
	if len(after) != hosts+4 {
		t.Errorf("%d rules after the reload, want %d", len(after), hosts+4)
	}

	c1 := e.counters()
	passed := c1.Passed.Packets - c0.Passed.Packets
	dropped := c1.ByReason["denylist"].Dropped.Packets - c0.ByReason["denylist"].Dropped.Packets
	t.Logf("flood: %d frames sent at %.0f pps; at the server: %d dropped by the denylist, %d passed, %d received by the socket",
		f.res.Sent, f.res.PPS, dropped, passed, sink.count())
	if f.res.Sent < 20_000 {
		t.Fatalf("the flood sent only %d frames; the test saw no load", f.res.Sent)
	}
	if passed != 0 || sink.count() != 0 {
		t.Fatalf("%d flood packets passed the filter (%d reached the socket) during the reloads", passed, sink.count())
	}
	if dropped < f.res.Sent*95/100 {
		t.Fatalf("%d of %d flood frames dropped by the denylist: the flood did not reach the filter", dropped, f.res.Sent)
	}
	// The rule that denied the client is gone: its traffic passes now.
	if !e.sendFromClient(sink, 3*time.Second) {
		t.Fatal("the second config no longer denies the client, yet its datagram did not arrive")
	}
	if !strings.Contains(e.log.String(), "msg=\"reload refused") || !strings.Contains(e.log.String(), "msg=reloaded") {
		t.Errorf("the daemon's log lacks the refused and the good reload:\n%s", e.log)
	}
}

// SIGKILL of the daemon during a flood: the flood stays dropped, a new
// daemon adopts the pins without detaching (same link, counters kept), and
// the rules added through the API before the kill, concurrently, are all
// there. After a "reboot" (no pins), everything comes back from the config
// and the state file.
func TestKillAdoptRestore(t *testing.T) {
	e := newEnv(t)
	sink := e.listenUDP()
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\ndeny:\n  - %s\n", e.attackerIf(), e.lab.SpoofV4))
	// systemd's readiness protocol: a datagram on $NOTIFY_SOCKET.
	e.notifySocket = filepath.Join(e.dir, "notify.sock")
	notifyConn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: e.notifySocket, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notifyConn.Close()
	e.start()
	notifyConn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	if n, err := notifyConn.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "READY=1") {
		t.Errorf("no READY=1 on $NOTIFY_SOCKET: %q, %v", buf[:n], err)
	}
	// SIGHUP reloads, as systemctl reload does.
	e.daemon.Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(e.log.String(), "msg=reloaded"); {
		if time.Now().After(deadline) {
			t.Fatalf("no reload after SIGHUP:\n%s", e.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.notifySocket = ""

	// Concurrent changes through the API: none may be lost.
	const parallel = 16
	var wg sync.WaitGroup
	results := make([]result, parallel)
	for i := range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = e.moat("block", fmt.Sprintf("10.77.0.%d", i+1), "--comment", fmt.Sprintf("api %d", i+1))
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 || !strings.Contains(r.stderr, "via moat daemon") {
			t.Fatalf("block %d: exit %d, stderr %q (want it to go via the daemon)", i+1, r.code, r.stderr)
		}
	}
	e.mustMoat("port", "drop", "udp/7")
	e.mustMoat("block", "10.78.0.0/16", "--ttl", "1h")
	st, err := state.Load(e.stateFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Deny) != parallel+1 || len(st.Ports) != 1 {
		t.Fatalf("state file holds %d deny entries and %d port rules, want %d and 1", len(st.Deny), len(st.Ports), parallel+1)
	}
	// A timed rule, gone by the end of the test.
	e.mustMoat("block", "10.79.0.1", "--ttl", "2s")
	// A rule of the config cannot be removed through the API.
	if r := e.moat("unblock", e.lab.SpoofV4.String()); r.code != 2 || !strings.Contains(r.stderr, "comes from the config file") {
		t.Errorf("unblock of a config rule: exit %d, %q", r.code, r.stderr)
	}

	att0 := e.attachment()
	f := e.startFlood(100_000, sink.port)
	time.Sleep(300 * time.Millisecond)
	e.stop(syscall.SIGKILL)
	c0 := e.counters()
	time.Sleep(500 * time.Millisecond)
	c1 := e.counters()
	if c1.ByReason["denylist"].Dropped.Packets <= c0.ByReason["denylist"].Dropped.Packets {
		t.Fatalf("no drops while the daemon was dead: %d then %d", c0.ByReason["denylist"].Dropped.Packets, c1.ByReason["denylist"].Dropped.Packets)
	}
	// Without a daemon, the CLI uses the pins itself.
	if r := e.mustMoat("list"); strings.Contains(r.stderr, "via moat daemon") {
		t.Errorf("the daemon is dead, yet the CLI says it went through it")
	}

	e.start()
	att1 := e.attachment()
	c2 := e.counters()
	f.stop()
	if f.err != nil {
		t.Fatalf("flood: %v", f.err)
	}
	if att1.LinkID != att0.LinkID {
		t.Errorf("link %d replaced by link %d: the restart detached and attached again", att0.LinkID, att1.LinkID)
	}
	if c2.ByReason["denylist"].Dropped.Packets < c1.ByReason["denylist"].Dropped.Packets {
		t.Errorf("counters went back from %d to %d: the restart lost them", c1.ByReason["denylist"].Dropped.Packets, c2.ByReason["denylist"].Dropped.Packets)
	}
	cEnd := e.counters()
	t.Logf("flood: %d frames; link %d kept (program %d -> %d); %d dropped by the denylist, %d passed",
		f.res.Sent, att1.LinkID, att0.ProgramID, att1.ProgramID, cEnd.ByReason["denylist"].Dropped.Packets, cEnd.Passed.Packets)
	if cEnd.Passed.Packets != 0 || sink.count() != 0 {
		t.Fatalf("%d flood packets passed (%d reached the socket) across the kill and restart", cEnd.Passed.Packets, sink.count())
	}
	checkRules := func(when string) {
		t.Helper()
		now := e.rulesNow()
		for i := range parallel {
			if want := fmt.Sprintf("deny 10.77.0.%d/32 api %d", i+1, i+1); !contains(now, want) {
				t.Errorf("%s: %q is missing", when, want)
			}
		}
		for _, want := range []string{"deny " + e.lab.SpoofV4.String(), "deny 10.78.0.0/16", "port udp/7 drop"} {
			if !contains(now, want) {
				t.Errorf("%s: %q is missing", when, want)
			}
		}
	}
	checkRules("after SIGKILL and restart")
	deadline := time.Now().Add(10 * time.Second)
	for contains(e.rulesNow(), "deny 10.79.0.1/32") {
		if time.Now().After(deadline) {
			t.Fatalf("the rule with a 2s TTL is still there 10s later:\n%s", e.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st, err := state.Load(e.stateFile); err != nil || len(st.Deny) != parallel+1 {
		t.Errorf("after the expiry the state file has %d deny entries (%v), want %d", len(st.Deny), err, parallel+1)
	}

	// A reboot: the daemon stops, the pins go, a daemon starts.
	e.stop(syscall.SIGTERM)
	if _, err := os.Stat(e.root); err != nil {
		t.Fatalf("a stopped daemon removed its pins: %v", err)
	}
	if err := os.RemoveAll(e.root); err != nil {
		t.Fatal(err)
	}
	e.start()
	checkRules("after a reboot")
	if a := e.attachment(); a.LinkID == 0 {
		t.Errorf("not attached after the reboot")
	}
}

// check-config through the command line: every error on its own line as
// FILE:LINE: message, exit status 2; the shipped example passes.
func TestCheckConfigCommand(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("interfaces:\n  - name: eth0\n    mode: warp\ndeny:\n  - 10.0.0.0/33\nsyn:\n  rotate_every: soon\n"), 0o600)
	var out, errb bytes.Buffer
	cmd := exec.Command(moatBin, "check-config", bad)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("check-config of a bad file: %v, want exit status 2\n%s", err, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	want := []string{bad + ":3: interfaces[1].mode: invalid mode", bad + ":5: deny[1]: invalid CIDR", bad + ":7: syn.rotate_every: want a duration", "moat: " + bad + ": 3 errors"}
	if len(lines) != len(want) {
		t.Fatalf("stderr has %d lines, want %d:\n%s", len(lines), len(want), errb.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d is %q, want it to start with %q", i+1, lines[i], w)
		}
	}
	if out.Len() != 0 {
		t.Errorf("stdout: %q", out.String())
	}
	// The example names eth0, which this host need not have.
	r, err := exec.Command(moatBin, "check-config", "--file-only", "../../dist/moat.yaml").CombinedOutput()
	if err != nil || !strings.Contains(string(r), "ok:") {
		t.Errorf("check-config --file-only dist/moat.yaml: %v\n%s", err, r)
	}

	// A good file that names an interface this host lacks: the daemon
	// would refuse it here, so check-config does, on its line.
	missing := filepath.Join(dir, "missing.yaml")
	os.WriteFile(missing, []byte("deny:\n  - 10.0.0.0/8\ninterfaces:\n  - name: moat-nosuch0\n"), 0o600)
	errb.Reset()
	cmd = exec.Command(moatBin, "check-config", missing)
	cmd.Stderr = &errb
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 ||
		!strings.HasPrefix(errb.String(), missing+":4: interfaces: no interface \"moat-nosuch0\" on this host\n") {
		t.Errorf("check-config of a file naming a missing interface: %v\n%s", err, errb.String())
	}
	if r, err := exec.Command(moatBin, "check-config", "--file-only", missing).CombinedOutput(); err != nil {
		t.Errorf("check-config --file-only of the same file: %v\n%s", err, r)
	}
}

// TestCaptureTurnedOff checks that the config's capture section binds
// `moat dump` on a host with a daemon: with captures turned off, a dump is
// refused as a usage error.
func TestCaptureTurnedOff(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\ncapture:\n  enabled: false\n", e.attackerIf()))
	e.start()
	r := e.moat("dump", "-c", "1", "-w", filepath.Join(e.dir, "x.pcapng"))
	if r.code != 2 || !strings.Contains(r.stderr, "turned off") {
		t.Fatalf("moat dump with captures turned off: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestManagedRootRefusesDirectChanges checks the one-writer rule: while a
// daemon manages the root, commands that would change its state behind
// its back refuse with a usage error and change nothing; reading works,
// and changes the API takes go through the daemon.
func TestManagedRootRefusesDirectChanges(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf()))
	e.start()
	list := filepath.Join(e.dir, "list.netset")
	if err := os.WriteFile(list, []byte("203.0.113.0/24\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := e.rulesNow()
	for _, args := range [][]string{
		{"attach", e.clientIf()},
		{"detach", e.attackerIf()},
		{"policy", "fragments", "drop"},
		{"import", list},
		{"syn", "protect", "tcp/443", "--mode", "always"},
		{"limit", "add", "source", "udp", "--pps", "100"},
	} {
		r := e.moat(args...)
		if r.code != 2 || !strings.Contains(r.stderr, "daemon manages") {
			t.Errorf("moat %v with a daemon: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	if after := e.rulesNow(); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Errorf("refused commands changed the rules: %v -> %v", before, after)
	}
	if a := e.attachment(); a.LinkID == 0 {
		t.Errorf("the refused detach detached: %+v", a)
	}
	for _, args := range [][]string{{"status"}, {"policy"}, {"list"}} {
		if r := e.moat(args...); r.code != 0 {
			t.Errorf("moat %v with a daemon: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	if r := e.moat("block", "203.0.113.9"); r.code != 0 || !strings.Contains(r.stderr, "via moat daemon") {
		t.Errorf("block through the daemon: exit %d, stderr %q", r.code, r.stderr)
	}
	// A refusal through the daemon is one line, as without it.
	if r := e.moat("block", "203.0.113.9"); r.code != 2 || strings.Count(r.stderr, "\n") != 1 || strings.Contains(r.stderr, "via moat daemon") {
		t.Errorf("block of a listed address through the daemon: exit %d, want 2 and one line; stderr %q", r.code, r.stderr)
	}
}

// TestSYNPortsFromConfig checks the config's SYN ports: every one is
// protected with a counters slot of its own, a reload that replaces all
// of them (as many as there are slots) frees the old slots for the new
// ports, and a port whose settings stay the same keeps its slot and its
// counters.
func TestSYNPortsFromConfig(t *testing.T) {
	e := newEnv(t)
	synConfig := func(first int, mode string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "interfaces:\n  - name: %s\nsyn:\n  rotate_every: 5m\n  ports:\n", e.attackerIf())
		// tcp/80 in both configs, unchanged; the rest fill the slots.
		b.WriteString("    - port: 80\n      mode: auto\n")
		for p := first; p < first+syncookie.MaxProtectedPorts-1; p++ {
			fmt.Fprintf(&b, "    - port: %d\n      mode: %s\n", p, mode)
		}
		return b.String()
	}
	protected := func() map[uint16]datapath.MoatSynPort {
		t.Helper()
		s, err := shield.Open(e.root)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ps, err := syncookie.ProtectedPorts(s.Map(datapath.MoatMapSynPorts))
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint16]datapath.MoatSynPort{}
		slots := map[uint16]uint16{}
		for _, p := range ps {
			if other, taken := slots[p.Entry.Slot]; p.Entry.Slot == 0 || taken {
				t.Fatalf("tcp/%d has counters slot %d (also tcp/%d's): want a distinct, non-zero slot", p.Port, p.Entry.Slot, other)
			}
			slots[p.Entry.Slot] = p.Port
			out[p.Port] = p.Entry
		}
		return out
	}
	check := func(when string, first int, mode syncookie.Mode) map[uint16]datapath.MoatSynPort {
		t.Helper()
		got := protected()
		if len(got) != syncookie.MaxProtectedPorts {
			t.Fatalf("%s: %d ports protected, want %d", when, len(got), syncookie.MaxProtectedPorts)
		}
		for p := first; p < first+syncookie.MaxProtectedPorts-1; p++ {
			if e, ok := got[uint16(p)]; !ok || e.Mode != uint8(mode) {
				t.Fatalf("%s: tcp/%d is %+v (protected: %v), want mode %s", when, p, e, ok, mode)
			}
		}
		if e, ok := got[80]; !ok || e.Mode != uint8(syncookie.ModeAuto) {
			t.Fatalf("%s: tcp/80 is %+v (protected: %v), want mode auto", when, e, ok)
		}
		return got
	}

	e.writeConfig(synConfig(20000, "auto"))
	e.start()
	first := check("after start", 20000, syncookie.ModeAuto)

	s, err := shield.Open(e.root)
	if err != nil {
		t.Fatal(err)
	}
	// The data path must expect the config's rotation period: with the
	// default minute it would take 5m-old keys for a dead rotator.
	ks, err := syncookie.Keys(s.Map(datapath.MoatMapSynRotation), s.Map(datapath.MoatMapSynSettings))
	if err != nil || ks.Period != 5*time.Minute || ks.Rotations == 0 {
		t.Errorf("keys after start: %+v (%v), want a rotation and the config's period of 5m", ks, err)
	}
	// Counters of the port that stays: a reload must not reset them.
	marked := make([]datapath.MoatSynPortStats, ebpf.MustPossibleCPU())
	marked[0].Syns = 77
	err = s.Map(datapath.MoatMapSynCounters).Update(uint32(first[80].Slot), marked, ebpf.UpdateAny)
	s.Close()
	if err != nil {
		t.Fatal(err)
	}

	e.writeConfig(synConfig(30000, "always"))
	reloads := strings.Count(e.log.String(), "msg=reloaded")
	e.daemon.Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(20 * time.Second); strings.Count(e.log.String(), "msg=reloaded") == reloads; {
		if time.Now().After(deadline) || strings.Contains(e.log.String(), "level=ERROR") {
			t.Fatalf("no reload after SIGHUP:\n%s", e.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	second := check("after the reload", 30000, syncookie.ModeAlways)
	if second[80].Slot != first[80].Slot {
		t.Errorf("tcp/80 moved from slot %d to %d though its settings stayed", first[80].Slot, second[80].Slot)
	}
	r := e.mustMoat("syn", "status", "--json")
	var st struct {
		Ports []syncookie.PortStatus `json:"ports"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("syn status --json: %v\n%s", err, r.stdout)
	}
	seen := false
	for _, p := range st.Ports {
		if p.Port == 80 {
			seen = true
			if p.SYNs != 77 {
				t.Errorf("tcp/80 counts %d SYNs after the reload, want the 77 it had", p.SYNs)
			}
		}
	}
	if !seen || len(st.Ports) != syncookie.MaxProtectedPorts {
		t.Errorf("syn status lists %d ports (tcp/80 among them: %v), want %d", len(st.Ports), seen, syncookie.MaxProtectedPorts)
	}
}

// TestSYNPortsNeedTheSysctls checks that a daemon whose config asks for
// cookies refuses to start, with the sysctl named on one line, in a
// namespace where the kernel would refuse moat's handshakes, and that it
// attached nothing; and that it starts, with a warning, where only a TCP
// option is turned off.
func TestSYNPortsNeedTheSysctls(t *testing.T) {
	e := newEnv(t)
	if err := e.lab.Server.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_syncookies", []byte("0"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\nsyn:\n  ports:\n    - port: 443\n      mode: auto\n", e.attackerIf()))
	log := &syncBuffer{}
	d := e.lab.Server.Command(context.Background(), moatBin, "run", "--config", e.cfg)
	d.Stdout, d.Stderr = log, log
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Fatalf("the daemon exited 0:\n%s", log)
		}
	case <-time.After(20 * time.Second):
		d.Process.Kill()
		<-exited
		t.Fatalf("the daemon runs with tcp_syncookies=0:\n%s", log)
	}
	var line string
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.Contains(l, "net.ipv4.tcp_syncookies is 0") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no line names net.ipv4.tcp_syncookies:\n%s", log)
	}
	// check-config says so before a start or reload, on the port's line;
	// --file-only checks the file alone.
	checkConfig := func(args ...string) (stdout, stderr string, code int) {
		var out, errb bytes.Buffer
		c := e.lab.Server.Command(context.Background(), moatBin, append([]string{"check-config"}, args...)...)
		c.Stdout, c.Stderr = &out, &errb
		err := c.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	if _, errOut, code := checkConfig(e.cfg); code != 2 ||
		!strings.HasPrefix(errOut, e.cfg+":5: syn.ports: moat cannot issue cookies for tcp/443 in this network namespace: net.ipv4.tcp_syncookies is 0") {
		t.Errorf("check-config with tcp_syncookies 0: exit %d\n%s", code, errOut)
	}
	if out, errOut, code := checkConfig("--file-only", e.cfg); code != 0 || !strings.Contains(out, "ok:") {
		t.Errorf("check-config --file-only: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(e.root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused start left %s behind (%v)", e.root, err)
	}
	if s, err := shield.Open(e.root); err == nil {
		atts, _ := s.Attachments()
		ps, _ := syncookie.ProtectedPorts(s.Map(datapath.MoatMapSynPorts))
		s.Close()
		if len(atts) != 0 || len(ps) != 0 {
			t.Errorf("the refused start attached %v and protected %v", atts, ps)
		}
	}

	// An option turned off is no reason to refuse: moat then does not
	// offer it, as the kernel would not, and the daemon says so.
	if err := e.lab.Server.Do(func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/tcp_syncookies", []byte("1"), 0); err != nil {
			return err
		}
		return os.WriteFile("/proc/sys/net/ipv4/tcp_sack", []byte("0"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	e.start()
	var note string
	for _, l := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "net.ipv4.tcp_sack is 0") {
			note = l
		}
	}
	if note == "" {
		t.Errorf("no warning names net.ipv4.tcp_sack:\n%s", e.log)
	}
	if out, errOut, code := checkConfig(e.cfg); code != 0 || !strings.Contains(out, "ok:") ||
		!strings.HasPrefix(errOut, "note: net.ipv4.tcp_sack is 0") {
		t.Errorf("check-config with tcp_sack 0: exit %d, want 0 and a note\n%s%s", code, out, errOut)
	}
	s, err := shield.Open(e.root)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := syncookie.ProtectedPorts(s.Map(datapath.MoatMapSynPorts))
	s.Close() // the state's lock: moat commands below take it
	if err != nil || len(ps) != 1 {
		t.Errorf("protected ports %v (%v), want tcp/443", ps, err)
	}

	// tcp_syncookies turned off under a running daemon: the data path
	// leaves SYNs to the kernel, and syn status says why.
	if err := e.lab.Server.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_syncookies", []byte("0"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := e.lab.Server.Command(ctx, moatBin, "syn", "status")
	st.Env = append(os.Environ(), "MOAT_SOCKET="+e.sock, "MOAT_ROOT="+e.root)
	out, err := st.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "net.ipv4.tcp_syncookies is 0") {
		t.Errorf("syn status with tcp_syncookies 0 (%v):\n%s", err, out)
	}
}

// TestSynProtectNotesOptionsTurnedOff: `moat syn protect` in a namespace
// with a TCP option turned off protects the port and notes that moat will
// not offer the option; with tcp_syncookies 0 it refuses with a one-line
// error and protects nothing.
func TestSynProtectNotesOptionsTurnedOff(t *testing.T) {
	e := newEnv(t)
	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := e.lab.Server.Command(ctx, moatBin, append([]string{"--root", e.root}, args...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	sysctl := func(name, val string) {
		if err := e.lab.Server.Do(func() error {
			return os.WriteFile("/proc/sys/net/ipv4/"+name, []byte(val), 0)
		}); err != nil {
			t.Fatal(err)
		}
	}
	sysctl("tcp_timestamps", "0")
	out, err := run("syn", "protect", "tcp/443", "--mode", "always")
	if err != nil || !strings.Contains(out, "note: net.ipv4.tcp_timestamps is 0: moat's SYN-ACKs offer no timestamps") {
		t.Errorf("syn protect with tcp_timestamps 0 (%v):\n%s", err, out)
	}
	// Attached to a veth, whose peer sees XDP_TX frames only with NAPI.
	if out, err := run("attach", e.attackerIf()); err != nil {
		t.Fatalf("attach: %v\n%s", err, out)
	}
	out, err = run("syn", "protect", "tcp/443", "--mode", "auto")
	if err != nil || !strings.Contains(out, "note: "+e.attackerIf()+" is a veth: its peer receives moat's SYN-ACKs (XDP_TX) only while the peer runs NAPI") {
		t.Errorf("syn protect on a veth (%v):\n%s", err, out)
	}
	if out, err := run("syn", "protect", "tcp/443", "--mode", "never"); err != nil || strings.Contains(out, "is a veth") {
		t.Errorf("syn protect --mode never on a veth (%v): want no veth note:\n%s", err, out)
	}
	// One rotation by hand says how long its keys last without a rotator.
	if out, err := run("syn", "rotate"); err != nil || !strings.Contains(out, "key rotation ") ||
		!strings.Contains(out, "note: the data path expects a rotation every 1m0s (set by the daemon or the last --every): without a rotator it issues no cookies after 2m30s") {
		t.Errorf("syn rotate (%v):\n%s", err, out)
	}
	sysctl("tcp_syncookies", "0")
	out, err = run("syn", "protect", "tcp/444", "--mode", "always")
	if err == nil || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "net.ipv4.tcp_syncookies is 0") {
		t.Errorf("syn protect with tcp_syncookies 0 (%v), want one line naming it:\n%s", err, out)
	}
	s, err := shield.Open(e.root)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := syncookie.ProtectedPorts(s.Map(datapath.MoatMapSynPorts))
	s.Close()
	if err != nil || len(ps) != 1 || ps[0].Port != 443 {
		t.Errorf("protected ports %v (%v), want tcp/443 alone", ps, err)
	}
}

// TestStartRotatesStaleKeys: a daemon that starts on keys a stopped one
// left a period ago or more rotates before it says ready, or the data
// path would take them for stale and issue no cookies until the first
// tick; on keys younger than a period it keeps them.
func TestStartRotatesStaleKeys(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\nsyn:\n  rotate_every: 1m\n  ports:\n    - port: 443\n      mode: always\n", e.attackerIf()))
	e.start()
	e.stop(syscall.SIGTERM)
	for _, tc := range []struct {
		age     time.Duration
		rotates bool
	}{
		{10 * time.Minute, true}, // stale: no cookies until a rotation
		{70 * time.Second, true}, // due
		{0, false},               // rotated a moment ago
	} {
		before := e.keys(tc.age)
		e.start()
		after := e.keys(0)
		e.stop(syscall.SIGTERM)
		want := before.Rotations
		if tc.rotates {
			want++
		}
		if after.Rotations != want || after.Stale {
			t.Errorf("keys %s old at start: %d rotations -> %d (stale %v), want %d and fresh",
				before.Age.Round(time.Second), before.Rotations, after.Rotations, after.Stale, want)
		}
	}
}

// TestChangeWithoutDaemonIsNamed: with the daemon killed (its socket left
// behind), a rule added with the CLI goes to the pinned maps alone. The
// CLI warns that the daemon will not keep it, and the daemon, at its next
// start, names the entry it removes.
func TestChangeWithoutDaemonIsNamed(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf()))
	e.start()
	e.stop(syscall.SIGKILL)
	if _, err := os.Stat(e.sock); err != nil {
		t.Fatalf("the killed daemon left no socket: %v", err)
	}
	// 18 entries: the daemon's line names 16 and counts the rest.
	blocked := []string{"block"}
	for i := 1; i <= 18; i++ {
		blocked = append(blocked, fmt.Sprintf("10.63.0.%d", i))
	}
	r := e.mustMoat(blocked...)
	if n := strings.Count(r.stderr, "moat: warning: no daemon answers on "+e.sock); n != 1 {
		t.Errorf("block with a dead daemon's socket: the warning %d times on stderr, want once:\n%s", n, r.stderr)
	}
	if strings.Contains(r.stderr, "via moat daemon") {
		t.Errorf("stderr says the change went through a daemon:\n%s", r.stderr)
	}
	// Reading says nothing of it.
	if r := e.mustMoat("list"); strings.Contains(r.stderr, "warning") {
		t.Errorf("list warns:\n%s", r.stderr)
	}

	e.start()
	var line string
	for _, l := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(l, "removed entries in neither the config nor the state file") {
			line = l
		}
	}
	if !strings.Contains(line, "list=deny") || !strings.Contains(line, "count=18") || !strings.Contains(line, "10.63.0.1/32") ||
		!strings.Contains(line, "and 2 more") {
		t.Errorf("the daemon's start does not name the entry it removed:\n%s", e.log)
	}
	if got := e.rulesNow(); contains(got, "deny 10.63.0.1/32") {
		t.Errorf("rules after the start: %v", got)
	}
}

// TestSynRotateWithDaemon: where a daemon manages the root, `moat syn
// rotate` is refused with the reason (the daemon rotates the keys
// itself), and a schedule under a second is bad input whoever runs.
func TestSynRotateWithDaemon(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\nsyn:\n  ports:\n    - port: 443\n", e.attackerIf()))
	e.start()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"syn", "rotate"}, "it rotates the keys itself (syn.rotate_every in its config)"},
		{[]string{"syn", "rotate", "--every", "0s"}, "the key rotation period must be between 1s and 24h0m0s"},
		{[]string{"syn", "rotate", "--every", "500ms"}, "the key rotation period must be between 1s and 24h0m0s"},
	} {
		r := e.moat(tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("moat %s: exit %d, want 2 and one line with %q:\n%s", strings.Join(tc.args, " "), r.code, tc.want, r.stderr)
		}
	}
}

// TestStatsWatchJSONLines: `moat stats --json --watch` prints one JSON
// object per interface and interval, a line each, with the rates.
func TestStatsWatchJSONLines(t *testing.T) {
	e := newEnv(t)
	if r, err := e.lab.Server.Command(context.Background(), moatBin, "--root", e.root, "attach", e.attackerIf()).CombinedOutput(); err != nil {
		t.Fatalf("attach: %v\n%s", err, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	cmd := e.lab.Server.Command(ctx, moatBin, "--root", e.root, "stats", "--json", "--watch", "300ms")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Run() // ends when the context kills it
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 2 {
		t.Fatalf("%d lines in 1.2s of watching every 300ms:\n%s", len(lines), out.String())
	}
	for i, l := range lines {
		var r struct {
			Iface string          `json:"iface"`
			Rates json.RawMessage `json:"rates"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Iface != e.attackerIf() || len(r.Rates) == 0 {
			t.Errorf("line %d is not one interface's object with rates (%v): %q", i+1, err, l)
		}
	}
}

// TestDaemonTakesCensus: the running daemon keeps the socket census
// current (syn status says so and counts a connection to a protected
// port), and when it stops the census is out of date at once, so the data
// path looks sockets up again.
func TestDaemonTakesCensus(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\nsyn:\n  ports:\n    - port: 8080\n      mode: always\n", e.attackerIf()))
	var ln net.Listener
	if err := e.lab.Server.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		ln, err = lc.Listen(context.Background(), "tcp", ":8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conn net.Conn
	if err := e.lab.Client.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(e.lab.Client.Ifaces[0].PeerIPv4, 8080).String(), 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	census := func() syncookie.CensusStatus {
		t.Helper()
		r := e.mustMoat("syn", "status", "--json")
		var st struct {
			Census syncookie.CensusStatus `json:"socket_census"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("syn status --json: %v\n%s", err, r.stdout)
		}
		return st.Census
	}
	e.start()
	var st syncookie.CensusStatus
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st = census(); st.Trusted && st.Sockets == 1 || time.Now().After(deadline) {
			break
		}
	}
	if !st.Trusted || st.Sockets != 1 || st.Passes < 2 {
		t.Fatalf("census under the daemon: %+v, want current with the one connection", st)
	}
	if out := e.mustMoat("syn", "status").stdout; !strings.Contains(out, "socket census: ") || !strings.Contains(out, "sockets of protected ports at the last: 1)") {
		t.Errorf("syn status:\n%s", out)
	}
	e.stop(syscall.SIGTERM)
	st = census()
	if st.Trusted {
		t.Errorf("census once the daemon stopped: %+v, want out of date at once", st)
	}
	time.Sleep(1500 * time.Millisecond)
	if after := census(); after.Passes != st.Passes {
		t.Errorf("census passes went on after the daemon stopped: %d -> %d", st.Passes, after.Passes)
	}
	if out := e.mustMoat("syn", "status").stdout; !strings.Contains(out, "socket census: not current") {
		t.Errorf("syn status without the daemon:\n%s", out)
	}
}

// TestDaemonTakesOverCensus: a daemon that finds another process taking
// the socket census runs without it, says so, and takes the census over
// once the other stops.
func TestDaemonTakesOverCensus(t *testing.T) {
	e := newEnv(t)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\nsyn:\n  ports:\n    - port: 8080\n      mode: always\n", e.attackerIf()))
	e.start() // pins the maps the other taker needs
	e.stop(syscall.SIGTERM)
	var other func()
	if err := e.lab.Server.Do(func() error {
		s, err := shield.Open(e.root)
		if err != nil {
			return err
		}
		defer s.Close()
		other, err = s.StartCensus(nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if other != nil {
			other()
		}
	})
	e.start()
	// The daemon says so just after it is ready: on a loaded machine that
	// may be a moment after the start returns.
	said := func() bool {
		return strings.Contains(e.log.String(), "another process") && strings.Contains(e.log.String(), "trying again")
	}
	for deadline := time.Now().Add(5 * time.Second); !said() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !said() {
		t.Fatalf("daemon log while another process takes the census:\n%s", e.log)
	}
	census := func() syncookie.CensusStatus {
		t.Helper()
		var st struct {
			Census syncookie.CensusStatus `json:"socket_census"`
		}
		if r := e.mustMoat("syn", "status", "--json"); json.Unmarshal([]byte(r.stdout), &st) != nil {
			t.Fatalf("syn status --json:\n%s", r.stdout)
		}
		return st.Census
	}
	other()
	other = nil
	if st := census(); st.Trusted {
		t.Fatalf("census once the other taker stopped: %+v, want out of date until the daemon takes it", st)
	}
	stopped := census().Passes
	deadline := time.Now().Add(shield.CensusRetryEvery + 5*time.Second)
	for !strings.Contains(e.log.String(), "socket census taken") {
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not take the census over:\n%s", e.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st := census(); !st.Trusted || st.Passes < stopped+2 {
		t.Fatalf("census after the daemon took it: %+v, want current with passes beyond %d", st, stopped)
	}
	if n := strings.Count(e.log.String(), "trying again"); n != 1 {
		t.Errorf("the refusal was logged %d times, want once:\n%s", n, e.log)
	}
}

// TestExpireThroughDaemon: `moat expire` under a daemon asks the daemon,
// which removes the timed rule from the maps and from its state file (the
// CLI alone would leave the state file holding it).
func TestExpireThroughDaemon(t *testing.T) {
	e := newEnv(t)
	e.expireEvery = "1h" // only the command expires here
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n", e.attackerIf()))
	e.start()
	e.mustMoat("block", "203.0.113.7", "--ttl", "1s")
	time.Sleep(1200 * time.Millisecond)
	r := e.mustMoat("expire")
	if !strings.Contains(r.stdout, "removed 1 expired entries") || !strings.Contains(r.stderr, "via moat daemon") {
		t.Fatalf("moat expire under the daemon said:\n%s%s", r.stdout, r.stderr)
	}
	if out := e.mustMoat("list").stdout; strings.Contains(out, "203.0.113.7") {
		t.Errorf("the expired entry is still listed:\n%s", out)
	}
	if b, err := os.ReadFile(e.stateFile); err != nil || strings.Contains(string(b), "203.0.113.7") {
		t.Errorf("state file (%v):\n%s", err, b)
	}
	if r := e.mustMoat("expire"); !strings.Contains(r.stdout, "removed 0 expired entries") {
		t.Errorf("a second expire said %q", r.stdout)
	}
}

// TestAutoBlocksUnderTheDaemon: a limit's auto-block can be lifted with
// moat unblock, leaves the denylist once its time has passed (moat expire,
// or the daemon's timer), and outlives the expiry of a run-time rule it
// was written over.
func TestAutoBlocksUnderTheDaemon(t *testing.T) {
	e := newEnv(t)
	e.expireEvery = "1h" // only the command expires here
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\nlimits:\n  - {kind: source, scope: udp, pps: 1, burst_packets: 3, block: 2s}\nlimit_settings:\n  gate: none\n", e.clientIf()))
	e.start()
	sink := e.listenUDP()
	client := e.lab.Client.Ifaces[0].IPv4.Addr().String()
	blocked := func() bool {
		for _, r := range e.rulesNow() {
			if strings.HasPrefix(r, "deny "+client+"/32 auto-block") {
				return true
			}
		}
		return false
	}
	block := func() {
		t.Helper()
		for range 8 {
			e.sendFromClient(sink, 20*time.Millisecond)
		}
		if !blocked() {
			t.Fatalf("no auto-block of %s after 8 datagrams over 1 pps; rules %q", client, e.rulesNow())
		}
	}

	block()
	if r := e.moat("unblock", client); r.code != 0 {
		t.Fatalf("moat unblock of an auto-block: %+v", r)
	}
	if blocked() {
		t.Fatalf("the auto-block is still listed after moat unblock: %q", e.rulesNow())
	}

	block()
	time.Sleep(2200 * time.Millisecond)
	if r := e.mustMoat("expire"); !strings.Contains(r.stdout, "removed 1 expired entries") {
		t.Fatalf("moat expire after the auto-block's time said %q", r.stdout)
	}
	if blocked() {
		t.Fatalf("the expired auto-block is still listed: %q", e.rulesNow())
	}

	// A run-time rule that expires, then an auto-block over the same
	// address: expiring the rule leaves the auto-block.
	e.mustMoat("block", client, "--ttl", "1s")
	time.Sleep(1200 * time.Millisecond)
	block()
	e.mustMoat("expire")
	if !blocked() {
		t.Fatalf("expiring the run-time rule took the auto-block written over it: %q", e.rulesNow())
	}
}

// TestReloadThroughTheAPIChangesPeriods: `moat reload`, like SIGHUP, puts
// a new key rotation period in force: shortened from 10m to 2s, the keys
// rotate at once (they would be stale by the new period) and then every
// 2s. A change of daemon.log_format is refused: the logger is made once.
func TestReloadThroughTheAPIChangesPeriods(t *testing.T) {
	e := newEnv(t)
	body := "interfaces:\n  - name: %s\nsyn:\n  rotate_every: %s\n  ports:\n    - port: 443\n      mode: always\n"
	e.writeConfig(fmt.Sprintf(body, e.attackerIf(), "10m"))
	e.start()
	before := e.keys(0)
	e.writeConfig(fmt.Sprintf(body, e.attackerIf(), "2s"))
	e.mustMoat("reload")
	if k := e.keys(0); k.Rotations != before.Rotations+1 || k.Stale {
		t.Fatalf("after the reload to 2s: %d rotations (stale %v), want %d and fresh", k.Rotations, k.Stale, before.Rotations+1)
	}
	time.Sleep(4500 * time.Millisecond)
	if k := e.keys(0); k.Rotations < before.Rotations+3 || k.Stale {
		t.Errorf("4.5s after the reload to 2s: %d rotations (stale %v), want at least %d", k.Rotations, k.Stale, before.Rotations+3)
	}

	b, err := os.ReadFile(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.cfg, []byte(strings.Replace(string(b), "  log_level: debug\n", "  log_level: debug\n  log_format: json\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.moat("reload"); r.code == 0 || !strings.Contains(r.stderr, "daemon.log_format") {
		t.Errorf("a reload changing daemon.log_format: %+v, want refused naming it", r)
	}
}

// TestReloadShorteningTheRotationRotatesOnce: a reload that shortens
// syn.rotate_every below the key's age rotates the key once, not once for
// the key's age and again for the shorter period: a cookie is valid under
// the current key and the one before, and two rotations in one reload
// would drop both keys a handshake in flight may use.
func TestReloadShorteningTheRotationRotatesOnce(t *testing.T) {
	e := newEnv(t)
	body := "interfaces:\n  - name: %s\nsyn:\n  rotate_every: %s\n  ports:\n    - port: 443\n      mode: always\n"
	e.writeConfig(fmt.Sprintf(body, e.attackerIf(), "50s"))
	e.start()
	// Younger than the old period, older than the new: due at the reload.
	before := e.keys(15 * time.Second)
	e.writeConfig(fmt.Sprintf(body, e.attackerIf(), "10s"))
	e.mustMoat("reload")
	if k := e.keys(0); k.Rotations != before.Rotations+1 || k.Stale {
		t.Errorf("a reload from 50s to 10s with keys 15s old: %d rotations -> %d (stale %v), want %d\ndaemon log:\n%s",
			before.Rotations, k.Rotations, k.Stale, before.Rotations+1, e.log)
	}
}

// reloadAPI reloads through the daemon's API and returns its answer,
// which says more than the CLI prints.
func (e *env) reloadAPI() daemon.ReloadResult {
	e.t.Helper()
	res, err := e.postReload()
	if err != nil {
		e.t.Fatal(err)
	}
	if !res.OK {
		e.t.Fatalf("reload: %+v\ndaemon log:\n%s", res, e.log)
	}
	return res
}

// postReload asks the daemon's API for a reload, from any goroutine.
func (e *env) postReload() (res daemon.ReloadResult, err error) {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", e.sock)
	}}}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://moat/v1/reload", "application/json", nil)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	return res, json.NewDecoder(resp.Body).Decode(&res)
}

// bigList writes a rule file of n host addresses in 10.0.0.0/8 into the
// test's directory, for a reload that takes a while.
func (e *env) bigList(n int) string {
	e.t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "10.%d.%d.%d\n", i>>16, i>>8&255, i&255)
	}
	list := filepath.Join(e.dir, "big.txt")
	if err := os.WriteFile(list, []byte(b.String()), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return list
}

// TestReloadReportsLimitsAndPolicy: a reload's answer, and its log line,
// say what changed in limits, policy and limit_settings too, and count
// among the removed entries the auto-blocks that leaving monitor mode
// deleted. A reload that changes nothing says so.
func TestReloadReportsLimitsAndPolicy(t *testing.T) {
	e := newEnv(t)
	body := "interfaces:\n  - name: %s\n%slimits:\n  - {kind: source, scope: udp, pps: %d, burst_packets: 3, block: 1m}\nlimit_settings:\n  gate: none\n  sample: %d\n"
	e.writeConfig(fmt.Sprintf(body, e.clientIf(), "policy:\n  monitor: true\n", 1, 64))
	e.start()
	sink := e.listenUDP()
	client := e.lab.Client.Ifaces[0].IPv4.Addr().String()
	for range 8 {
		e.sendFromClient(sink, 20*time.Millisecond)
	}
	e.waitRules("a monitor mode auto-block", func(r []string) bool {
		return slices.ContainsFunc(r, func(l string) bool { return strings.HasPrefix(l, "deny "+client+"/32 monitor mode: ") })
	})

	e.writeConfig(fmt.Sprintf(body, e.clientIf(), "", 2, 1024))
	ch := e.reloadAPI().Changes
	if ch.Limits != 1 || fmt.Sprint(ch.Policy) != "[monitor]" || fmt.Sprint(ch.LimitSettings) != "[sample]" ||
		ch.MonitorBlocks != 1 || ch.Removed != 1 || ch.Added != 0 {
		t.Errorf("reload out of monitor mode, a limit and the sample changed: %+v, want 1 limit, policy [monitor], limit settings [sample], 1 removed (a monitor block)", ch)
	}
	if !strings.Contains(e.log.String(), "removed=1 port_rules=0 attached=0 detached=0 syn_ports=0 limits=1 policy=monitor limit_settings=sample monitor_blocks_removed=1") {
		t.Errorf("the reload's log line does not say what changed:\n%s", e.log)
	}
	if r := e.rulesNow(); slices.ContainsFunc(r, func(l string) bool { return strings.HasPrefix(l, "deny "+client+"/32") }) {
		t.Errorf("the monitor mode auto-block is still listed: %q", r)
	}

	if ch := e.reloadAPI().Changes; ch.Limits != 0 || ch.Policy != nil || ch.LimitSettings != nil || ch.Removed != 0 || ch.Added != 0 {
		t.Errorf("a reload of the same config: %+v, want no change", ch)
	}
}

// TestReloadRefusesAPortOverlap: a reload whose config's port rule
// overlaps part of a run-time rule is refused, naming both: applied, the
// run-time rule's other ports would have been lost for good. A rule with
// the config's own spec leaves the state file as before.
func TestReloadRefusesAPortOverlap(t *testing.T) {
	e := newEnv(t)
	body := "interfaces:\n  - name: %s\nports:\n  - rule: %s\n    action: drop\n"
	e.writeConfig(fmt.Sprintf(body, e.attackerIf(), "udp/19"))
	e.start()
	e.mustMoat("port", "drop", "udp/20-30", "udp/40")
	e.writeConfig(fmt.Sprintf(body, e.attackerIf(), "udp/19-25"))
	r := e.moat("reload")
	if r.code == 0 || !strings.Contains(r.stderr, "udp/19-25") || !strings.Contains(r.stderr, "udp/20-30") {
		t.Fatalf("reload over a partial overlap: %+v, want refused naming both rules", r)
	}
	rules := e.rulesNow()
	for _, want := range []string{"port udp/19 drop", "port udp/20-30 drop", "port udp/40 drop"} {
		if !contains(rules, want) {
			t.Errorf("after the refused reload, rules %q lack %q", rules, want)
		}
	}
	if b, err := os.ReadFile(e.stateFile); err != nil || !strings.Contains(string(b), "udp/20-30") {
		t.Errorf("state file lost the run-time rule (%v):\n%s", err, b)
	}

	// Started with the overlap (a restart after the refusal): the
	// config's rule applies, the run-time one waits unapplied, reloads
	// go through, and moat port remove takes it from the state file.
	e.stop(syscall.SIGTERM)
	e.start()
	rules = e.rulesNow()
	if !contains(rules, "port udp/19-25 drop") || contains(rules, "port udp/20-30 drop") {
		t.Errorf("started over the overlap: rules %q, want udp/19-25 and not udp/20-30", rules)
	}
	e.mustMoat("reload")
	e.mustMoat("port", "remove", "udp/20-30")
	if b, err := os.ReadFile(e.stateFile); err != nil || strings.Contains(string(b), "udp/20-30") {
		t.Errorf("state file still holds the removed rule (%v):\n%s", err, b)
	}

	e.writeConfig(fmt.Sprintf(body, e.attackerIf(), "udp/40"))
	e.mustMoat("reload")
	if b, err := os.ReadFile(e.stateFile); err != nil || strings.Contains(string(b), "udp/40") {
		t.Errorf("state file after the config took udp/40 (%v):\n%s", err, b)
	}
}

// keys reads the SYN cookie keys' status from the pins, after making the
// last rotation age older (0: as it is).
func (e *env) keys(age time.Duration) syncookie.KeyStatus {
	e.t.Helper()
	s, err := shield.Open(e.root)
	if err != nil {
		e.t.Fatal(err)
	}
	defer s.Close()
	rotation := s.Map(datapath.MoatMapSynRotation)
	if age > 0 {
		var st datapath.MoatSynKeyState
		if err := rotation.Lookup(uint32(0), &st); err != nil {
			e.t.Fatal(err)
		}
		st.RotatedNs -= uint64(age)
		if err := rotation.Update(uint32(0), &st, ebpf.UpdateExist); err != nil {
			e.t.Fatal(err)
		}
	}
	ks, err := syncookie.Keys(rotation, s.Map(datapath.MoatMapSynSettings))
	if err != nil {
		e.t.Fatal(err)
	}
	return ks
}
