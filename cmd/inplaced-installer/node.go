package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/inplaced/inplaced/pkg/install"
	"github.com/inplaced/inplaced/pkg/kubeclient"
	"github.com/inplaced/inplaced/pkg/version"
)

// modeEnv chooses the DaemonSet's run: install (the default) or
// uninstall. The chart's pre-delete hook, and the kubectl form for the
// plain manifests, set it to uninstall and roll the DaemonSet.
const modeEnv = "INPLACED_INSTALLER_MODE"

func nodeCommand(o *options, name, short string, plan func(install.Spec, install.Facts) (*install.Plan, error)) *cobra.Command {
	return &cobra.Command{
		Use:   name,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withLogger(func(log *zap.Logger) error {
				// A signal does not cut a run: a host left between two steps
				// is what the undo exists for, not what a stop should cause.
				_, stop := signals()
				defer stop()
				return runOnNode(context.Background(), o, log, name, plan)
			})
		},
	}
}

// runOnNode inspects the host, plans and runs the plan, under the host's
// installer lock.
func runOnNode(ctx context.Context, o *options, log *zap.Logger, action string, plan func(install.Spec, install.Facts) (*install.Plan, error)) error {
	payload, err := install.LoadPayload(o.payload, o.binDir)
	if err != nil {
		return err
	}
	sd, err := install.DialSystemd(ctx, o.root)
	if err != nil {
		return err
	}
	defer sd.Close()
	node, err := o.node()
	if err != nil {
		return err
	}
	unlock, err := install.Lock(o.root)
	if err != nil {
		return err
	}
	removeLock := false
	defer func() { unlock(removeLock) }()

	in := &install.Inspector{Root: o.root, Proc: o.proc, Systemd: sd, Node: node, Log: log}
	facts, err := in.Facts(ctx, install.Layout(o.layout), payload)
	if err != nil {
		return err
	}
	p, err := plan(o.spec(payload), facts)
	if err != nil {
		return fmt.Errorf("%s refused: %w", action, err)
	}
	if o.dryRun {
		fmt.Print(p)
		return nil
	}
	log.Info("plan", zap.String("action", action), zap.String("summary", p.Summary), zap.Stringer("steps", p))
	ex := &install.Executor{Root: o.root, Systemd: sd, CRI: install.CRIClient{}, Node: node,
		Kernel: install.HostKernel{Proc: o.proc}, Swaps: install.ControlClient{}, Log: log,
		CRITimeout: o.criTimeout, ReadyTimeout: o.readyTimeout, APITimeout: o.apiTimeout, SwapTimeout: o.swapTimeout,
		UnitTimeout: o.unitTimeout}
	if err := ex.Run(ctx, p); err != nil {
		return err
	}
	removeLock = action == "uninstall"
	log.Info("done", zap.String("action", action), zap.String("summary", p.Summary))
	return nil
}

func (o *options) spec(p install.Payload) install.Spec {
	return install.Spec{Layout: install.Layout(o.layout), Version: version.Version, NodeName: o.nodeName, Payload: p,
		KubernetesMode: o.kubernetesMode, ConnectionHold: o.connectionHold, HoldMax: o.holdMax, ExtraArgs: o.extraArgs,
		Now: time.Now().UTC().Truncate(time.Second)}
}

// node is this node's API object, nil with --no-api.
func (o *options) node() (*install.NodeClient, error) {
	if o.noAPI {
		return nil, nil
	}
	if o.nodeName == "" {
		return nil, errors.New("no node name: give --node-name or $NODE_NAME (or --no-api)")
	}
	cfg, err := o.restConfig()
	if err != nil {
		return nil, err
	}
	c, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &install.NodeClient{Client: c, Name: o.nodeName}, nil
}

// daemonSetCommand is the DaemonSet's container: one run, then ready and
// idle until the pod is deleted (a new image tag, the uninstall rollout,
// helm uninstall). A failed run ends the container with the reason on the
// Node as an event; kubelet's back-off retries it.
func daemonSetCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "daemonset",
		Short: "The DaemonSet's container: install (or uninstall, per $" + modeEnv + "), then wait",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return o.withLogger(o.daemonSet)
		},
	}
}

// daemonSet is the DaemonSet container's run: install or uninstall as
// $INPLACED_INSTALLER_MODE says, then ready until SIGTERM.
func (o *options) daemonSet(log *zap.Logger) error {
	mode := os.Getenv(modeEnv)
	plan := install.PlanInstall
	switch mode {
	case "", "install":
		mode = "install"
	case "uninstall":
		plan = install.PlanUninstall
	default:
		return fmt.Errorf("%s=%q: want install or uninstall", modeEnv, mode)
	}
	_ = os.Remove(o.readyFile)
	// SIGTERM is caught from the start, so that it ends the wait
	// below, never the run: the pod's grace period lets a run finish.
	ctx, stop := signals()
	defer stop()
	if err := runOnNode(context.Background(), o, log, mode, plan); err != nil {
		o.failedEvent(log, mode, err)
		return err
	}
	if err := writeReady(o.readyFile, mode); err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("stopping: inplaced stays as it is on the host", zap.String("mode", mode))
	return nil
}

// failedEvent says on the Node why the run failed (best effort: the
// container's log says it too).
func (o *options) failedEvent(log *zap.Logger, mode string, cause error) {
	node, err := o.node()
	if err != nil || node == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := fmt.Sprintf("%s of inplaced %s failed: %v", mode, version.Version, cause)
	if err := node.Event(ctx, corev1.EventTypeWarning, install.ReasonInstallFailed, msg); err != nil {
		log.Warn("event not written", zap.Error(err))
	}
}

func writeReady(p, mode string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(mode+"\n"), 0o644)
}

func readyCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "ready",
		Short: "The readiness probe: exits 0 once the DaemonSet's run succeeded",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := os.Stat(o.readyFile)
			return err
		},
	}
}
