// Command inplaced-installer puts inplaced on a node, upgrades it and
// takes it off, from a privileged pod with the host's root mounted (at
// /host) and the host's PID namespace: the container of the DaemonSet in
// deploy/helm/inplaced and deploy/daemonset. pkg/install decides and does
// the work; this is flags, the API client, the DaemonSet's lifecycle and
// the chart's uninstall hook.
//
//	install          install or upgrade on this node, then exit
//	uninstall        take inplaced off this node, then exit
//	daemonset        the DaemonSet's container: install (or, with
//	                 INPLACED_INSTALLER_MODE=uninstall, uninstall), mark the
//	                 pod ready, wait for SIGTERM
//	ready            the readiness probe: the run above succeeded
//	uninstall-fleet  the chart's pre-delete hook: switch the DaemonSet to
//	                 uninstall on every node and wait until each has
//
// The image carries the binaries (inplaced, inplacectl and this one) in
// --bin-dir (/usr/local/bin) and the host files at their repository paths
// (systemd/, deploy/inplaced, deploy/kubelet, deploy/k3s) under --payload
// (/opt/inplaced).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/inplaced/inplaced/pkg/install"
	"github.com/inplaced/inplaced/pkg/version"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "inplaced-installer:", err)
		os.Exit(1)
	}
}

// options are every command's flags.
type options struct {
	root, proc, payload string
	binDir              string
	layout              string
	nodeName            string
	kubernetesMode      bool
	connectionHold      string
	holdMax             string
	extraArgs           []string
	kubeconfig          string
	noAPI               bool
	dryRun              bool
	logLevel            string
	criTimeout          time.Duration
	readyTimeout        time.Duration
	apiTimeout          time.Duration
	swapTimeout         time.Duration
	unitTimeout         time.Duration
	readyFile           string
}

func newRoot() *cobra.Command { return newRootFor(&options{}) }

// newRootFor is the command line with its flags bound to o.
func newRootFor(o *options) *cobra.Command {
	root := &cobra.Command{
		Use:           "inplaced-installer",
		Short:         "Install, upgrade and remove inplaced on a node, from a privileged pod",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Version,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	f := root.PersistentFlags()
	f.StringVar(&o.root, "host-root", "/host", "where the host's root is mounted")
	f.StringVar(&o.proc, "proc", "/proc", "the host's /proc (the pod's own with hostPID: true)")
	f.StringVar(&o.payload, "payload", "/opt/inplaced", "the host files the image carries: systemd/, deploy/ as in the repository")
	f.StringVar(&o.binDir, "bin-dir", "/usr/local/bin", "the binaries the image carries: inplaced, inplacectl")
	f.StringVar(&o.layout, "layout", string(install.Kubeadm), "how kubelet is configured: kubeadm (kubelet.service, its KubeletConfiguration) or k3s (k3s's config.yaml.d)")
	f.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name in the API (default $NODE_NAME, the DaemonSet's spec.nodeName)")
	f.BoolVar(&o.kubernetesMode, "kubernetes-mode", true, "give inplaced kubelet's kubeconfig: kubectl set image goes in place")
	f.StringVar(&o.connectionHold, "connection-hold", "", "inplaced's connectionHold: queue, drop or off (default: the config template's)")
	f.StringVar(&o.holdMax, "hold-max", "", "inplaced's holdMax (default: the config template's)")
	f.StringArrayVar(&o.extraArgs, "extra-arg", nil, "one more flag for inplaced (repeat for more)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for the API (default: the pod's service account)")
	f.BoolVar(&o.noAPI, "no-api", false, "no API server: no annotation, no event, kubelet's readiness not checked")
	f.BoolVar(&o.dryRun, "dry-run", false, "print the plan and change nothing")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.DurationVar(&o.criTimeout, "cri-timeout", time.Minute, "how long inplaced has to answer CRI after it starts")
	f.DurationVar(&o.readyTimeout, "ready-timeout", 3*time.Minute, "how long the Node has to be Ready after kubelet restarts")
	f.DurationVar(&o.apiTimeout, "api-timeout", 2*time.Minute, "how long each API write is retried")
	f.DurationVar(&o.swapTimeout, "swap-timeout", 2*time.Minute, "uninstall: how long swaps in flight have to end before inplaced stops")
	f.DurationVar(&o.unitTimeout, "unit-timeout", 5*time.Minute, "how long one start, stop or restart of a unit may take")
	f.StringVar(&o.readyFile, "ready-file", "/run/inplaced-installer/ready", "written when the DaemonSet's run succeeded (the readiness probe reads it)")
	root.AddCommand(
		nodeCommand(o, "install", "Install or upgrade inplaced on this node", install.PlanInstall),
		nodeCommand(o, "uninstall", "Take inplaced off this node", install.PlanUninstall),
		daemonSetCommand(o), readyCommand(o), fleetCommand(o))
	return root
}

// withLogger runs f with the logger --log-level asks for, flushed when f
// returns.
func (o *options) withLogger(f func(log *zap.Logger) error) error {
	log, err := newLogger(o.logLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	return f(log)
}

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	return cfg.Build()
}

// restConfig is the API's address and credentials: the kubeconfig given,
// else the pod's service account. It is never logged.
func (o *options) restConfig() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API client (give --kubeconfig, or --no-api): %w", err)
	}
	cfg.UserAgent = install.Component + "/" + version.Version
	return cfg, nil
}

// signals is a context ended by SIGTERM or SIGINT.
func signals() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}
