package daemon_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFigures measures the daemon's memory with a million rules loaded and
// the time of a reload that changes 100,000 of them. It takes a minute, so
// it runs only with MOAT_DAEMON_FIGURES=1:
//
//	MOAT_DAEMON_FIGURES=1 go test -run TestFigures -v ./internal/daemon/
func TestFigures(t *testing.T) {
	if os.Getenv("MOAT_DAEMON_FIGURES") != "1" {
		t.Skip("set MOAT_DAEMON_FIGURES=1 to measure")
	}
	e := newEnv(t)
	e.startWait = 5 * time.Minute
	const total, change = 1_000_000, 100_000
	// a.list: 1M hosts from 10.0.0.0; b.list: the same less the first
	// 100,000, plus 100,000 new ones from 11.0.0.0.
	writeHosts(t, filepath.Join(e.dir, "a.list"), netip.MustParseAddr("10.0.0.0"), total)
	var b strings.Builder
	a := netip.MustParseAddr("10.0.0.0")
	for i := range total {
		if i >= change {
			b.WriteString(a.String() + "\n")
		}
		a = a.Next()
	}
	a = netip.MustParseAddr("11.0.0.0")
	for range change {
		b.WriteString(a.String() + "\n")
		a = a.Next()
	}
	os.WriteFile(filepath.Join(e.dir, "b.list"), []byte(b.String()), 0o600)

	cfg := func(list string) string {
		return fmt.Sprintf("interfaces:\n  - name: %s\nlists:\n  - file: %s\n", e.attackerIf(), list)
	}
	e.writeConfig(cfg("a.list"))
	t0 := time.Now()
	e.start()
	t.Logf("start with %d rules: %s wall, %s CPU", total, time.Since(t0).Round(time.Millisecond), cpuTime(t, e.daemon.Process.Pid))
	time.Sleep(2 * time.Second)
	t.Logf("daemon memory with %d rules loaded: %s", total, rss(t, e.daemon.Process.Pid))

	e.writeConfig(cfg("b.list"))
	cpu0 := cpuTime(t, e.daemon.Process.Pid)
	t0 = time.Now()
	r := e.mustMoat("reload")
	t.Logf("reload changing %d of %d rules (%d added, %d removed): %s wall; %s", change, total, change, change,
		time.Since(t0).Round(time.Millisecond), strings.TrimSpace(r.stdout))
	t.Logf("daemon CPU time (user+system) of the reload: %s; load average: %s", cpuTime(t, e.daemon.Process.Pid)-cpu0, loadavg())
	for _, l := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(l, "msg=apply") || strings.Contains(l, "msg=\"reload:") {
			t.Log(l)
		}
	}
	time.Sleep(2 * time.Second)
	t.Logf("daemon memory after the reload: %s", rss(t, e.daemon.Process.Pid))
}

func rss(t *testing.T, pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "VmRSS") || strings.HasPrefix(l, "VmHWM") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}

// cpuTime is the user and system time a process has used.
func cpuTime(t *testing.T, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th, in clock ticks (100 per second).
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// TestFeedFigures measures a feed of a million hosts: the daemon's start
// and memory with it, what an unchanged refresh costs (a 304), and the
// apply of a copy that changes 100,000 of them. Like TestFigures, it runs
// only with MOAT_DAEMON_FIGURES=1:
//
//	MOAT_DAEMON_FIGURES=1 go test -run TestFeedFigures -v ./internal/daemon/
func TestFeedFigures(t *testing.T) {
	if os.Getenv("MOAT_DAEMON_FIGURES") != "1" {
		t.Skip("set MOAT_DAEMON_FIGURES=1 to measure")
	}
	e := newEnv(t)
	e.startWait = 5 * time.Minute
	const total, change = 1_000_000, 100_000
	hosts := func(from netip.Addr, n int, b *strings.Builder) {
		for range n {
			b.WriteString(from.String() + "\n")
			from = from.Next()
		}
	}
	var a, b strings.Builder
	hosts(netip.MustParseAddr("10.0.0.0"), total, &a)
	hosts(netip.MustParseAddr("10.1.134.160"), total-change, &b) // 10.0.0.0 + 100,000
	hosts(netip.MustParseAddr("11.0.0.0"), change, &b)
	var mu sync.Mutex
	body, etag := a.String(), `"a"`
	var notModified int
	base := serveInLab(t, e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			notModified++
			w.WriteHeader(http.StatusNotModified)
			return
		}
		fmt.Fprint(w, body)
	}))
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\nlists:\n  - url: %s/hosts.txt\n    refresh: 1s\n", e.attackerIf(), base))
	applied := func() int { return strings.Count(e.log.String(), `msg="feed applied"`) }
	waitApplied := func(n int) {
		deadline := time.Now().Add(5 * time.Minute)
		for applied() < n {
			if time.Now().After(deadline) {
				t.Fatalf("feed not applied %d times:\n%s", n, e.log)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t0 := time.Now()
	e.start()
	waitApplied(1)
	t.Logf("start, then the first copy of a %d-host feed (%d MiB) fetched and applied: %s wall, %s CPU", total, len(body)>>20,
		time.Since(t0).Round(time.Millisecond), cpuTime(t, e.daemon.Process.Pid))
	time.Sleep(2 * time.Second)
	t.Logf("daemon memory with the feed applied: %s", rss(t, e.daemon.Process.Pid))

	mu.Lock()
	n0 := notModified
	mu.Unlock()
	cpu0 := cpuTime(t, e.daemon.Process.Pid)
	time.Sleep(10 * time.Second)
	mu.Lock()
	n1 := notModified
	mu.Unlock()
	t.Logf("unchanged: %d refreshes answered 304 in 10 s, daemon CPU %s", n1-n0, cpuTime(t, e.daemon.Process.Pid)-cpu0)

	cpu0 = cpuTime(t, e.daemon.Process.Pid)
	t0 = time.Now()
	mu.Lock()
	body, etag = b.String(), `"b"`
	mu.Unlock()
	waitApplied(2)
	t.Logf("a copy changing %d of %d hosts: applied %s after it was served (refresh 1 s), daemon CPU %s; load average %s",
		change, total, time.Since(t0).Round(time.Millisecond), cpuTime(t, e.daemon.Process.Pid)-cpu0, loadavg())
	for _, l := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(l, `msg="feed applied"`) {
			t.Log(l)
		}
	}
	time.Sleep(2 * time.Second)
	t.Logf("daemon memory after the change: %s", rss(t, e.daemon.Process.Pid))
	if r := e.rulesNow(); len(r) != total {
		t.Errorf("%d rules after the change, want %d", len(r), total)
	}
}
