package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/pkg/kubeclient"
)

// StatusOptions are the flags of `kubectl inplace status`.
type StatusOptions struct {
	Namespace string
	Pods      []string
	Selector  string
	Output    string // table, json or yaml
	Out       io.Writer
}

// PodStatus is what `kubectl inplace status` shows of one pod.
type PodStatus struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Node      string `json:"node,omitempty"`
	// Request is the inplaced.io/swap annotation, RequestDigest its digest.
	Request       string `json:"request,omitempty"`
	RequestDigest string `json:"requestDigest,omitempty"`
	// Pending: the request has no status yet (inplaced has not seen it).
	Pending bool               `json:"pending"`
	Status  *podapi.SwapStatus `json:"status,omitempty"`
	Ready   bool               `json:"ready"`
	// InPlaceReady and AffinityDrift are the pod conditions inplaced sets
	// ("" when absent).
	InPlaceReady  string `json:"inPlaceReady,omitempty"`
	AffinityDrift string `json:"affinityDrift,omitempty"`
	DriftReason   string `json:"affinityDriftReason,omitempty"`
}

func newStatusCommand(g *globals) *cobra.Command {
	o := &StatusOptions{}
	cmd := &cobra.Command{
		Use:   "status (POD... | -l SELECTOR) [-o table|json|yaml]",
		Short: "Show the in-place swap status inplaced wrote on pods",
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Pods, o.Out = args, cmd.OutOrStdout()
			client, ns, err := g.client()
			if err != nil {
				return err
			}
			o.Namespace = ns
			_, err = Status(cmd.Context(), client, o)
			return err
		},
	}
	cmd.Flags().StringVarP(&o.Selector, "selector", "l", "", "the pods this label selector selects")
	cmd.Flags().StringVarP(&o.Output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}

// Status reads and prints the swap status of the named or selected pods.
func Status(ctx context.Context, client Client, o *StatusOptions) ([]PodStatus, error) {
	switch o.Output {
	case "", "table", "json", "yaml":
	default:
		return nil, fmt.Errorf("-o %q: want table, json or yaml", o.Output)
	}
	if (len(o.Pods) == 0) == (o.Selector == "") {
		return nil, errors.New("name pods or give -l SELECTOR (one of the two)")
	}
	items, err := statusPods(ctx, client.Pods(o.Namespace), o)
	if err != nil {
		return nil, err
	}
	out := make([]PodStatus, 0, len(items))
	for i := range items {
		out = append(out, podStatus(&items[i]))
	}
	return out, printStatus(o, out)
}

// statusPods reads the selected pods, in walk order, then the named ones.
func statusPods(ctx context.Context, pods kubeclient.PodInterface, o *StatusOptions) ([]corev1.Pod, error) {
	var items []corev1.Pod
	if o.Selector != "" {
		sel, err := labels.Parse(o.Selector)
		if err != nil {
			return nil, fmt.Errorf("-l %q: %w", o.Selector, err)
		}
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return nil, err
		}
		for _, r := range walkOrder(l.Items) {
			for i := range l.Items {
				if l.Items[i].Name == r.Pod {
					items = append(items, l.Items[i])
				}
			}
		}
	}
	for _, name := range o.Pods {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		items = append(items, *p)
	}
	return items, nil
}

// printStatus writes out to o.Out as o.Output says; one named pod's is an
// object rather than a list.
func printStatus(o *StatusOptions, out []PodStatus) error {
	w := o.Out
	if w == nil {
		w = io.Discard
	}
	var v any = out
	if len(o.Pods) == 1 {
		v = out[0]
	}
	switch o.Output {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return printStatusTable(w, out)
}

func podStatus(p *corev1.Pod) PodStatus {
	s := PodStatus{Namespace: p.Namespace, Pod: p.Name, Node: p.Spec.NodeName, Request: p.Annotations[podapi.AnnotationSwap],
		Status: podapi.Status(p), Ready: podReady(p)}
	if s.Request != "" {
		s.RequestDigest = podapi.Digest(s.Request)
		s.Pending = s.Status == nil || s.Status.RequestDigest != s.RequestDigest
	}
	if c := condition(p, podapi.ConditionInPlaceReady); c != nil {
		s.InPlaceReady = string(c.Status)
	}
	if c := condition(p, podapi.ConditionAffinityDrift); c != nil {
		s.AffinityDrift = string(c.Status)
		if c.Status == corev1.ConditionTrue {
			s.DriftReason = c.Message
		}
	}
	return s
}

func printStatusTable(w io.Writer, l []PodStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tCONTAINER\tSTATE\tSWAP\tDOWNTIME\tREADY\tIN-PLACE-READY\tUPDATED\tERROR")
	for _, s := range l {
		container, state, swapID, down, updated, errText := "-", "-", "-", "-", "-", ""
		if st := s.Status; st != nil {
			container, state, errText = or(st.Container, "-"), st.State, st.Error
			swapID, updated = or(st.SwapID, "-"), or(st.UpdatedAt, "-")
			if st.DowntimeMs > 0 {
				down = ms(st.DowntimeMs)
			}
		}
		if s.Pending {
			state = "Pending (not seen by inplaced yet)"
			if s.Status != nil {
				state += ", before: " + s.Status.State
			}
		}
		if s.AffinityDrift == string(corev1.ConditionTrue) {
			errText = "affinity drift: " + s.DriftReason + " " + errText
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\n", s.Pod, container, state, swapID, down, s.Ready,
			or(s.InPlaceReady, "-"), updated, oneLine(errText))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(l) != 1 || l[0].Status == nil {
		return nil
	}
	st := l[0].Status
	if st.From != nil && st.To != nil {
		fmt.Fprintf(w, "\nChange: %s\n", change(st))
	}
	if len(st.Steps) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "STEP\tDURATION\tERROR")
		for _, step := range st.Steps {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", step.Name, ms(step.DurationMs), oneLine(step.Error))
		}
		return tw.Flush()
	}
	return nil
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}
