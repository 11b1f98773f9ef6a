package cli_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/cli"
	"github.com/moat-shield/moat/internal/shield"
)

// moatBin is the moat binary built once for the integration tests.
var moatBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "moat-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	moatBin = filepath.Join(dir, "moat")
	build := exec.Command("go", "build", "-o", moatBin, "github.com/moat-shield/moat/cmd/moat")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build moat: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// bpffsDir is where every test root lives; shield.Open wants its parent on
// bpffs.
const bpffsDir = "/sys/fs/bpf"

// newRoot returns a pin directory unique to the test, not yet created, and
// removes it (which unpins links and so detaches programs) when the test
// ends, together with shield's lock file for it.
func newRoot(t testing.TB) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(bpffsDir, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		if err := unix.Mount("bpf", bpffsDir, "bpf", 0, "mode=0700"); err != nil {
			t.Skipf("no bpffs at %s: %v", bpffsDir, err)
		}
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	base := "moat-test-" + hex.EncodeToString(rnd[:])
	root := filepath.Join(bpffsDir, base)
	t.Cleanup(func() {
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("remove %s: %v", root, err)
		}
		// shield.Open keeps a lock file per root in /run; the random base
		// name makes the pattern match this test's file only.
		locks, _ := filepath.Glob("/run/moat-*" + base + "*.lock")
		for _, l := range locks {
			os.Remove(l)
		}
	})
	return root
}

// result is what one in-process run of the command line produced.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runMain runs the command line in this process with --root.
func runMain(root string, args ...string) result {
	var out, errb bytes.Buffer
	code := cli.Main(append(append([]string{}, args...), "--root", root), &out, &errb)
	return result{code, out.String(), errb.String()}
}

// mustRun runs the command line in this process and fails the test unless
// it succeeds.
func mustRun(t testing.TB, root string, args ...string) result {
	t.Helper()
	r := runMain(root, args...)
	if r.code != 0 {
		t.Fatalf("moat %s: %v", strings.Join(args, " "), r)
	}
	return r
}

// pinnedState describes everything under root: the rules as Snapshot sees
// them, the attachments, and the names of the pins. It is "" when root
// does not exist.
func pinnedState(t testing.TB, root string) string {
	t.Helper()
	if _, err := os.Stat(root); errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	var pins []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		pins = append(pins, strings.TrimPrefix(p, root))
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	sort.Strings(pins)
	s, err := shield.Open(root)
	if err != nil {
		t.Fatalf("open %s: %v", root, err)
	}
	defer s.Close()
	rs, err := s.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	atts, err := s.Attachments()
	if err != nil {
		t.Fatalf("attachments: %v", err)
	}
	data, err := json.MarshalIndent(struct {
		Pins        []string
		Rules       any
		Attachments []shield.Attachment
	}{pins, rs, atts}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// checkUsageError asserts the contract of a refused command: exit status 2,
// one line on stderr that starts with "moat: ", and nothing on stdout.
func checkUsageError(t testing.TB, r result, errPart string) {
	t.Helper()
	if r.code != 2 {
		t.Errorf("exit status %d, want 2\n%v", r.code, r)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "moat: ") || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("stderr is not one line starting with \"moat: \":\n%q", r.stderr)
	}
	if errPart != "" && !strings.Contains(r.stderr, errPart) {
		t.Errorf("stderr %q does not mention %q", r.stderr, errPart)
	}
	if r.stdout != "" {
		t.Errorf("a refused command wrote to stdout (did it change something?):\n%s", r.stdout)
	}
}
