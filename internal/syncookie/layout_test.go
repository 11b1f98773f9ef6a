package syncookie

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/moat-shield/moat/internal/datapath"
)

// TestSynPortLayout guards what ProtectedPorts assumes of syn_ports
// values: read as raw bytes of the struct's size, with the mode first.
func TestSynPortLayout(t *testing.T) {
	var p datapath.MoatSynPort
	if n := binary.Size(p); n != int(unsafe.Sizeof(p)) || n != len(rawSynPort{}) {
		t.Fatalf("MoatSynPort: %d bytes encoded, %d in memory, raw %d", n, unsafe.Sizeof(p), len(rawSynPort{}))
	}
	if off := unsafe.Offsetof(p.Mode); off != 0 {
		t.Fatalf("mode at offset %d, want 0", off)
	}
}
