package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

// Outcomes of one pod in a walk over selected pods.
const (
	OutcomeCommitted  = "Committed"
	OutcomeFailed     = "Failed" // with the state in Status, or Err
	OutcomePartition  = "Skipped (below partition)"
	OutcomeNotStarted = "Not started (halted)"
)

// PodResult is one selected pod's part in SwapSelected.
type PodResult struct {
	Pod     string
	Ordinal int // -1: the name has no ordinal
	Outcome string
	Status  *podapi.SwapStatus
	Err     error
}

// availabilityPoll is how often SwapSelected reads the selected pods while
// it waits for one to become available before starting the next.
var availabilityPoll = 500 * time.Millisecond

// SwapSelected swaps the pods o.Selector selects as a StatefulSet rolls:
// highest ordinal (or name) first; pods with an ordinal below o.Partition
// are left alone; a pod is started only while fewer than o.MaxUnavailable
// selected pods are unavailable — being swapped, or not Ready — and a swap
// ends only when it committed and its pod, if it was Ready, is Ready again.
// The first failure halts the walk: swaps already running end, no other
// starts. The results are in walk order; the summary goes to o.Out.
func SwapSelected(ctx context.Context, client Client, o *SwapOptions) ([]PodResult, error) {
	sel, err := o.walkSelector()
	if err != nil {
		return nil, err
	}
	raw, req, err := o.Request()
	if err != nil {
		return nil, err
	}
	results, err := selectedPods(ctx, client, o, sel)
	if err != nil {
		return nil, err
	}
	out := newPrinter(o.Out)
	w := &walk{ctx: ctx, client: client, o: o, sel: sel, out: out, inflight: map[string]bool{}, done: make(chan walkDone)}
	var halt error
	for i := range results {
		r := &results[i]
		if r.Ordinal >= 0 && r.Ordinal < o.Partition {
			r.Outcome = OutcomePartition
			continue
		}
		if halt == nil {
			halt = w.waitSlot(r.Pod, results)
		}
		if halt != nil {
			r.Outcome = OutcomeNotStarted
			continue
		}
		w.inflight[r.Pod] = true
		go func(i int) {
			st, err := swapPod(ctx, client, o, raw, req, out, results[i].Pod)
			w.done <- walkDone{i: i, st: st, err: err}
		}(i)
	}
	for len(w.inflight) > 0 {
		if err := w.collect(<-w.done, results); err != nil && halt == nil {
			halt = err
		}
	}
	if halt == nil {
		halt = w.halt
	}
	printSummary(o, results)
	if halt != nil {
		return results, fmt.Errorf("halted: %w", halt)
	}
	return results, nil
}

// walkSelector checks the options of a walk over selected pods and
// returns the parsed selector.
func (o *SwapOptions) walkSelector() (labels.Selector, error) {
	if o.Pod != "" {
		return nil, errors.New("give a pod name or -l, not both")
	}
	if o.MaxUnavailable < 1 {
		return nil, fmt.Errorf("--max-unavailable %d: want at least 1", o.MaxUnavailable)
	}
	if o.Partition < 0 {
		return nil, fmt.Errorf("--partition %d: want 0 or more", o.Partition)
	}
	sel, err := labels.Parse(o.Selector)
	if err != nil {
		return nil, fmt.Errorf("-l %q: %w", o.Selector, err)
	}
	return sel, nil
}

// selectedPods lists the pods sel selects, in walk order; with a
// partition, every one must have an ordinal.
func selectedPods(ctx context.Context, client Client, o *SwapOptions, sel labels.Selector) ([]PodResult, error) {
	list, err := client.Pods(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list pods %s: %w", o.Selector, err)
	}
	if len(list.Items) == 0 {
		return nil, fmt.Errorf("no pods in namespace %s match %s", o.Namespace, o.Selector)
	}
	results := walkOrder(list.Items)
	if o.Partition > 0 {
		for _, r := range results {
			if r.Ordinal < 0 {
				return nil, fmt.Errorf("pod %s has no ordinal (NAME-N): --partition needs StatefulSet-style names", r.Pod)
			}
		}
	}
	return results, nil
}

type walkDone struct {
	i   int
	st  *podapi.SwapStatus
	err error
}

// walk is SwapSelected's state between pods.
type walk struct {
	ctx      context.Context
	client   Client
	o        *SwapOptions
	sel      labels.Selector
	out      *printer
	inflight map[string]bool
	done     chan walkDone
	halt     error // the first failure
}

func (w *walk) collect(d walkDone, results []PodResult) error {
	r := &results[d.i]
	delete(w.inflight, r.Pod)
	r.Status, r.Err = d.st, d.err
	if d.err != nil {
		r.Outcome = OutcomeFailed
		if w.halt == nil {
			w.halt = d.err
		}
		return d.err
	}
	r.Outcome = OutcomeCommitted
	return nil
}

// waitSlot returns when pod may start: fewer than MaxUnavailable selected
// pods are being swapped or, apart from pod itself, not Ready. It returns
// the first failure of a swap it collects while waiting, or why it gave up.
func (w *walk) waitSlot(pod string, results []PodResult) error {
	deadline := time.Now().Add(w.o.Timeout)
	if w.o.Timeout <= 0 {
		deadline = time.Now().Add(defaultTimeout)
	}
	told := false
	for {
		if w.halt != nil {
			return w.halt
		}
		var unavailable []string
		if len(w.inflight) < w.o.MaxUnavailable {
			var err error
			if unavailable, err = w.notReady(pod); err != nil {
				return err
			}
			if len(w.inflight)+len(unavailable) < w.o.MaxUnavailable {
				return nil
			}
			if !told {
				w.out.printf(pod, "waiting: %d swapping, not Ready: %s", len(w.inflight), strings.Join(unavailable, ", "))
				told = true
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s not started: still unavailable after %s: %s", pod, w.o.Timeout, strings.Join(unavailable, ", "))
		}
		select {
		case d := <-w.done:
			if err := w.collect(d, results); err != nil {
				return err
			}
		case <-time.After(availabilityPoll):
		case <-w.ctx.Done():
			return context.Cause(w.ctx)
		}
	}
}

// notReady lists the selected pods, other than pod and those being
// swapped, that are not Ready now.
func (w *walk) notReady(pod string) ([]string, error) {
	list, err := w.client.Pods(w.o.Namespace).List(w.ctx, metav1.ListOptions{LabelSelector: w.sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list pods %s: %w", w.o.Selector, err)
	}
	var out []string
	for i := range list.Items {
		p := &list.Items[i]
		if p.Name != pod && !w.inflight[p.Name] && !podReady(p) {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// walkOrder orders pods as a StatefulSet updates them: highest ordinal
// first, then names without an ordinal, highest first.
func walkOrder(pods []corev1.Pod) []PodResult {
	rs := make([]PodResult, 0, len(pods))
	for i := range pods {
		rs = append(rs, PodResult{Pod: pods[i].Name, Ordinal: ordinal(pods[i].Name)})
	}
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].Ordinal != rs[j].Ordinal {
			return rs[i].Ordinal > rs[j].Ordinal
		}
		return rs[i].Pod > rs[j].Pod
	})
	return rs
}

// ordinal is N of a StatefulSet-style NAME-N pod name, -1 for others.
func ordinal(name string) int {
	i := strings.LastIndexByte(name, '-')
	if i <= 0 || i == len(name)-1 {
		return -1
	}
	s := name[i+1:]
	if len(s) > 1 && s[0] == '0' {
		return -1 // StatefulSets never pad
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strings.ContainsAny(s, "+-") {
		return -1
	}
	return n
}

func printSummary(o *SwapOptions, results []PodResult) {
	out := newPrinter(o.Out)
	out.mu.Lock()
	defer out.mu.Unlock()
	tw := tabwriter.NewWriter(out.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tORDINAL\tRESULT\tSWAP\tDOWNTIME\tDETAIL")
	n := map[string]int{}
	for _, r := range results {
		ord, swapID, down, detail, outcome := "-", "-", "-", "", r.Outcome
		if r.Ordinal >= 0 {
			ord = strconv.Itoa(r.Ordinal)
		}
		if r.Status != nil {
			if r.Status.SwapID != "" {
				swapID = r.Status.SwapID
			}
			if r.Status.DowntimeMs > 0 {
				down = ms(r.Status.DowntimeMs)
			}
			if r.Outcome == OutcomeFailed && final(r.Status.State) {
				outcome = r.Status.State // RolledBack, Refused, ...
			}
			detail = r.Status.Error
		}
		if se := (*SwapError)(nil); errors.As(r.Err, &se) && se.Err != nil {
			detail = se.Err.Error()
		} else if r.Err != nil && se == nil {
			detail = r.Err.Error()
		}
		n[r.Outcome]++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Pod, ord, outcome, swapID, down, oneLine(detail))
	}
	_ = tw.Flush()
	fmt.Fprintf(out.w, "%d committed, %d failed, %d below partition, %d not started\n",
		n[OutcomeCommitted], n[OutcomeFailed], n[OutcomePartition], n[OutcomeNotStarted])
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
