package hold

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// The NFQUEUE client and the sock_diag dump are a few netlink messages each,
// written here over x/sys/unix: the maintained Go NFQUEUE client
// (florianl/go-nfqueue) is not served by the module proxy this project
// builds with, and sock_diag needs two structs that x/sys does not define.

// nlMsg is one netlink message: header fields and payload.
type nlMsg struct {
	typ   uint16
	flags uint16
	seq   uint32
	data  []byte
}

func nlAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// marshal encodes m with its 16-byte header.
func (m nlMsg) marshal() []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+nlAlign(len(m.data)))
	binary.NativeEndian.PutUint32(b[0:4], uint32(unix.NLMSG_HDRLEN+len(m.data)))
	binary.NativeEndian.PutUint16(b[4:6], m.typ)
	binary.NativeEndian.PutUint16(b[6:8], m.flags)
	binary.NativeEndian.PutUint32(b[8:12], m.seq)
	copy(b[unix.NLMSG_HDRLEN:], m.data)
	return b
}

// parseMsgs splits a datagram into messages.
func parseMsgs(b []byte) ([]nlMsg, error) {
	var out []nlMsg
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return out, fmt.Errorf("netlink: message length %d of %d bytes", l, len(b))
		}
		out = append(out, nlMsg{
			typ: binary.NativeEndian.Uint16(b[4:6]), flags: binary.NativeEndian.Uint16(b[6:8]),
			seq: binary.NativeEndian.Uint32(b[8:12]), data: b[unix.NLMSG_HDRLEN:l],
		})
		if n := nlAlign(l); n < len(b) {
			b = b[n:]
		} else {
			break
		}
	}
	return out, nil
}

// nlError returns the error an NLMSG_ERROR message carries (nil for an ACK).
func nlError(m nlMsg) error {
	if len(m.data) < 4 {
		return fmt.Errorf("netlink: short error message")
	}
	if e := int32(binary.NativeEndian.Uint32(m.data[0:4])); e != 0 {
		return unix.Errno(-e)
	}
	return nil
}

// attr encodes one netlink attribute.
func attr(typ uint16, v []byte) []byte {
	b := make([]byte, nlAlign(unix.SizeofNlAttr+len(v)))
	binary.NativeEndian.PutUint16(b[0:2], uint16(unix.SizeofNlAttr+len(v)))
	binary.NativeEndian.PutUint16(b[2:4], typ)
	copy(b[unix.SizeofNlAttr:], v)
	return b
}

// attrs walks the attributes in b, calling fn for each.
func attrs(b []byte, fn func(typ uint16, v []byte)) {
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofNlAttr || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:4])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[unix.SizeofNlAttr:l])
		if n := nlAlign(l); n < len(b) {
			b = b[n:]
		} else {
			return
		}
	}
}
