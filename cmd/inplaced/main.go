// Command inplaced is the node daemon: a transparent CRI v1 proxy with an
// in-place swap engine. See docs/architecture.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/inplaced/inplaced/pkg/config"
	"github.com/inplaced/inplaced/pkg/daemon"
	"github.com/inplaced/inplaced/pkg/version"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "inplaced:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	def := config.Default()
	var (
		flagCfg    = def
		configPath = config.DefaultConfigPath
	)
	cmd := &cobra.Command{
		Use:           "inplaced",
		Short:         "CRI v1 proxy that changes containers in place",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(configPath, cmd.Flags().Changed("config"))
			if err != nil {
				return err
			}
			overrideFromFlags(&cfg, flagCfg, cmd.Flags())
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("invalid configuration:\n%w", err)
			}
			log, err := newLogger(cfg.LogLevel, cfg.LogFormat)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			gc := "GOGC=" + os.Getenv("GOGC")
			if pct, ok := gcPercentFor(os.Getenv("GOGC")); ok {
				debug.SetGCPercent(pct)
				gc = fmt.Sprintf("%d (inplaced's default; GOGC overrides)", pct)
			}
			log.Info("starting inplaced", zap.String("version", version.Version), zap.String("commit", version.Commit),
				zap.String("gc_percent", gc))
			return daemon.Run(ctx, cfg, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", configPath, "YAML configuration file (flags win over it)")
	f.StringVar(&flagCfg.Listen, "listen", def.Listen, "CRI socket to serve (kubelet's --container-runtime-endpoint)")
	f.StringVar(&flagCfg.RuntimeEndpoint, "runtime-endpoint", def.RuntimeEndpoint, "backend CRI runtime endpoint")
	f.StringVar(&flagCfg.ImageEndpoint, "image-endpoint", "", "backend CRI image endpoint (default: the runtime endpoint)")
	f.StringVar(&flagCfg.StateDir, "state-dir", def.StateDir, "directory for the state store and swap journal")
	f.StringVar(&flagCfg.ControlSocket, "control-socket", def.ControlSocket, "control API socket (inplacectl)")
	f.StringVar(&flagCfg.LogLevel, "log-level", def.LogLevel, "debug, info, warn or error")
	f.StringVar(&flagCfg.LogFormat, "log-format", def.LogFormat, "json or console")
	f.StringVar(&flagCfg.Kubeconfig, "kubeconfig", "", "Kubernetes mode: kubeconfig to watch this node's pods with (kubelet's works; a file not there yet is waited for while CRI is served); empty: node-local only")
	f.StringVar(&flagCfg.NodeName, "node-name", "", "this node's name in the API (default: the hostname, as kubelet)")
	f.StringVar(&flagCfg.OnPullFailure, "on-pull-failure", def.OnPullFailure, "when a pod spec's new image cannot be pulled: keep-running (kubelet's stop refused) or pass-through")
	f.StringVar(&flagCfg.AffinityDrift, "affinity-drift", def.AffinityDrift, "a swap of a pod that no longer fits its node (nodeSelector, required affinity, taints): warn or refuse")
	f.StringVar(&flagCfg.MetricsListen, "metrics-listen", "", "serve Prometheus metrics on this host:port (/metrics); empty: off")
	f.StringVar(&flagCfg.KubeletRootDir, "kubelet-root-dir", def.KubeletRootDir, "kubelet's --root-dir: the node's docker config (config.json) is read there first, as kubelet does")
	f.StringVar(&flagCfg.ImageCredentialProviderConfig, "image-credential-provider-config", "", "kubelet's flag of the same name: credential-provider plugin config for the pull before kubelet's stop")
	f.StringVar(&flagCfg.ImageCredentialProviderBinDir, "image-credential-provider-bin-dir", "", "kubelet's flag of the same name: where the credential-provider plugins are")
	f.StringVar(&flagCfg.Relay, "relay", def.Relay, "how calls are served: router (HTTP/2 router, the cheapest) or grpc (grpc-go server and client for every call: the fallback)")
	f.StringVar(&flagCfg.ConnectionHold, "connection-hold", def.ConnectionHold, "new connections to a container's ports while it is swapped: queue (wait for the new process), drop (clients retry after ~1 s) or off (refused); pod annotation inplaced.io/connection-hold")
	f.DurationVar((*timeDuration)(&flagCfg.HoldMax).ptr(), "hold-max", def.HoldMax.D(), "the longest a connection hold lasts; pod annotation inplaced.io/hold-max")
	f.BoolVar(&flagCfg.RequireListeners, "require-listeners", def.RequireListeners, "roll back a swap whose new container has not listened by --hold-max on every port the old one listened on (kubelet-driven swaps: recorded and reported as an event instead); pod annotation inplaced.io/require-listeners")
	f.StringVar(&flagCfg.SwapStrategy, "swap-strategy", def.SwapStrategy, "how a swap replaces a container: stop-first (stop the old one, then start the new one, with the connection hold) or overlap (start the new one while the old one runs and hand it the old one's listening sockets; stop-first where that is not possible); pod annotation inplaced.io/swap-strategy")
	f.DurationVar((*timeDuration)(&flagCfg.ShutdownGrace).ptr(), "shutdown-grace", def.ShutdownGrace.D(), "on SIGTERM, how long the calls and swaps in flight may run on; new calls wait for the next process (on systemd's socket), longer calls are cut and retried there, swaps left unfinished are settled by its journal recovery")
	f.DurationVar((*timeDuration)(&flagCfg.HealthMinRuntime).ptr(), "health-min-runtime", def.HealthMinRuntime.D(), "how long a swapped-in container must keep running before the swap commits")
	cmd.AddCommand(newVersionCommand())
	return cmd
}

// defaultGCPercent is the GC target inplaced runs with when GOGC is not
// set. Its live heap is small (about 3 MB relaying a 60-pod kubelet's
// calls), and Go's default of 100 lets the heap grow to twice that — at
// least 4 MB — before collecting: most of inplaced's anonymous memory. At
// 50 the heap stays within 1.5× the live data (at least 2 MB) for
// collections twice as frequent and as small: see docs/benchmarks-kubelet-load.md.
const defaultGCPercent = 50

// gcPercentFor says which GC percent to set given the GOGC variable: none
// when the user set one (the runtime has applied it).
func gcPercentFor(goGC string) (int, bool) {
	if goGC != "" {
		return 0, false
	}
	return defaultGCPercent, true
}

// overrideFromFlags copies every flag the user set over the file's values.
func overrideFromFlags(cfg *config.Config, flags config.Config, fs *pflag.FlagSet) {
	set := func(name string, dst *string, v string) {
		if fs.Changed(name) {
			*dst = v
		}
	}
	set("listen", &cfg.Listen, flags.Listen)
	set("runtime-endpoint", &cfg.RuntimeEndpoint, flags.RuntimeEndpoint)
	set("image-endpoint", &cfg.ImageEndpoint, flags.ImageEndpoint)
	set("state-dir", &cfg.StateDir, flags.StateDir)
	set("control-socket", &cfg.ControlSocket, flags.ControlSocket)
	set("log-level", &cfg.LogLevel, flags.LogLevel)
	set("log-format", &cfg.LogFormat, flags.LogFormat)
	set("kubeconfig", &cfg.Kubeconfig, flags.Kubeconfig)
	set("node-name", &cfg.NodeName, flags.NodeName)
	set("on-pull-failure", &cfg.OnPullFailure, flags.OnPullFailure)
	set("affinity-drift", &cfg.AffinityDrift, flags.AffinityDrift)
	set("metrics-listen", &cfg.MetricsListen, flags.MetricsListen)
	set("kubelet-root-dir", &cfg.KubeletRootDir, flags.KubeletRootDir)
	set("image-credential-provider-config", &cfg.ImageCredentialProviderConfig, flags.ImageCredentialProviderConfig)
	set("image-credential-provider-bin-dir", &cfg.ImageCredentialProviderBinDir, flags.ImageCredentialProviderBinDir)
	set("relay", &cfg.Relay, flags.Relay)
	set("connection-hold", &cfg.ConnectionHold, flags.ConnectionHold)
	set("swap-strategy", &cfg.SwapStrategy, flags.SwapStrategy)
	if fs.Changed("hold-max") {
		cfg.HoldMax = flags.HoldMax
	}
	if fs.Changed("require-listeners") {
		cfg.RequireListeners = flags.RequireListeners
	}
	if fs.Changed("health-min-runtime") {
		cfg.HealthMinRuntime = flags.HealthMinRuntime
	}
	if fs.Changed("shutdown-grace") {
		cfg.ShutdownGrace = flags.ShutdownGrace
	}
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print version, commit and CRI API version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "inplaced %s\ncommit: %s\nCRI API: %s\n", version.Version, version.Commit, version.CRIAPIVersion)
		},
	}
}

func newLogger(level, format string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	zc := zap.NewProductionConfig()
	if format == "console" {
		zc = zap.NewDevelopmentConfig()
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Sampling = nil // every RPC line at debug, every swap step: never drop
	return zc.Build()
}
