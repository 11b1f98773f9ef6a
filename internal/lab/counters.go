package lab

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// NetCounters reads the protocol counters of the calling thread's network
// namespace from /proc/net/snmp and /proc/net/netstat, keyed "Group.Name"
// (Tcp.PassiveOpens, TcpExt.ListenOverflows). Both files pair a line of
// names with a line of values per group. /proc/self/net follows the
// process's main thread, so the thread-self path is the one that sees a
// namespace entered with Host.Do.
func NetCounters() (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, f := range []string{"snmp", "netstat"} {
		b, err := os.ReadFile("/proc/thread-self/net/" + f)
		if err != nil {
			return nil, err
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			if len(names) == 0 || len(names) != len(values) || names[0] != values[0] {
				return nil, fmt.Errorf("/proc/net/%s: names and values do not pair at line %d", f, i+1)
			}
			group := strings.TrimSuffix(names[0], ":")
			for j := 1; j < len(names); j++ {
				v, _ := strconv.ParseInt(values[j], 10, 64) // a few are signed
				out[group+"."+names[j]] = uint64(v)
			}
		}
	}
	return out, nil
}
