package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/inplaced/inplaced/pkg/kubeclient"
)

// containerName is the installer's container in the DaemonSet: the
// uninstall patch merges into it by this name.
const containerName = "installer"

// uninstallPatch turns the DaemonSet's run into an uninstall on every node
// at once (maxUnavailable): a strategic merge patch, the one the chart's
// hook sends and the kubectl form for the plain manifests writes out.
func uninstallPatch(maxUnavailable string) []byte {
	b, err := json.Marshal(map[string]any{"spec": map[string]any{
		"updateStrategy": map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxUnavailable": maxUnavailable}},
		"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{
			"name": containerName, "env": []any{map[string]any{"name": modeEnv, "value": "uninstall"}}}}}},
	}})
	if err != nil {
		panic(err) // maps of strings always marshal
	}
	return b
}

// fleetCommand is the chart's pre-delete hook. Helm waits for hooks that
// are Jobs, not for DaemonSets, so the per-node work cannot be a hook of
// its own; instead the hook Job rolls the installer DaemonSet, which runs
// on exactly the nodes inplaced was installed on, into uninstall, waits
// until every pod of the new template is ready (its uninstall done), and
// only then lets Helm delete the DaemonSet and the RBAC it used.
func fleetCommand(o *options) *cobra.Command {
	var ns, name, maxUnavailable string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "uninstall-fleet",
		Short: "Roll the installer DaemonSet into uninstall on every node and wait for it (the chart's pre-delete hook)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withLogger(func(log *zap.Logger) error {
				cfg, err := o.restConfig()
				if err != nil {
					return err
				}
				f, err := newFleet(cfg, ns, name, log)
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				defer cancel()
				return f.uninstall(ctx, maxUnavailable)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&ns, "namespace", "kube-system", "the DaemonSet's namespace")
	fl.StringVar(&name, "daemonset", "inplaced-installer", "the installer DaemonSet")
	fl.StringVar(&maxUnavailable, "max-unavailable", "100%", "how many nodes uninstall at once")
	fl.DurationVar(&timeout, "timeout", 15*time.Minute, "how long every node has to finish")
	return cmd
}

// fleet is the installer DaemonSet seen from the API: apps/v1 daemonsets
// get and patch, core/v1 pods list (to name the nodes not done) — the
// hook's Role.
type fleet struct {
	apps      rest.Interface
	core      kubeclient.Interface
	ns, name  string
	log       *zap.Logger
	pollEvery time.Duration
}

var appsScheme = kubeclient.NewScheme(appsv1.AddToScheme)

func newFleet(c *rest.Config, ns, name string, log *zap.Logger) (*fleet, error) {
	cfg := *c
	cfg.GroupVersion = &appsv1.SchemeGroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(appsScheme).WithoutConversion()
	apps, err := rest.RESTClientFor(&cfg)
	if err != nil {
		return nil, err
	}
	core, err := kubeclient.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	return &fleet{apps: apps, core: core, ns: ns, name: name, log: log, pollEvery: 2 * time.Second}, nil
}

func (f *fleet) get(ctx context.Context) (*appsv1.DaemonSet, error) {
	ds := &appsv1.DaemonSet{}
	err := f.apps.Get().Namespace(f.ns).Resource("daemonsets").Name(f.name).Do(ctx).Into(ds)
	return ds, err
}

func (f *fleet) uninstall(ctx context.Context, maxUnavailable string) error {
	err := f.apps.Patch(types.StrategicMergePatchType).Namespace(f.ns).Resource("daemonsets").Name(f.name).
		Body(uninstallPatch(maxUnavailable)).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("switch daemonset %s/%s to uninstall: %w", f.ns, f.name, err)
	}
	f.log.Info("uninstalling on every node", zap.String("daemonset", f.ns+"/"+f.name), zap.String("max_unavailable", maxUnavailable))
	var last *appsv1.DaemonSet
	for {
		ds, err := f.get(ctx)
		if err == nil {
			last = ds
			if done, progress := rolledOut(ds); done {
				f.log.Info("every node uninstalled", zap.String("progress", progress))
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return f.notDone(last, ctx.Err())
		case <-time.After(f.pollEvery):
		}
	}
}

// rolledOut says whether every node runs the DaemonSet's current template
// and is ready — what `kubectl rollout status` waits for.
func rolledOut(ds *appsv1.DaemonSet) (bool, string) {
	s := ds.Status
	progress := fmt.Sprintf("%d of %d nodes done", min(s.UpdatedNumberScheduled, s.NumberAvailable), s.DesiredNumberScheduled)
	return s.ObservedGeneration >= ds.Generation && s.UpdatedNumberScheduled == s.DesiredNumberScheduled &&
		s.NumberAvailable == s.DesiredNumberScheduled && s.NumberUnavailable == 0, progress
}

// notDone names the nodes whose pod is not ready, for the hook's log.
func (f *fleet) notDone(ds *appsv1.DaemonSet, cause error) error {
	if ds == nil {
		return cause
	}
	_, progress := rolledOut(ds)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sel := metav1.FormatLabelSelector(ds.Spec.Selector)
	pods, err := f.core.Pods(f.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("%s: %w", progress, errors.Join(cause, err))
	}
	var nodes []string
	for _, p := range pods.Items {
		if !podReady(&p) {
			nodes = append(nodes, p.Spec.NodeName+" ("+p.Name+")")
		}
	}
	return fmt.Errorf("%s; not done: %s (kubectl -n %s logs <pod>): %w", progress, strings.Join(nodes, ", "), f.ns, cause)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
