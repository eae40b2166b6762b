package demo

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
	"testing"
	"time"
)

// sample is one request of the polling client.
type sample struct {
	start, end time.Time
	body       string // the answer; "" when the request failed
	err        string // why it failed
}

// poller asks one URL for an answer every interval, each request on a new
// connection (so a port nobody listens on shows as a refused connection,
// as a fresh client would see it), one request at a time.
type poller struct {
	mu      sync.Mutex
	samples []sample
	seen    map[string]chan struct{} // closed at the first answer with that body
	done    chan struct{}
	exited  chan struct{}
	once    sync.Once
}

func startPoll(url string, every time.Duration, bodies ...string) *poller {
	p := &poller{seen: map[string]chan struct{}{}, done: make(chan struct{}), exited: make(chan struct{})}
	for _, b := range bodies {
		p.seen[b] = make(chan struct{})
	}
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	go func() {
		defer close(p.exited)
		for {
			s := sample{start: time.Now()}
			s.body, s.err = get(client, url)
			s.end = time.Now()
			p.mu.Lock()
			p.samples = append(p.samples, s)
			if ch, ok := p.seen[s.body]; ok {
				close(ch)
				delete(p.seen, s.body)
			}
			p.mu.Unlock()
			select {
			case <-p.done:
				return
			case <-time.After(time.Until(s.start.Add(every))):
			}
		}
	}()
	return p
}

func get(client *http.Client, url string) (body, failure string) {
	resp, err := client.Get(url)
	if err != nil {
		return "", errKind(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256))
	switch {
	case err != nil:
		return "", errKind(err)
	case resp.StatusCode != http.StatusOK:
		return "", "HTTP " + strconv.Itoa(resp.StatusCode)
	}
	return strings.TrimSpace(string(data)), ""
}

// errKind names a failed request's cause in a word or two.
func errKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return err.Error()
}

// waitAnswer asks url until it answers body, for at most timeout.
func waitAnswer(url, body string, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(timeout)
	for {
		got, failure := get(client, url)
		if got == body {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer %q within %s (last: %q %s)", body, timeout, got, failure)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wait returns once an answer body has come, or an error after timeout.
func (p *poller) wait(body string, timeout time.Duration) error {
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

// stop ends the polling and returns the samples in order.
func (p *poller) stop() []sample {
	p.once.Do(func() { close(p.done) })
	<-p.exited
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.samples)
}

// gapReport is what the client saw of a change from the answer oldBody to
// the answer newBody.
type gapReport struct {
	Requests, Answered, Failed int
	AnsweredOld, AnsweredNew   int
	// Gap is the time from the old container's last answer to the new
	// one's first: the stretch in which the client got no answer.
	Gap time.Duration
	// FailedInGap are the failed requests in that stretch; FailedOutside
	// the ones before or after it (there must be none).
	FailedInGap, FailedOutside int
	// Causes counts the failed requests by cause.
	Causes map[string]int
	// Longest is the longest stretch between two answers anywhere in the
	// run (Gap, unless a slow answer elsewhere took longer).
	Longest time.Duration
}

// analyze reads the samples of one change. It fails when there is no
// answer from the old or the new container, when the old one answers
// after the new one did, or when something else answers.
func analyze(samples []sample, oldBody, newBody string) (gapReport, error) {
	r := gapReport{Requests: len(samples), Causes: map[string]int{}}
	iNew := slices.IndexFunc(samples, func(s sample) bool { return s.body == newBody })
	if iNew < 0 {
		return r, fmt.Errorf("no answer %q from the new container", newBody)
	}
	iOld := -1
	for i := iNew - 1; i >= 0; i-- {
		if samples[i].body == oldBody {
			iOld = i
			break
		}
	}
	if iOld < 0 {
		return r, fmt.Errorf("no answer %q from the old container before the new one's", oldBody)
	}
	var lastAnswer time.Time
	for i, s := range samples {
		switch s.body {
		case "":
			r.Failed++
			r.Causes[s.err]++
			if i > iOld && i < iNew {
				r.FailedInGap++
			} else {
				r.FailedOutside++
			}
			continue
		case oldBody:
			if i > iNew {
				return r, fmt.Errorf("request %d answered %q after the new container had answered", i+1, oldBody)
			}
			r.AnsweredOld++
		case newBody:
			r.AnsweredNew++
		default:
			return r, fmt.Errorf("request %d answered %q, neither %q nor %q", i+1, s.body, oldBody, newBody)
		}
		r.Answered++
		if !lastAnswer.IsZero() {
			r.Longest = max(r.Longest, s.end.Sub(lastAnswer))
		}
		lastAnswer = s.end
	}
	r.Gap = samples[iNew].end.Sub(samples[iOld].end)
	return r, nil
}

// causes is r.Causes in words: "12 connection refused, 1 timeout".
func (r gapReport) causes() string {
	if len(r.Causes) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(r.Causes))
	for k := range r.Causes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", r.Causes[k], k)
	}
	return strings.Join(parts, ", ")
}

// TestAnalyze: the figures the demo prints and fails on, without a pod.
func TestAnalyze(t *testing.T) {
	t0 := time.Unix(1000, 0)
	seq := func(spec ...string) []sample {
		// Each request takes 1 ms and starts 10 ms after the previous one;
		// "!" is a refused connection, "~" a timeout of 1 s.
		var out []sample
		at := t0
		for _, b := range spec {
			s := sample{start: at, end: at.Add(time.Millisecond), body: b}
			switch b {
			case "!":
				s.body, s.err = "", "connection refused"
			case "~":
				s.body, s.err, s.end = "", "timeout", at.Add(time.Second)
			}
			out = append(out, s)
			at = s.end.Add(9 * time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		samples []sample
		want    gapReport
		wantErr string
	}{
		{name: "clean switch", samples: seq("v1", "v1", "!", "!", "!", "v2", "v2"),
			want: gapReport{Requests: 7, Answered: 4, Failed: 3, AnsweredOld: 2, AnsweredNew: 2, Gap: 40 * time.Millisecond,
				FailedInGap: 3, Causes: map[string]int{"connection refused": 3}, Longest: 40 * time.Millisecond}},
		{name: "no gap", samples: seq("v1", "v2"),
			want: gapReport{Requests: 2, Answered: 2, AnsweredOld: 1, AnsweredNew: 1, Gap: 10 * time.Millisecond,
				Causes: map[string]int{}, Longest: 10 * time.Millisecond}},
		{name: "failure before the switch", samples: seq("v1", "!", "v1", "!", "v2"),
			want: gapReport{Requests: 5, Answered: 3, Failed: 2, AnsweredOld: 2, AnsweredNew: 1, Gap: 20 * time.Millisecond,
				FailedInGap: 1, FailedOutside: 1, Causes: map[string]int{"connection refused": 2}, Longest: 20 * time.Millisecond}},
		{name: "failure after the switch", samples: seq("v1", "v2", "~", "v2"),
			want: gapReport{Requests: 4, Answered: 3, Failed: 1, AnsweredOld: 1, AnsweredNew: 2, Gap: 10 * time.Millisecond,
				FailedOutside: 1, Causes: map[string]int{"timeout": 1}, Longest: 1019 * time.Millisecond}},
		{name: "old answers after new", samples: seq("v1", "v2", "v1"), wantErr: "after the new container"},
		{name: "no new answer", samples: seq("v1", "!", "!"), wantErr: "no answer \"v2\""},
		{name: "no old answer", samples: seq("!", "v2"), wantErr: "no answer \"v1\""},
		{name: "stranger", samples: seq("v1", "v2", "v3"), wantErr: "neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := analyze(tc.samples, "v1", "v2")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("analyze =\n %+v\nwant\n %+v", got, tc.want)
			}
		})
	}
	r, _ := analyze(seq("v1", "!", "~", "!", "v2"), "v1", "v2")
	if got, want := r.causes(), "2 connection refused, 1 timeout"; got != want {
		t.Errorf("causes() = %q, want %q", got, want)
	}
}
