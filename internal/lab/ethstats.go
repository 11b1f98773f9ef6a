package lab

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// SumEthtoolStats sums the counters of `ethtool -S` output whose names
// have the given prefix and suffix: a veth keeps one per queue
// (rx_queue_0_xdp_drops, tx_queue_1_xdp_xmit_errors, ...). It is an error
// when none has them.
func SumEthtoolStats(out []byte, prefix, suffix string) (uint64, error) {
	var total uint64
	found := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		name, val, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, suffix) {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("ethtool -S: %q: %w", sc.Text(), err)
		}
		total += n
		found = true
	}
	if !found {
		return 0, fmt.Errorf("ethtool -S shows no %s*%s counter", prefix, suffix)
	}
	return total, nil
}
