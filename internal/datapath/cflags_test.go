package datapath

import (
	"os"
	"strings"
	"testing"
)

// TestObjectsBuiltWithoutStrictAliasing: the BPF C reads headers built in
// structs as 32-bit words to sum them (csum_words in syncookie.h). Under
// strict aliasing clang may drop a store it takes for dead before such a
// read, and the verifier lets a privileged program read stack it never
// wrote: the SYN-ACK's IPv4 checksum summed a stale field and came out
// wrong now and then. Every object is built with -fno-strict-aliasing, as
// the kernel is.
func TestObjectsBuiltWithoutStrictAliasing(t *testing.T) {
	for _, gen := range []string{"gen.go", "../flood/gen.go"} {
		b, err := os.ReadFile(gen)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "//go:generate") && strings.Contains(line, "bpf2go") &&
				!strings.Contains(line, "-fno-strict-aliasing") {
				t.Errorf("%s: bpf2go runs without -fno-strict-aliasing:\n%s", gen, line)
			}
		}
	}
}
