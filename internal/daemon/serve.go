package daemon

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-shield/moat/internal/config"
	"github.com/moat-shield/moat/internal/feed"
	"github.com/moat-shield/moat/internal/metrics"
)

// listenMetrics opens the metrics listener, or none if metrics are off.
// The daemon opens it before it applies anything, so that an address it
// cannot take refuses the start while nothing has changed.
func listenMetrics(cfg *config.Config) (net.Listener, error) {
	if !cfg.Metrics.On() {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.Metrics.Address)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return ln, nil
}

// serveMetrics serves the Prometheus exposition on ln. The collector
// reads the pinned maps without the state lock, so a scrape never waits
// for a change.
func (d *Daemon) serveMetrics(ln net.Listener, cfg *config.Config) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(metrics.Config{Root: d.root, TopEntries: cfg.Metrics.TopEntries, Logger: d.log,
		Extra: []prometheus.Collector{feed.NewCollector(d.FeedStatus)}}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	d.log.Info("serving metrics", "address", "http://"+ln.Addr().String()+"/metrics")
	return srv
}

// notify tells systemd about the daemon's state (sd_notify): a datagram to
// the unix socket named by $NOTIFY_SOCKET, where a leading @ names an
// abstract socket. Without the variable, nobody listens: nothing to do.
func notify(msg string) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return
	}
	if strings.HasPrefix(path, "@") {
		path = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return
	}
	defer c.Close()
	c.Write([]byte(msg))
}

// listenShare opens the share listener, or none if nothing is shared. A
// certificate that does not load refuses the start, as a metrics address
// that cannot be taken does.
func listenShare(sh config.Share) (net.Listener, error) {
	if !sh.On() {
		return nil, nil
	}
	if sh.TokenFile != "" {
		if _, err := feed.ReadToken(sh.TokenFile); err != nil {
			return nil, fmt.Errorf("share: %w", err)
		}
	}
	var tc *tls.Config
	if sh.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(sh.CertFile, sh.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("share: %w", err)
		}
		tc = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", sh.Address)
	if err != nil {
		return nil, fmt.Errorf("share: %w", err)
	}
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	return ln, nil
}

// serveShare publishes the rules this host made at run time on ln, for
// the feeds of other hosts: GET /v1/share (the deny list) or
// /v1/share?list=allow (if share.allow_list), as the JSON `moat export`
// writes, with expiries. Only rules that started here are shared (rules
// added through the CLI and API, and if share.auto_blocks the rate
// limits' auto-blocks); the config's own rules and what feeds brought
// are not, so hosts that pull from each other never pass an entry round
// in a loop, and an entry leaves the fleet when it leaves the host it
// started on.
func (d *Daemon) serveShare(ln net.Listener, sh config.Share) *http.Server {
	sc := &shareCache{d: d, autoBlocks: sh.AutoBlocks}
	if sh.CertFile == "" && sh.TokenFile != "" && !isLoopback(ln.Addr()) {
		d.log.Warn("share: the bearer token travels in clear over http; set share.cert_file and share.key_file to serve https", "address", ln.Addr().String())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/share", func(w http.ResponseWriter, r *http.Request) {
		if sh.TokenFile != "" {
			want, err := feed.ReadToken(sh.TokenFile)
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if err != nil || !ok || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
				if err != nil {
					d.log.Error("share: the token file cannot be read; every request is refused", "err", err)
				}
				w.Header().Set("WWW-Authenticate", "Bearer")
				http.Error(w, "a bearer token is needed", http.StatusUnauthorized)
				return
			}
		}
		list := r.URL.Query().Get("list")
		switch {
		case list == "":
			list = "deny"
		case list == "allow" && !sh.AllowList:
			http.Error(w, "this host does not share its allow list (share.allow_list)", http.StatusForbidden)
			return
		case list != "allow" && list != "deny":
			http.Error(w, "invalid list: want deny or allow", http.StatusBadRequest)
			return
		}
		body, etag, err := sc.get(list)
		if err != nil {
			d.log.Error("share: reading the rules failed", "err", err)
			http.Error(w, "reading the rules failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("ETag", etag)
		w.Header().Set("Cache-Control", "no-cache")
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	scheme := "http"
	if sh.CertFile != "" {
		scheme = "https"
	}
	d.log.Info("sharing run-time rules", "address", scheme+"://"+ln.Addr().String()+"/v1/share")
	return srv
}

// shareCache keeps the last body it built: many hosts pulling at once
// cost one build, not one each. A body lasts a second, or twenty times
// what building it took (a million auto-blocks read from the maps), so
// the share seldom keeps the daemon busy more than a twentieth of the
// time; never more than 10 s, as a build that waited for a reload would
// otherwise hold back blocks for long.
type shareCache struct {
	d          *Daemon
	autoBlocks bool
	mu         sync.Mutex
	until      map[string]time.Time
	by         map[string][]byte
}

func (sc *shareCache) get(list string) (body []byte, etag string, err error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.by == nil {
		sc.until, sc.by = map[string]time.Time{}, map[string][]byte{}
	}
	if now := time.Now(); now.After(sc.until[list]) {
		rs, err := sc.d.shared(list, sc.autoBlocks)
		if err != nil {
			return nil, "", err
		}
		if sc.by[list], err = json.MarshalIndent(rs, "", "  "); err != nil {
			return nil, "", err
		}
		sc.until[list] = time.Now().Add(min(10*time.Second, max(time.Second, 20*time.Since(now))))
	}
	sum := sha256.Sum256(sc.by[list])
	return sc.by[list], `"` + hex.EncodeToString(sum[:16]) + `"`, nil
}

// isLoopback tells whether a listener's address is a loopback one.
func isLoopback(a net.Addr) bool {
	ap, err := netip.ParseAddrPort(a.String())
	return err == nil && ap.Addr().IsLoopback()
}
