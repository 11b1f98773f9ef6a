package bench

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestRequestFailureKinds runs request against loopback servers that fail
// in each way a bench request can, and checks the kind it is counted as.
func TestRequestFailureKinds(t *testing.T) {
	serve := func(t *testing.T, handle func(net.Conn)) string {
		t.Helper()
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go handle(c)
			}
		}()
		return ln.Addr().String()
	}
	reply := func(text string) func(net.Conn) {
		return func(c net.Conn) {
			defer c.Close()
			buf := make([]byte, 512)
			c.Read(buf)
			io.WriteString(c, text)
		}
	}
	closed := func(t *testing.T) string {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}

	cases := []struct {
		name   string
		target func(t *testing.T) string
		want   string // "" for success
	}{
		{"answered", func(t *testing.T) string { return serve(t, reply("HTTP/1.0 200 OK\r\n\r\nmoat bench: ok\n")) }, ""},
		{"nobody listens", closed, "connect refused"},
		{"closed without a reply", func(t *testing.T) string { return serve(t, reply("")) }, "reply closed early"},
		{"reset", func(t *testing.T) string {
			return serve(t, func(c net.Conn) {
				buf := make([]byte, 512)
				c.Read(buf)
				c.(*net.TCPConn).SetLinger(0) // close with a RST
				c.Close()
			})
		}, "reply reset"},
		{"another status", func(t *testing.T) string { return serve(t, reply("HTTP/1.0 503 Busy\r\n\r\n")) }, "reply status not 200"},
		{"another body", func(t *testing.T) string { return serve(t, reply("HTTP/1.0 200 OK\r\n\r\nsomething else\n")) }, "reply wrong body"},
		{"no reply in time", func(t *testing.T) string {
			return serve(t, func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })
		}, "reply timed out"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			total, connect, err := request(tc.target(t))
			if tc.want == "" {
				if err != nil || connect <= 0 || total < connect {
					t.Fatalf("request: total %v ms, connect %v ms, err %v; want an answer", total, connect, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("request succeeded, want %q", tc.want)
			}
			if got := failureKind(err); got != tc.want {
				t.Errorf("failure %v counted as %q, want %q", err, got, tc.want)
			}
		})
	}
}

// TestDialTimeoutKind: a connect that runs out of time (its SYN lost, say)
// counts as timed out, as a read that does.
func TestDialTimeoutKind(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{Deadline: time.Now().Add(-time.Second)}
	_, err = d.Dial("tcp4", ln.Addr().String())
	if err == nil {
		t.Fatal("dial past its deadline succeeded")
	}
	if got := failureKind(&requestError{"connect", err}); got != "connect timed out" {
		t.Errorf("%v counted as %q", err, got)
	}
}

func TestFailuresText(t *testing.T) {
	if got := failuresText(nil); got != "none" {
		t.Errorf("no failures: %q", got)
	}
	got := failuresText(map[string]int{"reply timed out": 2, "connect timed out": 5, "connect refused": 2})
	if want := "connect timed out 5, connect refused 2, reply timed out 2"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := failedNote(map[string]int{"connect timed out": 1}); got != " (failed: connect timed out 1)" {
		t.Errorf("failedNote: %q", got)
	}
	if got := failedNote(nil); got != "" {
		t.Errorf("failedNote of none: %q", got)
	}
}

// TestLegitReportCountsFailures: the denied-flood comparison sums each
// point's failed requests over its rounds and shows them in its table.
func TestLegitReportCountsFailures(t *testing.T) {
	res := &LegitResult{Points: []*LegitPoint{
		{Defence: "kernel", Placement: placeSharedLink, Fraction: 1, Rounds: []LegitRound{
			{Round: 1, Attempts: 400, OK: 390, P50ms: 1, P99ms: 9, Failures: map[string]int{"connect timed out": 10}},
			{Round: 2, Attempts: 400, OK: 395, P50ms: 1, P99ms: 8, Failures: map[string]int{"connect timed out": 4, "reply reset": 1}},
		}},
		{Defence: "moat", Placement: placeSharedLink, Fraction: 1, Rounds: []LegitRound{
			{Round: 1, Attempts: 400, OK: 400, P50ms: 1, P99ms: 2},
		}},
	}}
	summarizeLegit(res)
	if got := res.Points[0].Failures; got["connect timed out"] != 14 || got["reply reset"] != 1 || len(got) != 2 {
		t.Errorf("kernel's failures summed: %v", got)
	}
	if res.Points[1].Failures != nil {
		t.Errorf("moat's failures: %v, want none", res.Points[1].Failures)
	}
	var md strings.Builder
	legitMarkdown(&md, res)
	for _, want := range []string{
		"| failed requests, all rounds |",
		"| kernel | ", "| connect timed out 14, reply reset 1 |",
		"| moat | ", "| none |",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("section 4 lacks %q:\n%s", want, md.String())
		}
	}
}

// TestClientsRefuseNoWorkers: clients with no worker (or no rate) would
// offer requests nobody takes; they refuse before offering any.
func TestClientsRefuseNoWorkers(t *testing.T) {
	for _, cfg := range []Config{{LegitWorkers: 0, LegitRate: 200}, {LegitWorkers: 64, LegitRate: 0}} {
		b := &Bench{cfg: cfg}
		if _, offered, err := b.clients(context.Background(), placement{}); err == nil || offered != 0 {
			t.Errorf("%d workers at %d/s: offered %d, error %v; want a refusal", cfg.LegitWorkers, cfg.LegitRate, offered, err)
		}
	}
}

func TestAddFailures(t *testing.T) {
	if got := addFailures(nil, nil); got != nil {
		t.Errorf("nothing added to nothing: %v", got)
	}
	got := addFailures(nil, map[string]int{"connect timed out": 2})
	got = addFailures(got, map[string]int{"connect timed out": 1, "reply reset": 1})
	if len(got) != 2 || got["connect timed out"] != 3 || got["reply reset"] != 1 {
		t.Errorf("sum: %v", got)
	}
}
