package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// socketPair returns two connected unix stream sockets as net.Conns.
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, err := fileConn(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	b, err := fileConn(fds[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestRawIO moves bytes through rawIO on a real socket pair — more than the
// socket buffers hold, so that both sides wait in the poller — and checks
// what net.Conn users rely on: EOF, deadlines, Close, and errors errCode
// classifies as a peer going away rather than a protocol error.
func TestRawIO(t *testing.T) {
	a, b := socketPair(t)
	ra, rb := newRawIO(a), newRawIO(b)
	if _, ok := ra.(*rawIO); !ok {
		t.Fatalf("newRawIO of a unix socket is %T, want *rawIO", ra)
	}
	const size = 8 << 20 // well past the socket buffers: Write must wait for room
	out := make([]byte, size)
	for i := range out {
		out[i] = byte(i * 7)
	}
	werr := make(chan error, 1)
	go func() {
		n, err := ra.Write(out)
		if err == nil && n != size {
			err = io.ErrShortWrite
		}
		werr <- err
		a.(interface{ CloseWrite() error }).CloseWrite()
	}()
	in, err := io.ReadAll(rb)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if len(in) != size || string(in) != string(out) {
		t.Fatalf("read %d bytes, want the %d written, unchanged", len(in), size)
	}
	if n, err := rb.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer's shutdown: %d, %v; want 0, EOF", n, err)
	}

	// A read deadline ends a waiting Read as net.Conn's does.
	c, d := socketPair(t)
	rc := newRawIO(c)
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err = rc.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	if code, proto := errCode(err); proto {
		t.Errorf("errCode(deadline) = %v, protocol error; want a peer going away", code)
	}
	_ = c.SetReadDeadline(time.Time{})

	// Close while a Read waits: net.ErrClosed.
	rerr := make(chan error, 1)
	go func() { _, err := rc.Read(make([]byte, 1)); rerr <- err }()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	if err := <-rerr; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on a closed conn: %v, want net.ErrClosed", err)
	}

	// Writing to a peer that has gone: EPIPE, an *net.OpError, not a
	// protocol error.
	d.Close()
	e, f := socketPair(t)
	f.Close()
	re := newRawIO(e)
	var werr2 error
	for range 100 { // the first write may land in the buffer before the peer's close is seen
		if _, werr2 = re.Write([]byte("x")); werr2 != nil {
			break
		}
	}
	var ne *net.OpError
	if !errors.As(werr2, &ne) || !errors.Is(werr2, syscall.EPIPE) {
		t.Fatalf("write to a closed peer: %v, want a *net.OpError wrapping EPIPE", werr2)
	}
	if code, proto := errCode(werr2); proto {
		t.Errorf("errCode(EPIPE) = %v, protocol error; want a peer going away", code)
	}
}

// TestSockWriterWritesLongAfterAStall: the drain of a stalled peer's
// overflow bounds each of its writes with a deadline; once the overflow is
// out, that deadline must not outlive it. A deadline left on the socket
// made the next non-blocking write, whenever it came after the deadline
// (a kubelet connection's next call long after one large answer stalled
// it), fail with os.ErrDeadlineExceeded, and the session closed the
// caller's connection under its calls without a word.
func TestSockWriterWritesLongAfterAStall(t *testing.T) {
	a, b := socketPair(t)
	const timeout = 100 * time.Millisecond
	w := newSockWriter(a, timeout)
	big := make([]byte, 8<<20) // past the socket buffers: the write stalls
	if n, err := w.Write(big); err != nil || n != len(big) {
		t.Fatalf("write %d bytes: %d, %v", len(big), n, err)
	}
	if !w.stalled.Load() {
		t.Fatal("an 8 MiB write to a peer that does not read did not stall: the test proves nothing")
	}
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(b, make([]byte, len(big)+1))
		read <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for w.stalled.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the overflow was not written out in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(3 * timeout) // well past the drain's last deadline
	if _, err := w.Write([]byte{1}); err != nil {
		t.Fatalf("a write %s after the stall ended: %v; want it written", 3*timeout, err)
	}
	if err := <-read; err != nil {
		t.Fatalf("the peer read: %v", err)
	}
}
