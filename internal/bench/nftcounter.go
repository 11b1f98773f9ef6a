package bench

import (
	"encoding/binary"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// nftCounterPackets reads the packet count of a named nftables counter
// straight from the kernel (NFT_MSG_GETOBJ), in the calling thread's network
// namespace. The nft tool cannot do this cheaply here: before any listing it
// fetches the whole ruleset, a million set elements included, which takes
// minutes.
func nftCounterPackets(family uint8, table, name string) (uint64, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("netfilter netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, err
	}

	const seq = 1
	msg := make([]byte, unix.NLMSG_HDRLEN, 128)
	binary.NativeEndian.PutUint16(msg[4:], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETOBJ)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:], seq)
	msg = append(msg, family, unix.NFNETLINK_V0, 0, 0) // struct nfgenmsg
	msg = appendAttr(msg, unix.NFTA_OBJ_TABLE, append([]byte(table), 0))
	msg = appendAttr(msg, unix.NFTA_OBJ_NAME, append([]byte(name), 0))
	msg = appendAttr(msg, unix.NFTA_OBJ_TYPE, binary.BigEndian.AppendUint32(nil, unix.NFT_OBJECT_COUNTER))
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("ask for counter %s: %w", name, err)
	}

	buf := make([]byte, 1<<16)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("read counter %s: %w", name, err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if m.Header.Seq != seq {
			continue
		}
		if m.Header.Type == unix.NLMSG_ERROR {
			if len(m.Data) >= 4 {
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return 0, fmt.Errorf("counter %s in table %s: %w", name, table, unix.Errno(-e))
				}
			}
			continue
		}
		if len(m.Data) < 4 {
			continue
		}
		data, ok := findAttr(m.Data[4:], unix.NFTA_OBJ_DATA)
		if !ok {
			continue
		}
		if pk, ok := findAttr(data, unix.NFTA_COUNTER_PACKETS); ok && len(pk) == 8 {
			return binary.BigEndian.Uint64(pk), nil
		}
	}
	return 0, fmt.Errorf("the kernel's answer holds no packet count for counter %s", name)
}

func appendAttr(b []byte, typ uint16, payload []byte) []byte {
	l := unix.SizeofNlAttr + len(payload)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, payload...)
	for len(b)%unix.NLA_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

// findAttr returns the payload of the first attribute of type typ (nested
// or not) among the attributes in b.
func findAttr(b []byte, typ uint16) ([]byte, bool) {
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b))
		t := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.SizeofNlAttr || l > len(b) {
			return nil, false
		}
		if t == typ {
			return b[unix.SizeofNlAttr:l], true
		}
		adv := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if adv > len(b) {
			return nil, false
		}
		b = b[adv:]
	}
	return nil, false
}
