package demo

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inplaced/inplaced/test/harness"
)

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
	// Slowest is the longest an answered request took.
	Slowest time.Duration
}

// analyze reads the samples of one change. It fails when there is no
// answer from the old or the new container, when the old one answers
// after the new one did, or when something else answers.
func analyze(samples []harness.HTTPSample, oldBody, newBody string) (gapReport, error) {
	r := gapReport{Requests: len(samples), Causes: map[string]int{}}
	iNew := slices.IndexFunc(samples, func(s harness.HTTPSample) bool { return s.Body == newBody })
	if iNew < 0 {
		return r, fmt.Errorf("no answer %q from the new container", newBody)
	}
	iOld := -1
	for i := iNew - 1; i >= 0; i-- {
		if samples[i].Body == oldBody {
			iOld = i
			break
		}
	}
	if iOld < 0 {
		return r, fmt.Errorf("no answer %q from the old container before the new one's", oldBody)
	}
	var lastAnswer time.Time
	for i, s := range samples {
		switch s.Body {
		case "":
			r.Failed++
			r.Causes[s.Err]++
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
			return r, fmt.Errorf("request %d answered %q, neither %q nor %q", i+1, s.Body, oldBody, newBody)
		}
		r.Answered++
		r.Slowest = max(r.Slowest, s.End.Sub(s.Start))
		if !lastAnswer.IsZero() {
			r.Longest = max(r.Longest, s.End.Sub(lastAnswer))
		}
		lastAnswer = s.End
	}
	r.Gap = samples[iNew].End.Sub(samples[iOld].End)
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
	seq := func(spec ...string) []harness.HTTPSample {
		// Each request takes 1 ms and starts 10 ms after the previous one;
		// "!" is a refused connection, "~" a timeout of 1 s.
		var out []harness.HTTPSample
		at := t0
		for _, b := range spec {
			s := harness.HTTPSample{Start: at, End: at.Add(time.Millisecond), Body: b}
			switch b {
			case "!":
				s.Body, s.Err = "", "connection refused"
			case "~":
				s.Body, s.Err, s.End = "", "timeout", at.Add(time.Second)
			}
			out = append(out, s)
			at = s.End.Add(9 * time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		samples []harness.HTTPSample
		want    gapReport
		wantErr string
	}{
		{name: "clean switch", samples: seq("v1", "v1", "!", "!", "!", "v2", "v2"),
			want: gapReport{Requests: 7, Answered: 4, Failed: 3, AnsweredOld: 2, AnsweredNew: 2, Gap: 40 * time.Millisecond,
				FailedInGap: 3, Causes: map[string]int{"connection refused": 3}, Longest: 40 * time.Millisecond, Slowest: time.Millisecond}},
		{name: "no gap", samples: seq("v1", "v2"),
			want: gapReport{Requests: 2, Answered: 2, AnsweredOld: 1, AnsweredNew: 1, Gap: 10 * time.Millisecond,
				Causes: map[string]int{}, Longest: 10 * time.Millisecond, Slowest: time.Millisecond}},
		{name: "failure before the switch", samples: seq("v1", "!", "v1", "!", "v2"),
			want: gapReport{Requests: 5, Answered: 3, Failed: 2, AnsweredOld: 2, AnsweredNew: 1, Gap: 20 * time.Millisecond,
				FailedInGap: 1, FailedOutside: 1, Causes: map[string]int{"connection refused": 2}, Longest: 20 * time.Millisecond, Slowest: time.Millisecond}},
		{name: "failure after the switch", samples: seq("v1", "v2", "~", "v2"),
			want: gapReport{Requests: 4, Answered: 3, Failed: 1, AnsweredOld: 1, AnsweredNew: 2, Gap: 10 * time.Millisecond,
				FailedOutside: 1, Causes: map[string]int{"timeout": 1}, Longest: 1019 * time.Millisecond, Slowest: time.Millisecond}},
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
