// Package daemon is `moat run`: it attaches moat to the configured
// interfaces, keeps the rules equal to the config file plus the rules added
// at run time (persisted in the state file), runs the periodic work (expiry
// of timed rules, SYN cookie key rotation, flood detection for the logs)
// and serves the local API that the CLI uses.
//
// The daemon is the single writer of the pinned state while it runs: every
// change, from the API, a reload or a timer, runs under one mutex. It opens
// the pinned state (and so takes shield's lock) only for the length of each
// change, so that read-only commands and commands that bypass the daemon
// never wait for more than one change. Stopping or killing the daemon
// leaves every pin in place: protection does not depend on the process.
package daemon

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/config"
	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/feed"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/state"
	"github.com/moat-shield/moat/internal/syncookie"
)

// releaseMemory gives the memory of a load back to the system. Two
// collections: buffers kept in a sync.Pool survive the first one.
func releaseMemory() {
	runtime.GC()
	debug.FreeOSMemory()
}

// loadGCPercent is the GOGC of the daemon while it loads a config.
const loadGCPercent = 25

var gcLow struct {
	sync.Mutex
	holders int
	saved   int
}

// lowerGC sets GOGC to loadGCPercent until the returned function is
// called; a reload and a feed's apply may overlap, and the value before
// the first comes back after the last.
func lowerGC() (restore func()) {
	gcLow.Lock()
	if gcLow.holders == 0 {
		gcLow.saved = debug.SetGCPercent(loadGCPercent)
	}
	gcLow.holders++
	gcLow.Unlock()
	return func() {
		gcLow.Lock()
		if gcLow.holders--; gcLow.holders == 0 {
			debug.SetGCPercent(gcLow.saved)
		}
		gcLow.Unlock()
	}
}

// Options configure Run.
type Options struct {
	ConfigPath string
	// Root overrides the config's daemon.bpffs_root (tests, --root).
	Root string
	// Logger overrides the logger the config describes.
	Logger *slog.Logger
}

// Daemon is a running moat daemon.
type Daemon struct {
	mu sync.Mutex // serialises every change to the pinned state and the state file
	// reloadMu makes reloads one at a time, from the read of the config
	// to its apply (which takes mu): the config is read without mu, and
	// a reload that read the file before another must not apply after
	// it, leaving the maps on an older config than the file's.
	reloadMu sync.Mutex

	opts     Options
	cfg      *config.Config // the config applied last
	root     string
	st       *state.State
	log      *slog.Logger
	logLevel *slog.LevelVar

	started    time.Time
	lastReload time.Time
	reloads    int

	flooding map[uint16]bool // SYN flood state per port as last sampled

	feeds *feedSet // the applied config's feeds
	// feedsNow is feeds for the readers that must not wait for mu, which
	// a reload or a heal holds for seconds: a scrape of the metrics
	// (which read no state of the daemon's but this), `moat feeds`.
	feedsNow   atomic.Pointer[feedSet]
	feedRunner *feedRunner
	// cfgSet is the applied config's rules (inline and rule files),
	// kept while it names feeds: a feed's change is merged with the
	// rules as they were applied, not with rule files as they are on
	// disk now (half written, or edited without a reload).
	cfgSet *config.Set

	// The rate limits' auto-blocks, as Expire last saw them: the
	// blocks the limits had counted then, when that scan ran (zero: not
	// yet), and when the first auto-block it left expires (zero: none).
	// A scan reads the whole denylist, so Expire scans only when a limit
	// has blocked since, or an auto-block left is due, and at most once
	// per autoScanEvery: the data path ignores an expired entry anyway.
	autoBlocks     uint64
	autoScanned    time.Time
	autoNextExpiry time.Time

	// periods hears of a reload that changed the timers' periods
	// (expiry, key rotation, sampling), whichever way it came (SIGHUP or
	// the API): the main loop resets its tickers.
	periods chan struct{}

	// heal is healAcceptors' memory of the interfaces it could not
	// mend (main loop only, under mu).
	heal map[string]healState
}

// Run runs the daemon until ctx is cancelled. SIGHUP reloads the config.
// It returns an error if the first config cannot be applied.
func Run(ctx context.Context, opts Options) error {
	// From the start: SIGHUP's default action would kill a daemon that is
	// still loading. A reload asked for meanwhile runs once it is ready.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// Reloads read the same file whatever the working directory becomes.
	if abs, err := filepath.Abs(opts.ConfigPath); err == nil {
		opts.ConfigPath = abs
	}
	cfg, set, err := config.Load(opts.ConfigPath)
	if err != nil {
		return err
	}
	d := &Daemon{opts: opts, cfg: cfg, started: time.Now(), flooding: map[uint16]bool{}, logLevel: new(slog.LevelVar),
		periods: make(chan struct{}, 1)}
	d.root = cfg.Daemon.BPFRoot
	if opts.Root != "" {
		d.root = opts.Root
	}
	d.log = opts.Logger
	if d.log == nil {
		d.log = newLogger(cfg, d.logLevel)
	}
	setLevel(d.logLevel, cfg.Daemon.LogLevel)
	lock, err := lockDaemon(d.root, cfg.Daemon.Socket)
	if err != nil {
		return err
	}
	defer lock.Close()
	if d.st, err = state.Load(cfg.Daemon.StateFile); err != nil {
		return err
	}
	d.log.Info("starting", "config", opts.ConfigPath, "root", d.root, "state", cfg.Daemon.StateFile, "pid", os.Getpid())

	ln, err := listen(cfg.Daemon.Socket)
	if err != nil {
		return err
	}
	defer func() {
		ln.Close()
		if fi, err := os.Lstat(cfg.Daemon.Socket); err == nil && fi.Mode()&os.ModeSocket != 0 {
			os.Remove(cfg.Daemon.Socket)
		}
	}()
	metricsLn, err := listenMetrics(cfg)
	if err != nil {
		return err
	}
	if metricsLn != nil {
		defer metricsLn.Close()
	}
	shareLn, err := listenShare(cfg.Share)
	if err != nil {
		return err
	}
	if shareLn != nil {
		defer shareLn.Close()
	}

	start := time.Now()
	// A start refused on a host where moat kept no state leaves none: the
	// maps it pinned on the way go with it.
	_, statErr := os.Stat(d.root)
	fresh := errors.Is(statErr, os.ErrNotExist)
	// A million rules pass through several copies while they are loaded;
	// collecting more often keeps the peak near the live size.
	restoreGC := lowerGC()
	d.mu.Lock()
	var ch Changes
	fs, err := d.openFeeds(cfg, nil)
	if err == nil {
		err = d.withShield(func(s *shield.Shield) (err error) {
			ch, err = d.applyDiff(s, nil, cfg, set, fs)
			return err
		})
	}
	if err == nil {
		d.dropShadowed(ch.applied)
		d.feeds = fs
		d.feedsNow.Store(fs)
		d.keepSet(cfg, set)
	}
	if err == nil {
		// Timed rules that expired meanwhile go at the first expiry run,
		// from the maps and the state file together.
		err = state.Save(cfg.Daemon.StateFile, d.st)
	}
	d.lastReload = time.Now()
	d.mu.Unlock()
	set = nil
	restoreGC()
	releaseMemory() // the rule lists were only needed to write the maps
	if err != nil {
		if fresh {
			if rmErr := os.RemoveAll(d.root); rmErr != nil {
				d.log.Error("remove the state of the refused start", "root", d.root, "err", rmErr)
			}
		}
		return err
	}
	d.log.Info("ready", "took", time.Since(start).Round(time.Millisecond), "socket", cfg.Daemon.Socket,
		"rules_written", ch.Added, "rules_removed", ch.Removed, "port_rules", ch.PortRules,
		"dynamic_rules", len(d.st.Allow)+len(d.st.Deny)+len(d.st.Ports))

	// The feeds' loops start before the API serves (a reload through it
	// syncs them) and stop after it is closed (deferred first).
	runner := &feedRunner{d: d, ctx: ctx, cancel: map[*feed.Feed]context.CancelFunc{}}
	d.mu.Lock()
	d.feedRunner = runner
	runner.sync(d.feeds)
	d.mu.Unlock()
	defer runner.stop()

	srv := &http.Server{Handler: d.api(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer func() {
		// A change under way through the API (`moat reload`, `moat
		// block`) ends and answers before the daemon does: the process
		// ends when Run returns, which cut such a change short, with the
		// maps half changed, the state file not saved and the caller
		// told only EOF. New requests are refused meanwhile.
		ctx, cancel := context.WithTimeout(context.Background(), apiStopWait)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			d.log.Error("stopping: a request through the API did not end in time; cut short", "waited", apiStopWait)
			srv.Close()
		}
	}()

	if metricsLn != nil {
		metricsSrv := d.serveMetrics(metricsLn, cfg)
		defer metricsSrv.Close()
	}
	if shareLn != nil {
		shareSrv := d.serveShare(shareLn, cfg.Share)
		defer shareSrv.Close()
	}

	// Without the census (another process takes it, a kernel without TCP
	// socket iterators) every SYN and ACK of a protected port pays the
	// socket lookup: slower, not wrong. The daemon tries again until it
	// can, so it takes over from a rotator that held the census.
	census := shield.HoldCensus(d.startCensus, func(err error) {
		if err != nil {
			d.log.Error("socket census: SYNs and ACKs of protected ports pay a socket lookup each; trying again", "every", shield.CensusRetryEvery, "err", err)
		} else {
			d.log.Info("socket census taken")
		}
	})
	defer census.Stop()

	notify("READY=1\nSTATUS=protecting")

	d.mu.Lock()
	c := d.cfg
	d.mu.Unlock()
	expire := time.NewTicker(c.Daemon.ExpireEvery)
	rotate := time.NewTicker(c.SYN.RotateEvery)
	sample := time.NewTicker(c.Daemon.SampleEvery)
	defer expire.Stop()
	defer rotate.Stop()
	defer sample.Stop()
	for {
		select {
		case <-ctx.Done():
			notify("STOPPING=1")
			d.log.Info("stopping; the filter stays attached and the rules stay loaded")
			return nil
		case <-hup:
			notify(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", monotonicUsec()))
			d.Reload()
			notify("READY=1")
		case <-d.periods:
			d.mu.Lock()
			c := d.cfg
			d.mu.Unlock()
			expire.Reset(c.Daemon.ExpireEvery)
			rotate.Reset(c.SYN.RotateEvery)
			sample.Reset(c.Daemon.SampleEvery)
		case <-expire.C:
			d.expire()
		case <-rotate.C:
			d.rotate()
		case <-sample.C:
			d.sample()
			d.healAcceptors()
		case <-census.Retry():
			census.Take()
		}
	}
}

// apiStopWait bounds how long a stopping daemon waits for the requests
// under way through its API: well within systemd's TimeoutStopSec (20 s in
// dist/moat.service), and longer than a reload of a million entries.
const apiStopWait = 15 * time.Second

func newLogger(cfg *config.Config, level *slog.LevelVar) *slog.Logger {
	o := &slog.HandlerOptions{Level: level}
	if cfg.Daemon.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, o))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, o))
}

func setLevel(v *slog.LevelVar, name string) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(name)); err == nil {
		v.Set(l)
	}
}

// listen opens the API socket, readable and writable by root only. A
// socket left by a killed daemon is replaced; one that answers belongs to
// a running daemon and is not.
func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("API socket: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("another moat daemon is serving %s", path)
	}
	// What is left of a daemon that stopped is a socket; anything else at
	// the path is someone's file.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("API socket: %s exists and is not a socket", path)
		}
		os.Remove(path)
	}
	// The umask covers the window between bind and chmod.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("API socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("API socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	return ln, nil
}

// LockPath is the lock file a daemon holds on root for its life (see
// lockDaemon): the CLI asks it whether a daemon manages a root. A root
// reached through a symbolic link has the lock of the directory it leads
// to, so that neither a second daemon nor a command that would go round
// the daemon takes it for another root.
func LockPath(root string) (string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	abs = shield.ResolveRoot(abs)
	sum := sha256.Sum256([]byte(abs))
	return fmt.Sprintf("/run/moat-daemon-%s-%x.lock", filepath.Base(abs), sum[:4]), nil
}

// lockDaemon makes the daemon the only one on its root: two daemons would
// each remove the other's runtime rules as entries their state file lacks.
// The flock is held for the daemon's life and goes with the process, even
// killed. The lock file lives in /run beside shield's state lock and says
// which daemon holds it. It is named after the root's absolute path, which
// a daemon knows before bpffs is mounted there (an inode would change with
// the mount).
func lockDaemon(root, socket string) (*os.File, error) {
	path, err := LockPath(root)
	if err != nil {
		return nil, fmt.Errorf("lock %s for the daemon: %w", root, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s for the daemon: %w", root, err)
	}
	// The CLI takes the lock shared for a moment to ask whether a daemon
	// holds it (LockPath): a daemon starting then waits that moment out.
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	for tries := 0; errors.Is(err, unix.EWOULDBLOCK) && tries < 20; tries++ {
		time.Sleep(10 * time.Millisecond)
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		holder, _ := io.ReadAll(io.LimitReader(f, 256))
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := strings.TrimSpace(string(holder))
			if who == "" {
				who = "lock " + path
			}
			return nil, fmt.Errorf("another moat daemon manages %s (%s); stop it, or give this one another daemon.bpffs_root", root, who)
		}
		return nil, fmt.Errorf("lock %s for the daemon: %w", root, err)
	}
	// Whoever is refused reads this. A failure here costs only the name.
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "pid %d, socket %s", os.Getpid(), socket)
	}
	return f, nil
}

// withShield opens the pinned state for one change. Callers hold d.mu.
func (d *Daemon) withShield(fn func(*shield.Shield) error) error {
	s, err := shield.Open(d.root)
	if err != nil {
		return err
	}
	defer s.Close()
	for _, r := range s.Renamed {
		d.log.Warn(r)
	}
	if s.StrandedCensusTaker {
		d.log.Warn("replaced maps of an older moat (their layout changed) whose `moat syn rotate --every` still runs (it takes the socket census): "+
			"it can no longer open the state and stops at its next key rotation; stop it, this daemon rotates the keys", "root", d.root)
	}
	return fn(s)
}

// expire deletes timed rules whose time has passed, from the maps and the
// state file. Only rules added at run time have a time, so the state file
// says which to delete; reading a million-entry map every few seconds to
// find them would cost far more. The limits' auto-blocks are the
// exception (expireAutoBlocks).
func (d *Daemon) expire() {
	if _, err := d.expireRules(false); err != nil {
		d.log.Error("expire timed rules", "err", err)
	}
}

// Expire deletes the timed rules and auto-blocks whose time has passed
// now, and says how many went (`moat expire` under the daemon).
func (d *Daemon) Expire() (ExpireResult, error) { return d.expireRules(true) }

// expireRules is expire and Expire; force reads the denylist for expired
// auto-blocks even within autoScanEvery of the last read.
func (d *Daemon) expireRules(force bool) (ExpireResult, error) {
	fed := 0
	defer func() {
		if fed > 0 {
			releaseMemory() // as after a feed's change, once the lock is free
		}
	}()
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	// Feeds first: a run-time rule or auto-block that expires below
	// hands its prefix back to a feed's entry, which must not be one
	// that has expired too.
	fed, err := d.expireFeeds(now)
	if err != nil {
		// The rest expire all the same.
		d.log.Error("expire feed entries", "err", err)
	}
	auto, err := d.expireAutoBlocks(now, force)
	if err != nil {
		// The timed rules expire all the same.
		d.log.Error("expire auto-blocks", "err", err)
	}
	var due [2][]netip.Prefix
	for _, l := range []shield.List{shield.AllowList, shield.DenyList} {
		for _, e := range *d.dynamicList(l) {
			if e.Expires != nil && !e.Expires.After(now) {
				due[l] = append(due[l], e.Prefix)
			}
		}
	}
	if len(due[0])+len(due[1]) == 0 {
		return ExpireResult{Removed: fed + auto}, nil
	}
	err = d.withShield(func(s *shield.Shield) error {
		for l, prefixes := range due {
			var present []netip.Prefix
			for _, p := range prefixes {
				// An auto-block written since the rule expired is the
				// limit's now, with its own expiry: it stays.
				if e, ok, err := s.Stored(shield.List(l), p); err != nil {
					return err
				} else if ok && !e.Auto {
					present = append(present, p)
				}
			}
			// A feed's entry for the same prefix applies again.
			if err := d.dropOverFeeds(s, shield.List(l), present); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return ExpireResult{}, err
	}
	n := d.st.DropExpired(now)
	if err := state.Save(d.cfg.Daemon.StateFile, d.st); err != nil {
		d.log.Error("save state", "err", err)
	}
	d.log.Info("expired timed rules", "count", n)
	return ExpireResult{Removed: n + auto + fed}, nil
}

// autoScanEvery is how often at most Expire reads the whole denylist for
// expired auto-blocks: under a flood some limit blocks all the time.
const autoScanEvery = time.Minute

// expireAutoBlocks deletes the auto-blocks whose time has passed: the data
// path writes them and no rule of the daemon's holds them. A feed's entry
// for the same prefix applies again. It reads the denylist only when a
// limit has blocked since its last scan, or an auto-block that scan left
// has come due, and not within autoScanEvery of the last scan, unless a
// command asked (force). Called with d.mu held.
func (d *Daemon) expireAutoBlocks(now time.Time, force bool) (int, error) {
	var blocks uint64
	err := d.withShield(func(s *shield.Shield) error {
		m, err := ratelimit.NewMaps(s.Map)
		if err != nil {
			return nil // pins of a moat without rate limits: no auto-blocks
		}
		ls, err := m.Limits()
		for _, l := range ls {
			blocks += l.Stats.Blocks
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	due := !d.autoNextExpiry.IsZero() && !d.autoNextExpiry.After(now)
	scanned := !d.autoScanned.IsZero()
	if scanned && blocks == d.autoBlocks && !due {
		return 0, nil
	}
	if scanned && !force && now.Sub(d.autoScanned) < autoScanEvery {
		return 0, nil
	}
	var removed int
	var next time.Duration
	err = d.withShield(func(s *shield.Shield) error {
		stale, n, err := s.ExpiredAutoBlocks()
		if err != nil {
			return err
		}
		removed, next = len(stale), n
		return d.dropOverFeeds(s, shield.DenyList, stale)
	})
	if err != nil {
		return 0, err
	}
	d.autoBlocks, d.autoScanned, d.autoNextExpiry = blocks, now, time.Time{}
	if next > 0 {
		d.autoNextExpiry = now.Add(next)
	}
	if removed > 0 {
		d.log.Info("expired auto-blocks", "count", removed)
	}
	return removed, nil
}

// ExpireResult is what Expire removed.
type ExpireResult struct {
	Removed int `json:"removed"`
}

// startCensus takes socket census passes (syncookie.Census) every second
// until the returned function is called: they let the SYN path skip the
// socket lookup for tuples no socket owns. The first failed pass is
// logged, and so is the first that works after failures; 5 s after the
// last good pass the data path stops trusting the census and looks every
// socket up, as without it.
func (d *Daemon) startCensus() (stop func(), err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	err = d.withShield(func(s *shield.Shield) (err error) {
		stop, err = s.StartCensus(func(p syncookie.CensusPass, err error) {
			if err != nil {
				d.log.Error("socket census", "err", err)
			} else {
				d.log.Info("socket census works again", "sockets", p.Sockets)
			}
		})
		return err
	})
	return stop, err
}

// rotate installs a new SYN cookie key; cookies of the previous key stay
// valid until the next rotation.
func (d *Daemon) rotate() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rotateLocked()
}

// rotateLocked is rotate with d.mu held.
func (d *Daemon) rotateLocked() {
	err := d.withShield(func(s *shield.Shield) error {
		gen, err := syncookie.Rotate(s.Map(datapath.MoatMapSynKeys), s.Map(datapath.MoatMapSynRotation))
		if err != nil {
			return err
		}
		d.log.Debug("rotated SYN cookie key", "generation", gen)
		if err := syncookie.NoteRmemMax(s.Map(datapath.MoatMapSynSettings)); err != nil {
			d.log.Warn("pass net.core.rmem_max to the data path", "err", err)
		}
		return nil
	})
	if err != nil {
		d.log.Error("rotate SYN cookie key", "err", err)
	}
}

// sample reads the SYN defence's flood state to log when a flood starts
// and ends on a port. It reads the pinned maps directly, without the
// state lock, as any reader may.
func (d *Daemon) sample() {
	dir := filepath.Join(d.root, "maps")
	ports, err := ebpf.LoadPinnedMap(filepath.Join(dir, datapath.MoatMapSynPorts), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return
	}
	defer ports.Close()
	stats, err := ebpf.LoadPinnedMap(filepath.Join(dir, datapath.MoatMapSynCounters), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return
	}
	defer stats.Close()
	status, err := syncookie.Status(ports, stats)
	if err != nil {
		d.log.Warn("read SYN defence state", "err", err)
		return
	}
	seen := map[uint16]bool{}
	for _, p := range status {
		seen[p.Port] = true
		was := d.flooding[p.Port]
		if p.Flooding && !was {
			d.log.Warn("SYN flood started", "port", p.Port, "mode", p.Mode, "threshold_per_sec", p.ThresholdPerSec)
		} else if !p.Flooding && was {
			d.log.Info("SYN flood ended", "port", p.Port, "cookies_issued", p.CookiesIssued, "cookies_accepted", p.CookiesAccepted)
		}
		d.flooding[p.Port] = p.Flooding
	}
	for p := range d.flooding {
		if !seen[p] {
			delete(d.flooding, p)
		}
	}
}

// healAcceptors attaches again, in place, the interfaces of the config
// whose SYN acceptor is not where their filter needs it any more (a bridge
// deleted and made again, an interface moved between bridges), which
// would have the kernel reset every cookie handshake there. The check
// reads pins only; the state is opened, and locked, only when an
// interface of the config needs mending, and the need is checked again
// under the lock (a reload may have mended it meanwhile). An interface
// that cannot be mended is tried again later and later (healBackoff),
// and its error logged when it changes, not every sample tick.
func (d *Daemon) healAcceptors() {
	names, err := shield.MisplacedAcceptors(d.root)
	if err != nil || len(names) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	modes := map[string]shield.Mode{}
	for _, i := range d.cfg.Interfaces {
		modes[i.Name] = i.AttachMode()
	}
	now := time.Now()
	var todo []string
	for _, name := range names {
		if _, ok := modes[name]; !ok {
			continue // attached by hand, not the daemon's to move
		}
		if h, ok := d.heal[name]; ok && now.Before(h.next) {
			continue
		}
		todo = append(todo, name)
	}
	if len(todo) == 0 {
		return
	}
	err = d.withShield(func(s *shield.Shield) error {
		atts, err := s.Attachments()
		if err != nil {
			return err
		}
		for _, name := range todo {
			i := slices.IndexFunc(atts, func(a shield.Attachment) bool { return a.Iface == name })
			if i < 0 || !atts[i].AcceptorMisplaced {
				delete(d.heal, name)
				continue
			}
			res, err := s.Attach(name, modes[name])
			if _, err = shield.FollowUp(err); err != nil {
				d.healFailed(name, err, now)
				continue
			}
			delete(d.heal, name)
			d.log.Warn("moat's SYN acceptor was no longer where the filter needs it (a bridge made anew, "+
				"or the interface moved between bridges); attached again", "iface", name, "note", res.Warning)
		}
		return nil
	})
	if err != nil {
		for _, name := range todo {
			d.healFailed(name, err, now)
		}
	}
}

// healBackoff bounds how long healAcceptors waits before it tries again
// to mend an interface it could not: from a second, doubling.
const healBackoff = time.Minute

// healState is healAcceptors' memory of an interface it could not mend.
type healState struct {
	next time.Time     // no attempt before
	wait time.Duration // the wait after the last failure
	err  string        // the last failure, logged once
}

// healFailed notes that mending name failed with err at now: the next
// attempt waits twice as long as the last, up to healBackoff, and the
// error is logged only when it differs from the last one's.
func (d *Daemon) healFailed(name string, err error, now time.Time) {
	if d.heal == nil {
		d.heal = map[string]healState{}
	}
	h := d.heal[name]
	h.wait = min(max(2*h.wait, time.Second), healBackoff)
	h.next = now.Add(h.wait)
	if msg := err.Error(); msg != h.err {
		h.err = msg
		d.log.Error("put moat's SYN acceptor back; trying again later", "iface", name, "err", err)
	}
	d.heal[name] = h
}

// ReloadResult is what a reload did.
type ReloadResult struct {
	OK bool `json:"ok"`
	// Refused: the config was not applied at all (errors in it, a
	// change that needs a restart, or one this host or the maps cannot
	// take); the rules are exactly as before.
	Refused  bool          `json:"refused,omitempty"`
	Errors   []string      `json:"errors,omitempty"`
	Took     time.Duration `json:"took_ns"`
	Changes  Changes       `json:"changes"`
	Reloaded time.Time     `json:"reloaded"`
}

// Reload reads the config file again and, if it is valid, applies it as a
// diff. A bad config changes nothing.
func (d *Daemon) Reload() ReloadResult {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	start := time.Now()
	defer lowerGC()()
	defer releaseMemory()
	cfg, set, err := config.Load(d.opts.ConfigPath)
	if err != nil {
		var ce *config.Errors
		res := ReloadResult{Refused: true}
		if errors.As(err, &ce) {
			for _, e := range ce.List {
				res.Errors = append(res.Errors, (&config.Errors{File: ce.File, List: []config.Error{e}}).Error())
			}
		} else {
			res.Errors = []string{err.Error()}
		}
		d.log.Error("reload refused: the config has errors; nothing changed", "errors", len(res.Errors), "first", res.Errors[0])
		return res
	}
	d.log.Debug("reload: config read and checked", "took", time.Since(start).Round(time.Millisecond))
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := checkStatic(d.cfg, cfg); err != nil {
		d.log.Error("reload refused; nothing changed", "err", err)
		return ReloadResult{Refused: true, Errors: []string{err.Error()}}
	}
	var ch Changes
	fs, err := d.openFeeds(cfg, d.feeds)
	if err != nil {
		d.log.Error("reload refused; nothing changed", "err", err)
		return ReloadResult{Refused: true, Errors: []string{err.Error()}}
	}
	err = d.withShield(func(s *shield.Shield) error {
		var err error
		ch, err = d.applyDiff(s, d.cfg, cfg, set, fs)
		return err
	})
	if r := (*refusal)(nil); errors.As(err, &r) {
		d.log.Error("reload refused; nothing changed", "err", err)
		return ReloadResult{Refused: true, Errors: []string{err.Error()}}
	}
	if err != nil {
		d.log.Error("reload failed part way; the rules present before and after are in place", "err", err)
		return ReloadResult{Errors: []string{err.Error()}, Changes: ch}
	}
	d.dropShadowed(ch.applied)
	old := d.cfg
	d.cfg = cfg
	d.newPeriods(old, cfg, ch.keyRotated)
	d.useFeeds(fs)
	d.keepSet(cfg, set)
	if err := state.Save(cfg.Daemon.StateFile, d.st); err != nil {
		d.log.Error("save state", "err", err)
	}
	setLevel(d.logLevel, cfg.Daemon.LogLevel)
	d.reloads++
	d.lastReload = time.Now()
	res := ReloadResult{OK: true, Took: time.Since(start), Changes: ch, Reloaded: d.lastReload}
	d.log.Info("reloaded", "took", res.Took.Round(time.Millisecond), "added", ch.Added, "removed", ch.Removed,
		"port_rules", ch.PortRules, "attached", len(ch.Attached), "detached", len(ch.Detached), "syn_ports", ch.SYNPorts,
		"limits", ch.Limits, "policy", strings.Join(ch.Policy, ","), "limit_settings", strings.Join(ch.LimitSettings, ","),
		"monitor_blocks_removed", ch.MonitorBlocks)
	return res
}

// newPeriods tells the main loop of changed timer periods after a reload.
// A shorter key rotation period takes effect at once: the data path
// judges keys stale by the period now configured, and would issue no
// cookie until the next rotation. One rotation per reload at most
// (rotated: the reload's applySYN rotated already): a cookie is valid
// under the current key and the one before, and a second rotation would
// drop both keys that a handshake in flight may use. Called with d.mu
// held.
func (d *Daemon) newPeriods(old, cfg *config.Config, rotated bool) {
	if old.Daemon.ExpireEvery == cfg.Daemon.ExpireEvery && old.SYN.RotateEvery == cfg.SYN.RotateEvery &&
		old.Daemon.SampleEvery == cfg.Daemon.SampleEvery {
		return
	}
	if cfg.SYN.RotateEvery < old.SYN.RotateEvery && !rotated {
		d.rotateLocked()
	}
	select {
	case d.periods <- struct{}{}:
	default: // the loop has yet to take the last one, and reads d.cfg then
	}
}

// keepSet keeps the applied config's rules while it names feeds (see
// cfgSet), and lets them go otherwise: without feeds nothing merges with
// them between reloads, and a million entries are worth freeing.
func (d *Daemon) keepSet(cfg *config.Config, set *config.Set) {
	d.cfgSet = nil
	if len(cfg.Feeds()) > 0 {
		d.cfgSet = set
	}
}

// useFeeds makes fs the applied feeds after a reload: loops start for new
// feeds and stop for those gone, whose saved copies are deleted (a feed
// named again later starts from its server, not from a stale copy).
func (d *Daemon) useFeeds(fs *feedSet) {
	old := d.feeds
	d.feeds = fs
	d.feedsNow.Store(fs)
	if d.feedRunner != nil {
		d.feedRunner.sync(fs)
	}
	if old == nil {
		return
	}
	for _, f := range old.feeds {
		if !slices.Contains(fs.feeds, f) && !slices.ContainsFunc(fs.feeds, func(n *feed.Feed) bool { return feed.CacheName(n.Src) == feed.CacheName(f.Src) }) {
			feed.Forget(d.cfg.Daemon.FeedDir, f.Src)
		}
	}
}

// checkStatic refuses a reload that changes what only a restart can
// change: where the state lives, where the API listens, the logger, the
// metrics and share listeners. The refusal names the keys that changed,
// so the operator knows which edit to take back.
func checkStatic(old, cfg *config.Config) error {
	var changed []string
	for _, k := range []struct {
		key  string
		same bool
	}{
		{"daemon.bpffs_root", old.Daemon.BPFRoot == cfg.Daemon.BPFRoot},
		{"daemon.state_file", old.Daemon.StateFile == cfg.Daemon.StateFile},
		{"daemon.socket", old.Daemon.Socket == cfg.Daemon.Socket},
		{"daemon.feed_dir", old.Daemon.FeedDir == cfg.Daemon.FeedDir},
		{"daemon.log_format", old.Daemon.LogFormat == cfg.Daemon.LogFormat},
		{"metrics", sameMetrics(old.Metrics, cfg.Metrics)},
		{"share", old.Share == cfg.Share},
	} {
		if !k.same {
			changed = append(changed, k.key)
		}
	}
	switch len(changed) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%s changes only with a restart", changed[0])
	default:
		return fmt.Errorf("%s and %s change only with a restart", strings.Join(changed[:len(changed)-1], ", "), changed[len(changed)-1])
	}
}

func sameMetrics(a, b config.Metrics) bool {
	return a.On() == b.On() && a.Address == b.Address && a.TopEntries == b.TopEntries
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, as systemd wants it
// with RELOADING=1.
func monotonicUsec() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano() / 1e3
}
