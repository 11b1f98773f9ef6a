package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

// TestSynProtectPastTheSlots checks that asking to protect more ports than
// the counters have slots for is a user error that protects none of them.
func TestSynProtectPastTheSlots(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	ports := s.Map(datapath.MoatMapSynPorts)
	// All slots but one taken, as `moat syn protect` would take them.
	for i := 1; i < syncookie.MaxProtectedPorts; i++ {
		e := datapath.MoatSynPort{Mode: uint8(syncookie.ModeNever), Slot: uint16(i)}
		if err := ports.Update(uint32(10000+i), e, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	checkUsageError(t, runMain(root, "syn", "protect", "tcp/80", "tcp/443", "--mode", "never"), "too many protected ports")
	r := mustRun(t, root, "syn", "status", "--json")
	if got := len(protectedPorts(t, root)); got != syncookie.MaxProtectedPorts-1 {
		t.Fatalf("%d ports protected after the refused command, want %d\n%s", got, syncookie.MaxProtectedPorts-1, r.stdout)
	}
	// One more fits; protecting a protected port again needs no slot.
	mustRun(t, root, "syn", "protect", "tcp/80", "--mode", "never")
	mustRun(t, root, "syn", "protect", "tcp/80", "tcp/10001", "--mode", "never")
	if got := len(protectedPorts(t, root)); got != syncookie.MaxProtectedPorts {
		t.Fatalf("%d ports protected, want %d", got, syncookie.MaxProtectedPorts)
	}
}

func protectedPorts(t *testing.T, root string) []syncookie.PortEntry {
	t.Helper()
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pe, err := syncookie.ProtectedPorts(s.Map(datapath.MoatMapSynPorts))
	if err != nil {
		t.Fatal(err)
	}
	return pe
}

// startRotator runs `moat syn rotate --every 1s` on root until the test
// ends; done receives its exit (send nil back after reading it, for the
// cleanup).
func startRotator(t *testing.T, root string) (cmd *exec.Cmd, stdout, stderr io.Reader, done chan error) {
	t.Helper()
	cmd = exec.Command(moatBin, "syn", "rotate", "--every", "1s", "--root", root)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if stderr, err = cmd.StderrPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done = make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	return cmd, stdout, stderr, done
}

// TestRotatorLeavesTheStateUnlocked checks that `moat syn rotate --every`
// holds the state's lock only while it rotates: other commands run beside
// it, and it keeps rotating.
func TestRotatorLeavesTheStateUnlocked(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	mustRun(t, root, "syn", "protect", "tcp/443", "--mode", "never")
	rotator, out, rotatorErr, done := startRotator(t, root)
	go io.Copy(io.Discard, rotatorErr)
	first, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "key rotation") {
		t.Fatalf("the rotator printed %q (%v)", first, err)
	}
	go io.Copy(io.Discard, out)

	type status struct {
		syncookie.KeyStatus
		Census syncookie.CensusStatus `json:"socket_census"`
	}
	read := func() status {
		t.Helper()
		res := make(chan result, 1)
		go func() { res <- runMain(root, "syn", "status", "--json") }()
		select {
		case r := <-res:
			var st status
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
				t.Fatalf("syn status beside the rotator: %v", r)
			}
			return st
		case <-time.After(5 * time.Second):
			t.Fatal("syn status waited 5s for the state the rotator holds")
		}
		return status{}
	}
	start := read()
	for deadline := time.Now().Add(10 * time.Second); read().Rotations < start.Rotations+2; {
		if time.Now().After(deadline) {
			t.Fatalf("rotations went from %d to %d in 10s with --every 1s", start.Rotations, read().Rotations)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The rotator keeps the socket census current, as the daemon would.
	if st := read(); !st.Census.Trusted || st.Census.Passes < 2 {
		t.Errorf("census beside the rotator: %+v, want current", st.Census)
	}
	// A second rotator finds the census taken, runs without it, and
	// takes it over when the first stops.
	second, secondOut, stderr, secondDone := startRotator(t, root)
	go io.Copy(io.Discard, secondOut)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	waitLine := func(want string, within time.Duration) {
		t.Helper()
		timeout := time.After(within)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the second rotator closed its stderr before saying %q", want)
				}
				if strings.Contains(l, want) {
					return
				}
			case <-timeout:
				t.Fatalf("the second rotator did not say %q within %s", want, within)
			}
		}
	}
	waitLine("another process", 5*time.Second)
	rotator.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Errorf("the rotator exited with %v on SIGTERM", err)
	}
	done <- nil // for the cleanup
	waitLine("note: socket census taken", shield.CensusRetryEvery+5*time.Second)
	if st := read(); !st.Census.Trusted {
		t.Errorf("census once the second rotator took it: %+v, want current", st.Census)
	}
	second.Process.Signal(syscall.SIGTERM)
	if err := <-secondDone; err != nil {
		t.Errorf("the second rotator exited with %v on SIGTERM", err)
	}
	secondDone <- nil // for the cleanup
	if st := read(); st.Census.Trusted {
		t.Errorf("census after the rotators stopped: %+v, want out of date", st.Census)
	}
}

// TestSynProtectSaysWhatItDid checks what `moat syn protect` tells an
// operator beside doing it: that nothing is attached yet, and the
// threshold auto mode keeps when it differs from the one asked for.
func TestSynProtectSaysWhatItDid(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	r := mustRun(t, root, "syn", "protect", "tcp/443", "--mode", "auto", "--threshold", "5")
	kept := syncookie.StoredThreshold(5)
	for _, want := range []string{"attached to no interface", fmt.Sprintf("threshold of 5/s is kept as %d/s", kept)} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	var st struct {
		Ports []syncookie.PortStatus `json:"ports"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, root, "syn", "status", "--json").stdout), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Ports) != 1 || st.Ports[0].ThresholdPerSec != kept {
		t.Errorf("status after the note: %+v, want tcp/443 at %d/s", st.Ports, kept)
	}
	// A default threshold that the CPUs divide evenly needs no note.
	r = mustRun(t, root, "syn", "protect", "tcp/80", "--mode", "auto")
	if strings.Contains(r.stderr, "kept as") != (syncookie.StoredThreshold(0) != syncookie.DefaultThreshold) {
		t.Errorf("note on the default threshold (%d kept as %d):\n%s", syncookie.DefaultThreshold, syncookie.StoredThreshold(0), r.stderr)
	}
}

// TestSynUnprotectNotProtected: turning off a port that was never
// protected says so and changes nothing, not even the keys.
func TestSynUnprotectNotProtected(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	mustRun(t, root, "syn", "protect", "tcp/443", "--mode", "never")
	status := func() string {
		var st struct {
			Rotations uint64                 `json:"key_rotations"`
			Ports     []syncookie.PortStatus `json:"ports"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, root, "syn", "status", "--json").stdout), &st); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%+v", st)
	}
	before := status()
	r := mustRun(t, root, "syn", "protect", "tcp/8443", "--mode", "off")
	if !strings.Contains(r.stderr, "note: tcp/8443 was not protected") || strings.Contains(r.stdout, "tcp/8443: off") {
		t.Errorf("unprotecting tcp/8443 said:\n%s%s", r.stdout, r.stderr)
	}
	if after := status(); after != before {
		t.Errorf("syn status changed:\n%s\n->\n%s", before, after)
	}
	r = mustRun(t, root, "syn", "protect", "tcp/443", "--mode", "off")
	if !strings.Contains(r.stdout, "tcp/443: off") || strings.Contains(r.stderr, "was not protected") {
		t.Errorf("unprotecting tcp/443 said:\n%s%s", r.stdout, r.stderr)
	}
}
