package cli_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// realDaemon is a `moat run` of the test's own: no interface, its config,
// state file and socket in a directory of the test's.
type realDaemon struct {
	cmd             *exec.Cmd
	socket, logPath string
	exited          chan struct{}
}

// startDaemon runs a daemon on root and returns once its API answers. It
// is stopped when the test ends, before newRoot's cleanup removes root.
func startDaemon(t *testing.T, root string) *realDaemon {
	t.Helper()
	dir := t.TempDir()
	d := &realDaemon{socket: filepath.Join(dir, "moat.sock"), logPath: filepath.Join(dir, "log"), exited: make(chan struct{})}
	cfg := filepath.Join(dir, "moat.yaml")
	text := fmt.Sprintf("metrics:\n  enabled: false\ndaemon:\n  bpffs_root: %s\n  state_file: %s\n  feed_dir: %s\n  socket: %s\n",
		root, filepath.Join(dir, "state.json"), filepath.Join(dir, "feeds"), d.socket)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	d.cmd = exec.CommandContext(context.Background(), moatBin, "run", "--config", cfg)
	d.cmd.Env = os.Environ()
	d.cmd.Stdout, d.cmd.Stderr = log, log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(10 * time.Second):
			d.cmd.Process.Kill()
			<-d.exited
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", d.socket); err == nil {
			c.Close()
			if strings.Contains(d.log(), "msg=ready") {
				return d
			}
		}
		select {
		case <-d.exited:
			t.Fatalf("the daemon exited at start:\n%s", d.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon is not ready after 20s:\n%s", d.log())
		}
	}
}

func (d *realDaemon) log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

// TestChangesFindTheDaemonByItsLock: a daemon is found by the lock it
// holds on its root, not by the socket the operator happens to name.
// With MOAT_SOCKET naming no daemon, or the root given relative to the
// working directory, a change goes through the daemon (and so outlives
// its reload), a change of what the config owns is refused, and a daemon
// that answers on no socket has changes refused with its pid and socket
// rather than written behind it.
func TestChangesFindTheDaemonByItsLock(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	d := startDaemon(t, root)
	nobody := filepath.Join(t.TempDir(), "nobody.sock")
	rel := filepath.Base(root) // from bpffsDir
	via := "moat: via moat daemon (" + d.socket + ")"

	cases := []struct {
		name, dir, root, socket string
	}{
		{"MOAT_SOCKET names no daemon", "", root, nobody},
		{"relative root", bpffsDir, rel, d.socket},
		{"relative root, MOAT_SOCKET names no daemon", bpffsDir, rel, nobody},
	}
	for i, tc := range cases {
		env := []string{"MOAT_SOCKET=" + tc.socket}
		addr := fmt.Sprintf("10.31.0.%d", i+1)
		if r := runBinaryIn(t, tc.dir, env, tc.root, "block", addr); r.code != 0 || !strings.Contains(r.stderr, via) {
			t.Errorf("%s: block %s: want it through the daemon (%q):\n%v", tc.name, addr, via, r)
		}
		r := runBinaryIn(t, tc.dir, env, tc.root, "policy", "monitor", "on")
		checkUsageError(t, r, "a moat daemon manages "+root+" ("+d.socket+")")
	}
	// What went through the daemon is in its state file: a reload keeps it.
	if r := runBinary(t, []string{"MOAT_SOCKET=" + d.socket}, root, "reload"); r.code != 0 {
		t.Fatalf("reload: %v\ndaemon log:\n%s", r, d.log())
	}
	list := moatHere(t, root, "list").stdout
	for i := range cases {
		if addr := fmt.Sprintf("10.31.0.%d/32", i+1); !strings.Contains(list, addr) {
			t.Errorf("%s is gone after the daemon's reload:\n%s", addr, list)
		}
	}
	if r := moatHere(t, root, "policy"); !strings.Contains(r.stdout, "monitor off") {
		t.Errorf("monitor mode changed behind the daemon:\n%s", r.stdout)
	}

	// The daemon holds the root but nobody can reach it: its socket is
	// gone from the file system.
	if err := os.Remove(d.socket); err != nil {
		t.Fatal(err)
	}
	for _, socket := range []string{nobody, d.socket} {
		r := runBinary(t, []string{"MOAT_SOCKET=" + socket}, root, "block", "10.31.0.9")
		want := fmt.Sprintf("(pid %d, socket %s)", d.cmd.Process.Pid, d.socket)
		if r.code != 1 || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "moat: ") ||
			!strings.Contains(r.stderr, want) || r.stdout != "" {
			t.Errorf("block with MOAT_SOCKET=%s and the daemon unreachable: want exit 1 and one line naming %q:\n%v", socket, want, r)
		}
	}
	if list := moatHere(t, root, "list").stdout; strings.Contains(list, "10.31.0.9") {
		t.Errorf("a block was written behind the unreachable daemon:\n%s", list)
	}
}
