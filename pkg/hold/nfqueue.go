package hold

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// nfnetlink_queue message types and attributes (linux/netfilter/nfnetlink_queue.h).
const (
	nfqnlMsgPacket       = 0
	nfqnlMsgConfig       = 2
	nfqnlMsgVerdictBatch = 3

	nfqaPacketHdr  = 1
	nfqaVerdictHdr = 2

	nfqaCfgCmd         = 1
	nfqaCfgParams      = 2
	nfqaCfgQueueMaxlen = 3

	nfqnlCfgCmdBind = 1
	nfqnlCopyMeta   = 1

	nfAccept = 1

	// queueMaxlen bounds the SYNs one port parks; more are dropped by the
	// kernel and the client retransmits.
	queueMaxlen = 65536
)

// queue is an nfnetlink_queue socket bound to some queue numbers in one
// network namespace. A reader goroutine takes the parked packets' ids; no
// verdict is given until release.
type queue struct {
	f  *os.File
	rc syscall.RawConn

	started bool

	mu     sync.Mutex
	seq    uint32
	parked map[uint16]*parked // by queue number
	done   chan struct{}
}

// parked are the SYNs one queue parked, in the order they came (the
// kernel numbers a queue's packets in that order, so a batch verdict up to
// an id accepts exactly the ones before it); next is the first not yet
// accepted.
type parked struct {
	syns []parkedSYN
	next int
}

type parkedSYN struct {
	id uint32
	at time.Time
}

// pending is how many parked SYNs have no verdict yet.
func (p *parked) pending() int { return len(p.syns) - p.next }

func newQueue() (*queue, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("nfqueue socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nfqueue bind: %w", err)
	}
	// Parked SYNs are few but come in bursts; a larger buffer keeps the
	// kernel from dropping their notifications (the packets stay parked
	// either way, but their ids would be missed until the batch verdict).
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_NO_ENOBUFS, 1)
	f := os.NewFile(uintptr(fd), "nfqueue")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("nfqueue socket: %w", err)
	}
	return &queue{f: f, rc: rc, parked: map[uint16]*parked{}, done: make(chan struct{})}, nil
}

func nfgen(num uint16) []byte {
	b := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}
	binary.BigEndian.PutUint16(b[2:4], num)
	return b
}

// bind binds queue num to this socket: meta data only (no payload), and
// waits for the kernel's answer. Call before start.
func (q *queue) bind(num uint16) error {
	cmd := []byte{nfqnlCfgCmdBind, 0, 0, 0}
	params := make([]byte, 5)
	params[4] = nfqnlCopyMeta
	maxlen := binary.BigEndian.AppendUint32(nil, queueMaxlen)
	data := append(nfgen(num), attr(nfqaCfgCmd, cmd)...)
	data = append(data, attr(nfqaCfgParams, params)...)
	data = append(data, attr(nfqaCfgQueueMaxlen, maxlen)...)
	q.seq++
	seq := q.seq
	m := nlMsg{typ: unix.NFNL_SUBSYS_QUEUE<<8 | nfqnlMsgConfig, flags: unix.NLM_F_REQUEST | unix.NLM_F_ACK, seq: seq, data: data}
	if err := q.send(m.marshal()); err != nil {
		return fmt.Errorf("bind nfqueue %d: %w", num, err)
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := q.recv(buf)
		if err != nil {
			return fmt.Errorf("bind nfqueue %d: %w", num, err)
		}
		msgs, err := parseMsgs(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.typ == unix.NLMSG_ERROR && m.seq == seq {
				if err := nlError(m); err != nil {
					return fmt.Errorf("bind nfqueue %d: %w", num, err)
				}
				q.parked[num] = &parked{}
				return nil
			}
		}
	}
}

func (q *queue) send(b []byte) error {
	var serr error
	err := q.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

// recv reads one datagram. closed reports that the socket was closed
// under the read (the reader's signal to end).
func (q *queue) recv(buf []byte) (n int, closed bool, err error) {
	var rerr error
	if err := q.rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
		return rerr != unix.EAGAIN
	}); err != nil {
		return 0, true, err
	}
	return n, false, rerr
}

// start reads parked packets until close.
func (q *queue) start() {
	q.started = true
	go func() {
		defer close(q.done)
		buf := make([]byte, 64<<10)
		for {
			n, closed, err := q.recv(buf)
			if closed {
				return
			}
			if err != nil {
				continue // ENOBUFS and the like: the batch verdict covers missed ids
			}
			msgs, _ := parseMsgs(buf[:n])
			for _, m := range msgs {
				if m.typ != unix.NFNL_SUBSYS_QUEUE<<8|nfqnlMsgPacket || len(m.data) < 4 {
					continue
				}
				num := binary.BigEndian.Uint16(m.data[2:4])
				attrs(m.data[4:], func(typ uint16, v []byte) {
					if typ != nfqaPacketHdr || len(v) < 4 {
						return
					}
					id := binary.BigEndian.Uint32(v[0:4])
					q.mu.Lock()
					if p := q.parked[num]; p != nil {
						p.syns = append(p.syns, parkedSYN{id: id, at: time.Now()})
					}
					q.mu.Unlock()
				})
			}
		}
	}()
}

// pending is how many SYNs queue num parked that have no verdict yet.
func (q *queue) pending(num uint16) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if p := q.parked[num]; p != nil {
		return p.pending()
	}
	return 0
}

// accept accepts the next n SYNs parked on queue num (all when n < 0) with
// one batch verdict. It returns how many it accepted and the longest any of
// them waited.
func (q *queue) accept(num uint16, n int) (int, time.Duration, error) {
	q.mu.Lock()
	p := q.parked[num]
	if p == nil || p.pending() == 0 || n == 0 {
		q.mu.Unlock()
		return 0, 0, nil
	}
	if n < 0 || n > p.pending() {
		n = p.pending()
	}
	batch := p.syns[p.next : p.next+n]
	p.next += n
	var maxID uint32
	for _, s := range batch {
		maxID = max(maxID, s.id)
	}
	waited := time.Since(batch[0].at)
	q.seq++
	seq := q.seq
	q.mu.Unlock()
	v := binary.BigEndian.AppendUint32(nil, nfAccept)
	v = binary.BigEndian.AppendUint32(v, maxID)
	m := nlMsg{typ: unix.NFNL_SUBSYS_QUEUE<<8 | nfqnlMsgVerdictBatch, flags: unix.NLM_F_REQUEST, seq: seq,
		data: append(nfgen(num), attr(nfqaVerdictHdr, v)...)}
	if err := q.send(m.marshal()); err != nil {
		return n, waited, fmt.Errorf("nfqueue %d verdict: %w", num, err)
	}
	return n, waited, nil
}

// close stops the reader. The kernel unbinds the queues with the socket
// and drops whatever is still parked on them.
func (q *queue) close() {
	q.f.Close()
	if q.started {
		<-q.done
	}
}
