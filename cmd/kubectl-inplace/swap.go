package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/pkg/kubeclient"
	"github.com/inplaced/inplaced/pkg/strategy"
	"github.com/inplaced/inplaced/pkg/swapflags"
)

// SwapOptions are the flags of `kubectl inplace swap`.
type SwapOptions struct {
	Namespace string
	// Pod names one pod; Selector (-l) selects several instead.
	Pod      string
	Selector string

	Container    string
	Image        string
	Env          []string // K=V
	UnsetEnv     []string
	Command      []string
	SetCommand   bool // --command given (an empty command is a change too)
	Args         []string
	SetArgs      bool
	HealthHTTP   string
	HealthTCP    int32
	HealthExec   []string
	MinRuntime   time.Duration
	DrainSeconds int64
	// Strategy is stop-first or overlap; empty: the pod's annotation
	// inplaced.io/swap-strategy, else the node's default.
	Strategy string
	// Timeout bounds each pod: from the request to the end of its swap and,
	// for a pod that was Ready, to Ready again.
	Timeout time.Duration

	// With Selector: at most MaxUnavailable pods of the selection unavailable
	// (swapping or not Ready) at a time; pods with an ordinal below
	// Partition are left alone.
	MaxUnavailable int
	Partition      int

	// Out receives the progress; nil is io.Discard.
	Out io.Writer
}

const defaultTimeout = 5 * time.Minute

func newSwapCommand(g *globals) *cobra.Command {
	o := &SwapOptions{}
	cmd := &cobra.Command{
		Use:   "swap (POD | -l SELECTOR) -c CONTAINER [--image IMAGE] [--env K=V]... [--unset-env K]... [--command C]... [--args A]...",
		Short: "Swap a pod's container in place and follow the swap to its end",
		Long: `Writes the inplaced.io/swap annotation on the pod and follows the inplaced.io/swap-status
annotation that inplaced on the pod's node writes, printing each step. Exits 0 only when
the swap committed (and a pod that was Ready is Ready again).

With -l, the selected pods are swapped highest ordinal first (StatefulSet-style NAME-N
names; else by name, highest first), at most --max-unavailable at a time, leaving pods with
an ordinal below --partition alone; the first failure halts the walk and leaves the pods
not yet started untouched.`,
		Example: `  kubectl inplace swap web-0 -c app --env LOG_LEVEL=debug --health-http 8080/healthz
  kubectl inplace swap -l app=kafka -c broker --image kafka:3.8.1 --max-unavailable 1 --partition 2`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				o.Pod = args[0]
			}
			o.SetCommand, o.SetArgs = cmd.Flags().Changed("command"), cmd.Flags().Changed("args")
			o.Out = cmd.OutOrStdout()
			client, ns, err := g.client()
			if err != nil {
				return err
			}
			o.Namespace = ns
			if o.Selector != "" {
				_, err := SwapSelected(cmd.Context(), client, o)
				return err
			}
			_, err = Swap(cmd.Context(), client, o)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.Selector, "selector", "l", "", "swap the pods this label selector selects, instead of one named pod")
	f.StringVarP(&o.Container, "container", "c", "", "the container to swap (required)")
	swapflags.AddChange(f, &o.Image, &o.Env, &o.UnsetEnv, &o.Command)
	f.StringArrayVar(&o.Args, "args", nil, "new args, one element per flag (repeatable; --args=-flag for one that starts with -)")
	f.StringVar(&o.HealthHTTP, "health-http", "", "health gate: PORT/PATH fetched from the pod IP, e.g. 8080/healthz")
	f.Int32Var(&o.HealthTCP, "health-tcp", 0, "health gate: TCP port on the pod IP")
	f.StringArrayVar(&o.HealthExec, "health-exec", nil, "health gate: command run in the new container (repeatable, one element each)")
	f.DurationVar(&o.MinRuntime, "min-runtime", 0, "how long the new container must keep running (default: inplaced's)")
	f.Int64Var(&o.DrainSeconds, "drain-seconds", 0, "seconds a pod with the inplaced.io/InPlaceReady readiness gate is NotReady before the old container stops")
	f.StringVar(&o.Strategy, "strategy", "", "stop-first or overlap (start the new container while the old one runs and hand it the old one's listening sockets); default: the pod's annotation "+strategy.Annotation+", else the node's --swap-strategy")
	f.DurationVar(&o.Timeout, "timeout", defaultTimeout, "how long to wait for each pod's swap to end")
	f.IntVar(&o.MaxUnavailable, "max-unavailable", 1, "with -l: at most this many selected pods unavailable (swapping or not Ready) at a time")
	f.IntVar(&o.Partition, "partition", 0, "with -l: leave pods with an ordinal below this alone (StatefulSet partition)")
	_ = cmd.MarkFlagRequired("container")
	return cmd
}

// Request is the inplaced.io/swap annotation value the options ask for,
// checked as inplaced on the node will check it. The same options give the
// same value, so asking twice runs once.
func (o *SwapOptions) Request() (string, *podapi.SwapRequest, error) {
	r := podapi.SwapRequest{Container: o.Container, Image: o.Image, UnsetEnv: o.UnsetEnv, HealthHTTP: o.HealthHTTP,
		HealthTCP: o.HealthTCP, HealthExec: o.HealthExec, DrainSeconds: o.DrainSeconds, Strategy: o.Strategy}
	env, err := swapflags.ParseEnv(o.Env)
	if err != nil {
		return "", nil, err
	}
	r.Env = env
	if o.MinRuntime != 0 {
		r.MinRuntime = o.MinRuntime.String()
	}
	b, err := json.Marshal(&r)
	if err != nil {
		return "", nil, err
	}
	// command and args are a change even when empty (omitempty drops them).
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return "", nil, err
	}
	if o.SetCommand || len(o.Command) > 0 {
		fields["command"], _ = json.Marshal(nonNil(o.Command))
	}
	if o.SetArgs || len(o.Args) > 0 {
		fields["args"], _ = json.Marshal(nonNil(o.Args))
	}
	if b, err = json.Marshal(fields); err != nil {
		return "", nil, err
	}
	req, err := podapi.ParseSwapRequest(string(b))
	if err != nil {
		return "", nil, fmt.Errorf("the request would be refused: %w", err)
	}
	return string(b), req, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// SwapError is a swap that did not commit.
type SwapError struct {
	Pod    string
	Status *podapi.SwapStatus // nil when none arrived
	Err    error              // when it did not end (timeout, pod deleted, API error)
}

func (e *SwapError) Error() string {
	switch {
	case e.Err != nil:
		return fmt.Sprintf("pod %s: %v", e.Pod, e.Err)
	case e.Status.State == podapi.StateRefused:
		return fmt.Sprintf("pod %s: request refused, nothing changed: %s", e.Pod, e.Status.Error)
	default:
		return fmt.Sprintf("pod %s: swap %s ended %s: %s", e.Pod, e.Status.SwapID, e.Status.State, e.Status.Error)
	}
}

func (e *SwapError) Unwrap() error { return e.Err }

// Swap asks for the swap on o.Pod and follows it to its end: nil only when
// it committed and, if the pod was Ready before, it is Ready again.
func Swap(ctx context.Context, client Client, o *SwapOptions) (*podapi.SwapStatus, error) {
	if o.Pod == "" {
		return nil, errors.New("name a pod, or select pods with -l")
	}
	raw, req, err := o.Request()
	if err != nil {
		return nil, err
	}
	return swapPod(ctx, client, o, raw, req, newPrinter(o.Out), o.Pod)
}

// printer writes progress lines, one pod's prefixed by its name.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func newPrinter(w io.Writer) *printer {
	if w == nil {
		w = io.Discard
	}
	return &printer{w: w}
}

func (p *printer) printf(pod, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "pod/%s: %s\n", pod, fmt.Sprintf(format, args...))
}

// swapPod writes the request on one pod and follows it.
func swapPod(ctx context.Context, client Client, o *SwapOptions, raw string, req *podapi.SwapRequest, out *printer, name string) (*podapi.SwapStatus, error) {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("no end of the swap after %s (it may still run on the node: kubectl inplace status %s)", timeout, name))
	defer cancel()
	pods := client.Pods(o.Namespace)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, &SwapError{Pod: name, Err: err}
	}
	if !hasContainer(pod, req.Container) {
		return nil, &SwapError{Pod: name, Err: fmt.Errorf("no container %q in the pod (it has %s)", req.Container, containerNames(pod))}
	}
	if pod.Spec.NodeName == "" {
		return nil, &SwapError{Pod: name, Err: errors.New("the pod is not scheduled to a node yet")}
	}
	digest := podapi.Digest(raw)
	wasReady := podReady(pod)
	if err := ask(ctx, pods, pod, raw, req, out); err != nil {
		return nil, &SwapError{Pod: name, Err: err}
	}
	f := &follower{out: out, pod: name, digest: digest, req: req, waitReady: wasReady, steps: map[string]bool{}}
	err = watchPod(ctx, client, o.Namespace, name, f.see)
	if err != nil {
		switch {
		case errors.Is(err, context.Canceled):
			err = fmt.Errorf("interrupted: the request stays on the pod and inplaced runs it (kubectl inplace status %s): %w", name, err)
		case f.status == nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
			err = fmt.Errorf("%w; no status from inplaced on node %s (does it run there in Kubernetes mode?)", err, pod.Spec.NodeName)
		}
		return f.status, &SwapError{Pod: name, Status: f.status, Err: err}
	}
	if f.status.State != podapi.StateCommitted {
		return f.status, &SwapError{Pod: name, Status: f.status}
	}
	return f.status, nil
}

// ask writes the request on the pod unless the pod has it already (it
// runs once; it is followed instead), or another swap is still running.
func ask(ctx context.Context, pods kubeclient.PodInterface, pod *corev1.Pod, raw string, req *podapi.SwapRequest, out *printer) error {
	digest := podapi.Digest(raw)
	cur := podapi.Status(pod)
	switch {
	case pod.Annotations[podapi.AnnotationSwap] == raw && cur != nil && cur.RequestDigest == digest:
		// Asked before: inplaced runs a request once; follow or report it.
		out.printf(pod.Name, "this request (%s) was made before: %s", digest, cur.State)
	case cur != nil && cur.State == podapi.StateRunning && cur.RequestDigest != digest:
		return fmt.Errorf("swap %s of container %s is still running (status of %s); wait for it to end",
			cur.SwapID, cur.Container, cur.UpdatedAt)
	default:
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{podapi.AnnotationSwap: raw}}})
		if _, err := pods.Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-inplace"}); err != nil {
			return fmt.Errorf("write %s: %w", podapi.AnnotationSwap, err)
		}
		out.printf(pod.Name, "swap of container %s requested on node %s (request %s)", req.Container, pod.Spec.NodeName, digest)
	}
	return nil
}

// follower prints a swap's progress from the pod's states.
type follower struct {
	out       *printer
	pod       string
	digest    string
	req       *podapi.SwapRequest
	waitReady bool

	status  *podapi.SwapStatus // the last status of this request
	steps   map[string]bool    // printed
	swapID  string
	gate    corev1.ConditionStatus
	ready   *bool
	running bool
}

func (f *follower) see(p *corev1.Pod) (bool, error) {
	f.seeConditions(p)
	st := podapi.Status(p)
	// Another container's swap writes the status with this digest kept.
	if st != nil && st.RequestDigest == f.digest && (st.Container == "" || st.Container == f.req.Container) {
		f.progress(st)
	}
	if f.status == nil || !final(f.status.State) {
		return false, nil
	}
	// Committed: a pod that was Ready is available again only when Ready.
	if f.status.State == podapi.StateCommitted && f.waitReady && !podReady(p) {
		return false, nil
	}
	return true, nil
}

// seeConditions prints the changes of the readiness gate (not its first
// True) and of Ready.
func (f *follower) seeConditions(p *corev1.Pod) {
	if podapi.HasReadinessGate(p) {
		if c := condition(p, podapi.ConditionInPlaceReady); c != nil && c.Status != f.gate {
			if f.gate != "" || c.Status != corev1.ConditionTrue {
				f.out.printf(f.pod, "%s=%s%s", podapi.ConditionInPlaceReady, c.Status, paren(c.Reason))
			}
			f.gate = c.Status
		}
	}
	if r := podReady(p); f.ready == nil || *f.ready != r {
		if f.ready != nil {
			f.out.printf(f.pod, "Ready=%t", r)
		}
		f.ready = &r
	}
}

func (f *follower) progress(st *podapi.SwapStatus) {
	if f.status != nil && final(f.status.State) {
		return
	}
	f.status = st
	if st.SwapID != "" && st.SwapID != f.swapID {
		f.swapID = st.SwapID
		f.out.printf(f.pod, "swap ID %s", st.SwapID)
	} else if st.State == podapi.StateRunning && !f.running {
		f.out.printf(f.pod, "swap started")
	}
	f.running = f.running || st.State == podapi.StateRunning
	if st.State == podapi.StateRunning {
		for _, s := range st.Steps {
			if !f.steps[s.Name] {
				f.steps[s.Name] = true
				f.out.printf(f.pod, "  %s done", s.Name)
			}
		}
		return
	}
	f.printEnd(st)
}

// printEnd prints an ended swap's steps with their durations and its end.
func (f *follower) printEnd(st *podapi.SwapStatus) {
	for _, s := range st.Steps {
		line := fmt.Sprintf("  %-16s %8s", s.Name, ms(s.DurationMs))
		if s.Error != "" {
			line += "  " + s.Error
		}
		f.out.printf(f.pod, "%s", line)
	}
	switch st.State {
	case podapi.StateCommitted:
		f.out.printf(f.pod, "%s: %s, downtime %s", st.State, describe(f.req), ms(st.DowntimeMs))
	case podapi.StateRefused:
		f.out.printf(f.pod, "%s, nothing changed: %s", st.State, st.Error)
	default:
		f.out.printf(f.pod, "%s: %s", st.State, st.Error)
	}
	if st.State == podapi.StateCommitted && f.waitReady {
		f.out.printf(f.pod, "waiting for Ready")
	}
}

// change says what a swap changed, from its status: the image from → to,
// env names added (+) and removed (-) — the status has no env values —
// a new command or args.
func change(st *podapi.SwapStatus) string {
	if st.From == nil || st.To == nil {
		return "container " + st.Container
	}
	var parts []string
	if st.From.Image != st.To.Image {
		parts = append(parts, st.From.Image+" → "+st.To.Image)
	}
	from, to := envNames(st.From.Env), envNames(st.To.Env)
	var env []string
	for _, k := range st.To.Env {
		if k, _, _ = strings.Cut(k, "="); !from[k] {
			env = append(env, "+"+k)
		}
	}
	for _, k := range st.From.Env {
		if k, _, _ = strings.Cut(k, "="); !to[k] {
			env = append(env, "-"+k)
		}
	}
	if len(env) > 0 {
		parts = append(parts, "env "+strings.Join(env, " "))
	}
	if !slices.Equal(st.From.Command, st.To.Command) {
		parts = append(parts, fmt.Sprintf("command %q", st.To.Command))
	}
	if !slices.Equal(st.From.Args, st.To.Args) {
		parts = append(parts, fmt.Sprintf("args %q", st.To.Args))
	}
	if len(parts) == 0 {
		return "container " + st.Container + " on " + st.To.Image
	}
	return "container " + st.Container + ": " + strings.Join(parts, "; ")
}

func envNames(env []string) map[string]bool {
	m := map[string]bool{}
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		m[k] = true
	}
	return m
}

// describe says what a request asks for; env values are left out, as
// inplaced leaves them out of its status.
func describe(r *podapi.SwapRequest) string {
	var parts []string
	if r.Image != "" {
		parts = append(parts, "image "+r.Image)
	}
	if len(r.Env) > 0 {
		parts = append(parts, "set env "+strings.Join(slices.Sorted(maps.Keys(r.Env)), ","))
	}
	if len(r.UnsetEnv) > 0 {
		parts = append(parts, "unset env "+strings.Join(r.UnsetEnv, ","))
	}
	if r.Command != nil {
		parts = append(parts, fmt.Sprintf("command %q", r.Command))
	}
	if r.Args != nil {
		parts = append(parts, fmt.Sprintf("args %q", r.Args))
	}
	return "container " + r.Container + ": " + strings.Join(parts, "; ")
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func ms(v float64) string {
	return (time.Duration(v * float64(time.Millisecond))).Round(time.Millisecond).String()
}

func hasContainer(p *corev1.Pod, name string) bool {
	for _, c := range p.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

func containerNames(p *corev1.Pod) string {
	var n []string
	for _, c := range p.Spec.Containers {
		n = append(n, c.Name)
	}
	return strings.Join(n, ", ")
}
