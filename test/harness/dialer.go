package harness

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Dialer is a client that opens a new TCP connection to an address every
// 5 ms, each in its own goroutine, and asks GET /peer over HTTP/1.0: like a
// device dialling a pod IP with no Service in between. The test app answers
// "<version> <the client's address as it sees it>".
type Dialer struct {
	every   time.Duration // how often a connection is opened
	timeout time.Duration // each connection's handshake, and then its answer
	mu      sync.Mutex
	wg      sync.WaitGroup
	all     []Dial
	stop    chan struct{}
	done    chan struct{}
}

// Dial is one connection of a Dialer.
type Dial struct {
	At   time.Time
	Took time.Duration
	// Connect is the handshake: what a connection hold adds to (the rest
	// is the app's answer).
	Connect time.Duration
	Err     error
	Reply   string // "v2 10.88.0.1:41234"
	Local   string // the client's own address
}

// StartDialer starts dialling addr until End; each connection gets 15 s to
// connect and 15 s more for its answer.
func StartDialer(addr string) *Dialer {
	return StartDialerPaced(addr, 5*time.Millisecond, 15*time.Second)
}

// StartDialerPaced is StartDialer opening a connection every every, each
// with timeout: an emulated node serves far fewer connections a second,
// and holds far longer, than a real one.
func StartDialerPaced(addr string, every, timeout time.Duration) *Dialer {
	d := &Dialer{every: every, timeout: timeout, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		tick := time.NewTicker(d.every)
		defer tick.Stop()
		for {
			select {
			case <-d.stop:
				d.wg.Wait()
				return
			case <-tick.C:
			}
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				a := dialOnce(addr, d.timeout)
				d.mu.Lock()
				d.all = append(d.all, a)
				d.mu.Unlock()
			}()
		}
	}()
	return d
}

func dialOnce(addr string, timeout time.Duration) Dial {
	a := Dial{At: time.Now()}
	c, err := net.DialTimeout("tcp", addr, timeout)
	a.Connect = time.Since(a.At)
	if err == nil {
		a.Local = c.LocalAddr().String()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err = fmt.Fprintf(c, "GET /peer HTTP/1.0\r\n\r\n"); err == nil {
			var b []byte
			b, err = io.ReadAll(c)
			if _, body, ok := strings.Cut(string(b), "\r\n\r\n"); ok {
				a.Reply = strings.TrimSpace(body)
			} else if err == nil {
				err = fmt.Errorf("no HTTP answer: %q", b)
			}
		}
		c.Close()
	}
	a.Took, a.Err = time.Since(a.At), err
	return a
}

// End stops dialling, waits for the connections under way and returns all.
func (d *Dialer) End() []Dial {
	close(d.stop)
	<-d.done
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.all
}

// DialTally counts a Dialer's connections by outcome.
type DialTally struct {
	OK, Refused, Reset, Timeout, Other int
	Slowest                            time.Duration
	ByVersion                          map[string]int
}

// Failed is every connection that did not get an answer.
func (s DialTally) Failed() int { return s.Refused + s.Reset + s.Timeout + s.Other }

// TallyDials counts ds, and fails tb where the app saw a client address
// other than the client's own.
func TallyDials(tb testing.TB, ds []Dial) DialTally {
	tb.Helper()
	s := DialTally{ByVersion: map[string]int{}}
	for _, a := range ds {
		switch {
		case a.Err == nil:
			s.OK++
			s.Slowest = max(s.Slowest, a.Took)
			v, peer, _ := strings.Cut(a.Reply, " ")
			s.ByVersion[v]++
			if peer != a.Local {
				tb.Errorf("%s saw the client as %q, the client is %s", v, peer, a.Local)
			}
		case errors.Is(a.Err, syscall.ECONNREFUSED):
			s.Refused++
		case errors.Is(a.Err, syscall.ECONNRESET):
			s.Reset++
		case errors.Is(a.Err, os.ErrDeadlineExceeded):
			s.Timeout++
		default:
			s.Other++
			tb.Logf("dial at %s: %v", a.At.Format("15:04:05.000"), a.Err)
		}
	}
	return s
}

// CheckWaits fails tb for a connection whose handshake waited longer than
// until listened (when the new process listened) plus 50 ms.
func CheckWaits(tb testing.TB, ds []Dial, listened time.Time) {
	tb.Helper()
	CheckWaitsWithin(tb, ds, listened, 50*time.Millisecond)
}

// CheckWaitsWithin is CheckWaits with another margin past the listen.
func CheckWaitsWithin(tb testing.TB, ds []Dial, listened time.Time, margin time.Duration) {
	tb.Helper()
	for _, a := range WaitedPast(ds, listened, margin) {
		tb.Errorf("connection at %s (%s) waited %s to connect: more than until the new process listened + %s (%s)",
			a.At.Format("15:04:05.000"), a.Reply, a.Connect, margin, max(listened.Sub(a.At), 0)+margin)
	}
}

// WaitedPast returns the connections whose handshake waited longer than
// until listened plus margin.
func WaitedPast(ds []Dial, listened time.Time, margin time.Duration) []Dial {
	var out []Dial
	for _, a := range ds {
		if allowed := max(listened.Sub(a.At), 0) + margin; a.Err == nil && a.Connect > allowed {
			out = append(out, a)
		}
	}
	return out
}
