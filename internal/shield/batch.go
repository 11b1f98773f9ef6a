package shield

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
)

// Loading a million prefixes (60% IPv4 hosts, 20% IPv4 networks, 15% IPv6
// hosts, 5% IPv6 networks) costs about 1.1 s of kernel CPU time on the
// project's 2-vCPU machines (kernel 6.18): about 1.2 µs per insert into a
// BPF_F_NO_PREALLOC hash map, 1-2 µs into an LPM trie depending on the
// order. The syscalls themselves are cheap from a few thousand elements
// per batch up. So (figures from `go test -bench Million` in this
// package, see load_test.go):
//   - batches are typed slices built without reflection; reflect.Append
//     per element cost about 0.2 s per million;
//   - the batches of different maps, and the chunks of one hash map, run
//     on every CPU at once. A trie takes one lock per insert, so a trie's
//     chunks stay on one worker, in order;
//   - trie entries are written in address order, which keeps the path
//     from the root in cache: 200k IPv4 networks load in 0.2 s sorted,
//     0.24 s in the order of a generated list, 0.4 s shuffled.

// batchChunk bounds one batched syscall, so a million entries never need
// one huge contiguous buffer in the kernel, and hash maps split into
// enough pieces to share among the workers. Chunks of 1k to 64k elements
// load equally fast.
const batchChunk = 1 << 14

// maxWorkers bounds the goroutines that write or read maps at once.
const maxWorkers = 8

// mapBatch queues keys and values for one map, in the typed slices that
// BPF_MAP_*_BATCH needs.
type mapBatch[K, V any] struct {
	m      *ebpf.Map
	keys   []K
	values []V
}

func (b *mapBatch[K, V]) add(k K, v V) {
	b.keys = append(b.keys, k)
	b.values = append(b.values, v)
}

func (b *mapBatch[K, V]) reserve(n int) {
	b.keys = slices.Grow(b.keys, n)
	b.values = slices.Grow(b.values, n)
}

// addKey queues a key to delete.
func (b *mapBatch[K, V]) addKey(k K) { b.keys = append(b.keys, k) }

// sortBy orders keys and values together.
func (b *mapBatch[K, V]) sortBy(cmp func(a, b K) int) {
	idx := make([]int32, len(b.keys))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(i, j int32) int { return cmp(b.keys[i], b.keys[j]) })
	keys := make([]K, len(b.keys))
	values := make([]V, len(b.values))
	for to, from := range idx {
		keys[to] = b.keys[from]
		if len(b.values) > 0 {
			values[to] = b.values[from]
		}
	}
	b.keys, b.values = keys, values
}

// job is one unit of map work for a worker.
type job struct {
	size int // elements, to start the biggest first
	run  func() error
}

// updateJobs returns the work of writing the queued elements.
func (b *mapBatch[K, V]) updateJobs() []job {
	return b.split(func(lo, hi int) error {
		ks, vs := b.keys[lo:hi], b.values[lo:hi]
		_, err := b.m.BatchUpdate(ks, vs, nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			err = nil
			for i := range ks {
				if err = b.m.Update(&ks[i], &vs[i], ebpf.UpdateAny); err != nil {
					break
				}
			}
		}
		if err != nil {
			return fmt.Errorf("map %s: %w", mapName(b.m), err)
		}
		return nil
	})
}

// deleteJobs returns the work of deleting the queued keys; keys that do
// not exist are skipped.
func (b *mapBatch[K, V]) deleteJobs() []job {
	return b.split(func(lo, hi int) error {
		ks := b.keys[lo:hi]
		n, err := b.m.BatchDelete(ks, nil)
		if err == nil {
			return nil
		}
		// A batch stops at the first missing key, or is not supported by
		// the map type: finish one by one.
		if !errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("map %s: %w", mapName(b.m), err)
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			n = 0
		}
		for i := n; i < len(ks); i++ {
			err := b.m.Delete(&ks[i])
			if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("map %s: %w", mapName(b.m), err)
			}
		}
		return nil
	})
}

// split cuts the queue into chunks: one job per chunk for a hash map,
// whose buckets lock separately, one job for all of them for any other
// map, whose writers would only queue on one lock.
func (b *mapBatch[K, V]) split(do func(lo, hi int) error) []job {
	n := len(b.keys)
	if n == 0 {
		return nil
	}
	if b.m.Type() != ebpf.Hash {
		return []job{{n, func() error {
			for lo := 0; lo < n; lo += batchChunk {
				if err := do(lo, min(lo+batchChunk, n)); err != nil {
					return err
				}
			}
			return nil
		}}}
	}
	var jobs []job
	for lo := 0; lo < n; lo += batchChunk {
		hi := min(lo+batchChunk, n)
		jobs = append(jobs, job{hi - lo, func() error { return do(lo, hi) }})
	}
	return jobs
}

// runJobs runs jobs on up to one worker per CPU, biggest first, and
// returns the first error. After an error no new job starts; jobs already
// running finish, so, as with one batch, part of the change may be in
// place.
func runJobs(jobs []job) error {
	slices.SortStableFunc(jobs, func(a, b job) int { return b.size - a.size })
	workers := min(runtime.GOMAXPROCS(0), maxWorkers, len(jobs))
	if workers <= 1 {
		for _, j := range jobs {
			if err := j.run(); err != nil {
				return err
			}
		}
		return nil
	}
	var (
		mu    sync.Mutex
		next  int
		first error
		wg    sync.WaitGroup
	)
	take := func() (job, bool) {
		mu.Lock()
		defer mu.Unlock()
		if first != nil || next == len(jobs) {
			return job{}, false
		}
		next++
		return jobs[next-1], true
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j, ok := take(); ok; j, ok = take() {
				if err := j.run(); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// readAll reads every element of m with batched lookups, which cost a
// syscall per few thousand elements where Map.Iterate costs two per
// element (a million elements: about 0.3 s instead of 3 s).
func readAll[K, V any](m *ebpf.Map, each func(*K, *V)) error {
	const chunk = 4096 // more than any hash bucket holds, as lookups need
	keys := make([]K, chunk)
	values := make([]V, chunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		for i := range n {
			each(&keys[i], &values[i])
		}
		if isBatchEnd(err) {
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) && n == 0 {
			return iterateAll(m, each)
		}
		if err != nil {
			return fmt.Errorf("read map %s: %w", mapName(m), err)
		}
	}
}

// iterateAll is readAll for map types without batched lookups.
func iterateAll[K, V any](m *ebpf.Map, each func(*K, *V)) error {
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		each(&k, &v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read map %s: %w", mapName(m), err)
	}
	return nil
}

func mapName(m *ebpf.Map) string {
	if info, err := m.Info(); err == nil {
		return info.Name
	}
	return m.String()
}

// isBatchEnd tells whether a batched lookup stopped because the map has no
// more elements.
func isBatchEnd(err error) bool { return errors.Is(err, ebpf.ErrKeyNotExist) }
