package capture

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// pcapng (draft-ietf-opsawg-pcapng) written by hand: gopacket's NgWriter
// cannot attach options such as comments to a packet, and the verdict on
// each packet is the point of moat dump. Blocks are little endian.
const (
	blockSHB = 0x0A0D0D0A
	blockIDB = 0x00000001
	blockISB = 0x00000005
	blockEPB = 0x00000006

	byteOrderMagic = 0x1A2B3C4D

	optEnd       = 0
	optComment   = 1
	optShbUser   = 4 // shb_userappl
	optIfName    = 2
	optIfTsresol = 9
	optIsbStart  = 2 // isb_starttime
	optIsbEnd    = 3 // isb_endtime

	linkTypeEthernet = 1
)

type option struct {
	code  uint16
	value []byte
}

// PcapngWriter writes one section with an interface per capturing ifindex.
type PcapngWriter struct {
	w       *bufio.Writer
	ifaces  map[int]uint32 // ifindex -> interface id in the file
	order   []int
	snaplen uint32
	name    func(ifindex int) string
	buf     []byte
	first   time.Time
	last    time.Time
}

// NewPcapngWriter writes the section header and a description block for
// each of ifindexes, the interfaces captured on: readers such as tcpdump
// refuse a file without one, so a capture that matched nothing is valid
// too. name gives an interface's name for its block; snaplen is recorded
// there too.
func NewPcapngWriter(w io.Writer, snaplen uint32, ifindexes []int, name func(ifindex int) string) (*PcapngWriter, error) {
	pw := &PcapngWriter{w: bufio.NewWriterSize(w, 1<<16), ifaces: map[int]uint32{}, snaplen: snaplen, name: name}
	body := make([]byte, 16)
	binary.LittleEndian.PutUint32(body[0:], byteOrderMagic)
	binary.LittleEndian.PutUint16(body[4:], 1) // version 1.0
	binary.LittleEndian.PutUint16(body[6:], 0)
	binary.LittleEndian.PutUint64(body[8:], ^uint64(0)) // section length not given
	if err := pw.block(blockSHB, body, nil, []option{{optShbUser, []byte("moat dump")}}); err != nil {
		return nil, err
	}
	for _, i := range ifindexes {
		if _, err := pw.iface(i); err != nil {
			return nil, err
		}
	}
	return pw, nil
}

// block writes a block: fixed body, then data padded to 32 bits, options.
func (pw *PcapngWriter) block(typ uint32, body, data []byte, opts []option) error {
	size := 12 + len(body) + pad4(len(data))
	if len(opts) > 0 {
		for _, o := range opts {
			size += 4 + pad4(len(o.value))
		}
		size += 4 // opt_endofopt
	}
	b := pw.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, typ)
	b = binary.LittleEndian.AppendUint32(b, uint32(size))
	b = append(b, body...)
	b = append(b, data...)
	b = append(b, make([]byte, pad4(len(data))-len(data))...)
	if len(opts) > 0 {
		for _, o := range opts {
			b = binary.LittleEndian.AppendUint16(b, o.code)
			b = binary.LittleEndian.AppendUint16(b, uint16(len(o.value)))
			b = append(b, o.value...)
			b = append(b, make([]byte, pad4(len(o.value))-len(o.value))...)
		}
		b = binary.LittleEndian.AppendUint32(b, optEnd)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(size))
	pw.buf = b
	_, err := pw.w.Write(b)
	return err
}

func pad4(n int) int { return (n + 3) &^ 3 }

// iface returns the file's interface id for ifindex, writing its
// description block the first time: a packet from an interface not given
// to NewPcapngWriter still gets one.
func (pw *PcapngWriter) iface(ifindex int) (uint32, error) {
	if id, ok := pw.ifaces[ifindex]; ok {
		return id, nil
	}
	id := uint32(len(pw.order))
	body := make([]byte, 8)
	binary.LittleEndian.PutUint16(body[0:], linkTypeEthernet)
	binary.LittleEndian.PutUint32(body[4:], pw.snaplen)
	opts := []option{{optIfTsresol, []byte{9}}} // nanoseconds
	if n := pw.name(ifindex); n != "" {
		opts = append(opts, option{optIfName, []byte(n)})
	}
	if err := pw.block(blockIDB, body, nil, opts); err != nil {
		return 0, err
	}
	pw.ifaces[ifindex] = id
	pw.order = append(pw.order, ifindex)
	return id, nil
}

// WritePacket writes p as an enhanced packet block with comment.
func (pw *PcapngWriter) WritePacket(p Packet, comment string) error {
	id, err := pw.iface(p.Ifindex)
	if err != nil {
		return err
	}
	if pw.first.IsZero() {
		pw.first = p.Time
	}
	pw.last = p.Time
	ts := uint64(p.Time.UnixNano())
	body := make([]byte, 20)
	binary.LittleEndian.PutUint32(body[0:], id)
	binary.LittleEndian.PutUint32(body[4:], uint32(ts>>32))
	binary.LittleEndian.PutUint32(body[8:], uint32(ts))
	binary.LittleEndian.PutUint32(body[12:], uint32(len(p.Data)))
	binary.LittleEndian.PutUint32(body[16:], uint32(p.Length))
	var opts []option
	if comment != "" {
		opts = []option{{optComment, []byte(comment)}}
	}
	return pw.block(blockEPB, body, p.Data, opts)
}

// WriteStats writes a statistics block per interface that carries the
// comment (moat's count of lost samples, which is not per interface),
// with or without packets.
func (pw *PcapngWriter) WriteStats(comment string) error {
	for _, ifindex := range pw.order {
		now := uint64(time.Now().UnixNano())
		body := make([]byte, 12)
		binary.LittleEndian.PutUint32(body[0:], pw.ifaces[ifindex])
		binary.LittleEndian.PutUint32(body[4:], uint32(now>>32))
		binary.LittleEndian.PutUint32(body[8:], uint32(now))
		opts := []option{{optComment, []byte(comment)}}
		if !pw.first.IsZero() {
			opts = append(opts, option{optIsbStart, tsOpt(pw.first)}, option{optIsbEnd, tsOpt(pw.last)})
		}
		if err := pw.block(blockISB, body, nil, opts); err != nil {
			return err
		}
	}
	return nil
}

func tsOpt(t time.Time) []byte {
	ts := uint64(t.UnixNano())
	b := binary.LittleEndian.AppendUint32(nil, uint32(ts>>32))
	return binary.LittleEndian.AppendUint32(b, uint32(ts))
}

// Flush writes out what is buffered.
func (pw *PcapngWriter) Flush() error { return pw.w.Flush() }

// PcapngPacket is a packet read back from a pcapng file.
type PcapngPacket struct {
	Iface    int // interface id in the file
	IfName   string
	Time     time.Time
	Length   int
	Data     []byte
	Comments []string
}

// ReadPcapng reads every enhanced packet block of a little-endian pcapng
// stream, with its comments. Other block types are skipped.
func ReadPcapng(r io.Reader) ([]PcapngPacket, error) {
	type ifaceInfo struct {
		name  string
		tsres uint8
	}
	var (
		ifaces []ifaceInfo
		out    []PcapngPacket
		hdr    [8]byte
	)
	br := bufio.NewReader(r)
	for first := true; ; first = false {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) && !first {
				return out, nil
			}
			return out, fmt.Errorf("pcapng: block header: %w", err)
		}
		typ := binary.LittleEndian.Uint32(hdr[0:])
		size := binary.LittleEndian.Uint32(hdr[4:])
		if first && typ != blockSHB {
			return nil, errors.New("pcapng: no section header block")
		}
		if size < 12 || size%4 != 0 || size > 1<<24 {
			return out, fmt.Errorf("pcapng: bad block length %d", size)
		}
		blk := make([]byte, size-8)
		if _, err := io.ReadFull(br, blk); err != nil {
			return out, fmt.Errorf("pcapng: block: %w", err)
		}
		if binary.LittleEndian.Uint32(blk[len(blk)-4:]) != size {
			return out, errors.New("pcapng: block lengths differ")
		}
		blk = blk[:len(blk)-4]
		switch typ {
		case blockSHB:
			if len(blk) < 16 || binary.LittleEndian.Uint32(blk) != byteOrderMagic {
				return out, errors.New("pcapng: not a little-endian section")
			}
			ifaces = nil
		case blockIDB:
			if len(blk) < 8 {
				return out, errors.New("pcapng: short interface block")
			}
			info := ifaceInfo{tsres: 6}
			opts, err := readOptions(blk[8:])
			if err != nil {
				return out, err
			}
			for _, o := range opts {
				switch o.code {
				case optIfName:
					info.name = string(o.value)
				case optIfTsresol:
					if len(o.value) == 1 {
						info.tsres = o.value[0]
					}
				}
			}
			ifaces = append(ifaces, info)
		case blockEPB:
			if len(blk) < 20 {
				return out, errors.New("pcapng: short packet block")
			}
			id := int(binary.LittleEndian.Uint32(blk[0:]))
			if id >= len(ifaces) {
				return out, fmt.Errorf("pcapng: packet on undeclared interface %d", id)
			}
			ts := uint64(binary.LittleEndian.Uint32(blk[4:]))<<32 | uint64(binary.LittleEndian.Uint32(blk[8:]))
			capLen := int(binary.LittleEndian.Uint32(blk[12:]))
			if 20+pad4(capLen) > len(blk) {
				return out, errors.New("pcapng: packet data past its block")
			}
			p := PcapngPacket{
				Iface:  id,
				IfName: ifaces[id].name,
				Time:   tsTime(ts, ifaces[id].tsres),
				Length: int(binary.LittleEndian.Uint32(blk[16:])),
				Data:   blk[20 : 20+capLen],
			}
			opts, err := readOptions(blk[20+pad4(capLen):])
			if err != nil {
				return out, err
			}
			for _, o := range opts {
				if o.code == optComment {
					p.Comments = append(p.Comments, string(o.value))
				}
			}
			out = append(out, p)
		}
	}
}

func readOptions(b []byte) ([]option, error) {
	var out []option
	for len(b) >= 4 {
		code := binary.LittleEndian.Uint16(b)
		n := int(binary.LittleEndian.Uint16(b[2:]))
		if code == optEnd {
			return out, nil
		}
		if 4+pad4(n) > len(b) {
			return out, errors.New("pcapng: option past its block")
		}
		out = append(out, option{code, b[4 : 4+n]})
		b = b[4+pad4(n):]
	}
	return out, nil
}

// tsTime converts a timestamp in units of 10^-res seconds, or of 2^-(res
// & 0x7f) seconds when the top bit of res is set.
func tsTime(ts uint64, res uint8) time.Time {
	if res&0x80 != 0 {
		shift := res & 0x7f
		sec := ts >> shift
		frac := ts & (1<<shift - 1)
		return time.Unix(int64(sec), int64(frac*1e9>>shift))
	}
	for ; res > 9; res-- {
		ts /= 10
	}
	for ; res < 9; res++ {
		ts *= 10
	}
	return time.Unix(0, int64(ts))
}
