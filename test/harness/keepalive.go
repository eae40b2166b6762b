package harness

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// KeepAlive is n clients (StartKeepAlive), each on a keep-alive HTTP/1.1 connection
// sending GET /peer every 50 ms. A request whose connection the server
// closed before any byte of the answer is sent again once on a new
// connection, as HTTP clients do for idempotent requests (Go's Transport,
// browsers; RFC 9110 9.2.2); a request that gets no answer then failed.
type KeepAlive struct {
	addr string
	stop chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	ok     int
	failed []string
	retry  int
	closes []KeepAliveClose
	vers   map[string]int
}

// KeepAliveClose is a connection the server ended: when the client saw it end,
// and whether it was reset rather than closed.
type KeepAliveClose struct {
	At    time.Time
	Reset bool
	Last  string // the version that answered its last request
}

func StartKeepAlive(addr string, n int) *KeepAlive {
	k := &KeepAlive{addr: addr, stop: make(chan struct{}), vers: map[string]int{}}
	for range n {
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.client()
		}()
	}
	return k
}

// client keeps one connection at a time, sending a request every 50 ms.
func (k *KeepAlive) client() {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var c *keepAliveConn
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	for {
		select {
		case <-k.stop:
			return
		case <-tick.C:
		}
		if c != nil && !c.endAt().IsZero() {
			// The server ended the idle connection: a new one, as a
			// client's pool does.
			k.closed(c, nil)
			c.close()
			c = nil
		}
		var ok bool
		for attempt := 0; attempt < 2 && !ok; attempt++ {
			if c == nil {
				var err error
				if c, err = k.dial(); err != nil {
					k.fail(fmt.Sprintf("dial: %v", err))
					break
				}
			}
			v, err := c.get()
			switch {
			case err == nil:
				ok = true
				k.answered(v)
				if c.lastClose {
					k.closed(c, nil)
					c.close()
					c = nil
				}
			case c.served > 0 && c.emptyClose:
				// The server ended an idle connection as the request went:
				// sent again on a new one.
				k.closed(c, err)
				c.close()
				c = nil
				if attempt == 0 {
					k.mu.Lock()
					k.retry++
					k.mu.Unlock()
					continue
				}
				k.fail(fmt.Sprintf("request again on a new connection: %v", err))
			default:
				k.closed(c, err)
				k.fail(fmt.Sprintf("request: %v", err))
				c.close()
				c = nil
				attempt = 2
			}
		}
	}
}

func (k *KeepAlive) dial() (*keepAliveConn, error) {
	nc, err := net.DialTimeout("tcp", k.addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &keepAliveConn{c: nc, br: bufio.NewReader(nc), done: make(chan struct{})}
	go c.watch()
	return c, nil
}

func (k *KeepAlive) answered(v string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ok++
	k.vers[v]++
}

func (k *KeepAlive) fail(why string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.failed = append(k.failed, time.Now().Format("15:04:05.000")+" "+why)
}

func (k *KeepAlive) closed(c *keepAliveConn, err error) {
	at := c.endAt()
	if at.IsZero() {
		at = time.Now()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closes = append(k.closes, KeepAliveClose{At: at, Reset: errors.Is(err, syscall.ECONNRESET) || c.reset, Last: c.last})
}

// End stops the clients; the connections still open are closed by the
// client, not counted.
func (k *KeepAlive) End() {
	close(k.stop)
	k.wg.Wait()
}

// keepAliveConn is one keep-alive connection. watch reads it while it is idle, so
// that the moment the server ends it is known to the millisecond.
type keepAliveConn struct {
	c      net.Conn
	br     *bufio.Reader
	served int
	// lastClose: the last answer said Connection: close.
	lastClose bool
	last      string

	mu         sync.Mutex
	busy       bool      // a request is under way: watch does not read
	ended      time.Time // when watch saw the server end it
	reset      bool
	emptyClose bool // the server ended it before any byte of an answer
	done       chan struct{}
	idle       sync.Mutex // held by watch while it peeks
}

// watch peeks at the idle connection: an idle keep-alive connection gets
// no byte unless the server ends it.
func (c *keepAliveConn) watch() {
	defer close(c.done)
	for {
		c.idle.Lock()
		_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		_, err := c.br.Peek(1)
		c.idle.Unlock()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			time.Sleep(time.Millisecond) // let a request take the connection
			continue
		}
		c.mu.Lock()
		if c.ended.IsZero() && err != nil {
			c.ended, c.reset = time.Now(), errors.Is(err, syscall.ECONNRESET)
		}
		c.mu.Unlock()
		return
	}
}

func (c *keepAliveConn) endAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// get sends GET /peer and reads the answer: "<version> <client address>".
func (c *keepAliveConn) get() (string, error) {
	c.idle.Lock()
	defer c.idle.Unlock()
	c.emptyClose = false
	_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c.c, "GET /peer HTTP/1.1\r\nHost: app\r\n\r\n"); err != nil {
		c.emptyClose = true
		return "", err
	}
	if _, err := c.br.Peek(1); err != nil {
		c.emptyClose = !errors.Is(err, os.ErrDeadlineExceeded)
		return "", err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", err
	}
	v, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	c.served++
	c.last = v
	// Connection: close (a server shutting down answers so): the answer
	// counts, the connection ends with it.
	c.lastClose = resp.Close
	return v, nil
}

func (c *keepAliveConn) close() {
	c.c.Close()
	<-c.done
}

// KeepAliveTally is what the clients saw.
type KeepAliveTally struct {
	// OK are the requests answered, by the version that answered;
	// Retried those sent again after an idle close; Failed what got no
	// answer.
	OK        int
	ByVersion map[string]int
	Retried   int
	Failed    []string
	// Closes are the connections the server ended.
	Closes []KeepAliveClose
}

// Tally is what the clients saw so far.
func (k *KeepAlive) Tally() KeepAliveTally {
	k.mu.Lock()
	defer k.mu.Unlock()
	v := map[string]int{}
	for key, n := range k.vers {
		v[key] = n
	}
	return KeepAliveTally{OK: k.ok, ByVersion: v, Retried: k.retry, Failed: append([]string(nil), k.failed...),
		Closes: append([]KeepAliveClose(nil), k.closes...)}
}
