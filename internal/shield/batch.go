package shield

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
)

// batchChunk bounds one batched syscall, so a million entries never need
// one huge contiguous buffer in the kernel.
const batchChunk = 1 << 16

// batcher groups keys and values per map so that they can be written with
// BPF_MAP_UPDATE_BATCH / BPF_MAP_DELETE_BATCH, which need typed slices.
type batcher struct {
	order  []*ebpf.Map
	keys   map[*ebpf.Map]reflect.Value
	values map[*ebpf.Map]reflect.Value
}

func newBatcher() *batcher {
	return &batcher{keys: map[*ebpf.Map]reflect.Value{}, values: map[*ebpf.Map]reflect.Value{}}
}

// add queues key and value (value nil for deletes) for m.
func (b *batcher) add(m *ebpf.Map, key, value any) {
	ks, ok := b.keys[m]
	if !ok {
		b.order = append(b.order, m)
		ks = reflect.MakeSlice(reflect.SliceOf(reflect.TypeOf(key)), 0, 16)
		if value != nil {
			b.values[m] = reflect.MakeSlice(reflect.SliceOf(reflect.TypeOf(value)), 0, 16)
		}
	}
	b.keys[m] = reflect.Append(ks, reflect.ValueOf(key))
	if value != nil {
		b.values[m] = reflect.Append(b.values[m], reflect.ValueOf(value))
	}
}

func (b *batcher) update() error {
	for _, m := range b.order {
		ks, vs := b.keys[m], b.values[m]
		for lo := 0; lo < ks.Len(); lo += batchChunk {
			hi := min(lo+batchChunk, ks.Len())
			k, v := ks.Slice(lo, hi), vs.Slice(lo, hi)
			_, err := m.BatchUpdate(k.Interface(), v.Interface(), nil)
			if errors.Is(err, ebpf.ErrNotSupported) {
				err = updateEach(m, k, v)
			}
			if err != nil {
				return fmt.Errorf("map %s: %w", mapName(m), err)
			}
		}
	}
	return nil
}

func updateEach(m *ebpf.Map, ks, vs reflect.Value) error {
	for i := 0; i < ks.Len(); i++ {
		if err := m.Update(ks.Index(i).Interface(), vs.Index(i).Interface(), ebpf.UpdateAny); err != nil {
			return err
		}
	}
	return nil
}

// delete removes every queued key; keys that do not exist are skipped.
func (b *batcher) delete() error {
	for _, m := range b.order {
		ks := b.keys[m]
		for lo := 0; lo < ks.Len(); lo += batchChunk {
			k := ks.Slice(lo, min(lo+batchChunk, ks.Len()))
			n, err := m.BatchDelete(k.Interface(), nil)
			if err == nil {
				continue
			}
			// A batch stops at the first missing key, or is not supported
			// by the map type: finish one by one.
			if !errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("map %s: %w", mapName(m), err)
			}
			if errors.Is(err, ebpf.ErrNotSupported) {
				n = 0
			}
			for i := n; i < k.Len(); i++ {
				err := m.Delete(k.Index(i).Interface())
				if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return fmt.Errorf("map %s: %w", mapName(m), err)
				}
			}
		}
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
