package harness

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// HTTPSample is one request of an HTTPPoller.
type HTTPSample struct {
	Start, End time.Time
	Body       string // the answer; "" when the request failed
	Err        string // why it failed (HTTPErrKind, or "HTTP 503")
}

// HTTPPoller asks one URL for an answer every interval, each request on a
// new connection (so a port nobody listens on shows as a refused
// connection, as a fresh client would see it, and a kept-alive connection
// does not keep talking to an old process), one request at a time, with a
// timeout of 1 s.
type HTTPPoller struct {
	mu      sync.Mutex
	samples []HTTPSample
	seen    map[string]chan struct{} // closed at the first answer with that body
	done    chan struct{}
	exited  chan struct{}
	once    sync.Once
}

// StartHTTPPoll starts polling url every interval until Stop. bodies are
// the answers Wait can wait for.
func StartHTTPPoll(url string, every time.Duration, bodies ...string) *HTTPPoller {
	p := &HTTPPoller{seen: map[string]chan struct{}{}, done: make(chan struct{}), exited: make(chan struct{})}
	for _, b := range bodies {
		p.seen[b] = make(chan struct{})
	}
	client := newPollClient()
	go func() {
		defer close(p.exited)
		for {
			s := HTTPSample{Start: time.Now()}
			s.Body, s.Err = httpPollGet(client, url)
			s.End = time.Now()
			p.mu.Lock()
			p.samples = append(p.samples, s)
			if ch, ok := p.seen[s.Body]; ok {
				close(ch)
				delete(p.seen, s.Body)
			}
			p.mu.Unlock()
			select {
			case <-p.done:
				return
			case <-time.After(time.Until(s.Start.Add(every))):
			}
		}
	}()
	return p
}

// Wait returns once an answer body has come, or an error after timeout.
// body must be one of StartHTTPPoll's bodies.
func (p *HTTPPoller) Wait(body string, timeout time.Duration) error {
	p.mu.Lock()
	ch, ok := p.seen[body]
	p.mu.Unlock()
	if !ok {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("no answer %q within %s", body, timeout)
	}
}

// Stop ends the polling and returns the samples in order. It may be called
// more than once.
func (p *HTTPPoller) Stop() []HTTPSample {
	p.once.Do(func() { close(p.done) })
	<-p.exited
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.samples)
}

// WaitHTTPAnswer asks url, as an HTTPPoller would, until it answers body,
// for at most timeout.
func WaitHTTPAnswer(url, body string, timeout time.Duration) error {
	client := newPollClient()
	deadline := time.Now().Add(timeout)
	for {
		got, failure := httpPollGet(client, url)
		if got == body {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer %q within %s (last: %q %s)", body, timeout, got, failure)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func newPollClient() *http.Client {
	return &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
}

// httpPollGet returns the trimmed answer of a GET of url (at most 256
// bytes), or why there is none.
func httpPollGet(client *http.Client, url string) (body, failure string) {
	resp, err := client.Get(url)
	if err != nil {
		return "", HTTPErrKind(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256))
	switch {
	case err != nil:
		return "", HTTPErrKind(err)
	case resp.StatusCode != http.StatusOK:
		return "", "HTTP " + strconv.Itoa(resp.StatusCode)
	}
	return strings.TrimSpace(string(data)), ""
}

// HTTPErrKind names a failed request's cause in a word or two:
// "connection refused", "connection reset", "host unreachable",
// "connection closed", "timeout"; any other error as its text.
func HTTPErrKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "host unreachable"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return err.Error()
}
