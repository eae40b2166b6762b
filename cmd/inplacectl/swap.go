package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/inplaced/inplaced/pkg/strategy"
	"github.com/inplaced/inplaced/pkg/swapflags"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// SwapOptions are the flags of `inplacectl swap`.
type SwapOptions struct {
	Target       targetFlags
	Image        string
	Env          []string
	UnsetEnv     []string
	Command      []string
	Args         []string
	RegistryAuth string
	GracePeriod  int64
	MinRuntime   time.Duration
	HealthExec   []string
	HealthHTTP   string
	HealthTCP    int64
	HealthTimout time.Duration
	PreStopExec  []string
	PostStart    []string
	SkipPreStop  bool
	Strategy     string
	CPU          string
	CPURequest   string
	Memory       string
	Mounts       []string
	Privileged   bool
	Devices      []string
}

func newSwapCommand(g *globals) *cobra.Command {
	o := &SwapOptions{}
	cmd := newCommand(g, "swap POD -n NAMESPACE -c CONTAINER [--image IMAGE] [--env K=V] [--unset-env K] [--command C] [--args A]",
		"Replace a running container's image, env, command or args inside its pod sandbox",
		cobra.MaximumNArgs(1), o.request, followSwapCall(inplacedv1.ControlClient.Swap))
	o.Target.add(cmd)
	f := cmd.Flags()
	swapflags.AddChange(f, &o.Image, &o.Env, &o.UnsetEnv, &o.Command)
	f.StringArrayVar(&o.Args, "args", nil, "new args, one element per flag (repeatable)")
	f.StringVar(&o.RegistryAuth, "registry-auth", "", "JSON file with registry credentials {username,password|auth|identity_token,server_address}; kept in memory only")
	f.Int64Var(&o.GracePeriod, "grace-period", 0, "seconds for preStop + stop (default: the pod's terminationGracePeriod)")
	f.DurationVar(&o.MinRuntime, "min-runtime", 0, "how long the new container must keep running (default: inplaced's --health-min-runtime)")
	f.StringArrayVar(&o.HealthExec, "health-exec", nil, "health check: command run in the new container (repeatable, one element each)")
	f.StringVar(&o.HealthHTTP, "health-http", "", "health check: PORT/PATH fetched from the pod IP, e.g. 8080/healthz")
	f.Int64Var(&o.HealthTCP, "health-tcp", 0, "health check: TCP port on the pod IP")
	f.DurationVar(&o.HealthTimout, "health-timeout", 30*time.Second, "how long the health check may take to pass")
	f.StringArrayVar(&o.PreStopExec, "pre-stop-exec", nil, "preStop command instead of the recorded one (repeatable)")
	f.StringArrayVar(&o.PostStart, "post-start-exec", nil, "postStart command run in the new container (repeatable)")
	f.BoolVar(&o.SkipPreStop, "skip-pre-stop", false, "do not run a preStop hook")
	f.StringVar(&o.Strategy, "strategy", "", "stop-first or overlap (start the new container while the old one runs and hand it the old one's listening sockets); default: the pod's annotation inplaced.io/swap-strategy, else inplaced's --swap-strategy")
	f.StringVar(&o.CPU, "cpu", "", "new CPU limit for the new container, e.g. 1500m")
	f.StringVar(&o.CPURequest, "cpu-request", "", "new CPU request (shares/weight)")
	f.StringVar(&o.Memory, "memory", "", "new memory limit, e.g. 512Mi")
	f.StringArrayVar(&o.Mounts, "mount", nil, "HOST:CONTAINER mount — always refused: mounts cannot change in place")
	f.BoolVar(&o.Privileged, "privileged", false, "always refused: privileges cannot change in place")
	f.StringArrayVar(&o.Devices, "device", nil, "always refused: devices cannot change in place")
	return cmd
}

// request is the swap request the arguments and flags ask for.
func (o *SwapOptions) request(cmd *cobra.Command, args []string) (*inplacedv1.SwapRequest, error) {
	t, err := o.Target.target(args)
	if err != nil {
		return nil, err
	}
	ch, err := o.change(cmd)
	if err != nil {
		return nil, err
	}
	opts, err := o.options()
	if err != nil {
		return nil, err
	}
	auth, err := readRegistryAuth(o.RegistryAuth)
	if err != nil {
		return nil, err
	}
	return &inplacedv1.SwapRequest{Target: t, Change: ch, Options: opts, Auth: auth}, nil
}

// change is what the flags change in the container; a flag not given
// changes nothing.
func (o *SwapOptions) change(cmd *cobra.Command) (*inplacedv1.Change, error) {
	ch := &inplacedv1.Change{Mounts: o.Mounts, Devices: o.Devices, UnsetEnv: o.UnsetEnv}
	if cmd.Flags().Changed("image") {
		ch.Image = &o.Image
	}
	if cmd.Flags().Changed("privileged") {
		ch.Privileged = &o.Privileged
	}
	env, err := swapflags.ParseEnv(o.Env)
	if err != nil {
		return nil, err
	}
	ch.SetEnv = env
	if cmd.Flags().Changed("command") {
		ch.SetCommand, ch.Command = true, o.Command
	}
	if cmd.Flags().Changed("args") {
		ch.SetArgs, ch.Args = true, o.Args
	}
	if res, err := parseResources(o.CPU, o.CPURequest, o.Memory); err != nil {
		return nil, err
	} else if res != nil {
		ch.Resources = res
	}
	return ch, nil
}

// options is how the swap runs: grace period, hooks and health gate.
func (o *SwapOptions) options() (*inplacedv1.SwapOptions, error) {
	opts := &inplacedv1.SwapOptions{GracePeriodSeconds: o.GracePeriod, MinRuntimeMs: o.MinRuntime.Milliseconds(),
		HealthTimeoutMs: o.HealthTimout.Milliseconds(), SkipPreStop: o.SkipPreStop}
	if o.Strategy != "" {
		st, err := strategy.Parse(o.Strategy)
		if err != nil {
			return nil, fmt.Errorf("--strategy %w; nothing was changed", err)
		}
		opts.Strategy = string(st)
	}
	if len(o.PreStopExec) > 0 {
		opts.PreStop = &inplacedv1.Handler{Exec: o.PreStopExec}
	}
	if len(o.PostStart) > 0 {
		opts.PostStart = &inplacedv1.Handler{Exec: o.PostStart}
	}
	hc, err := o.healthCheck()
	if err != nil {
		return nil, err
	}
	opts.HealthCheck = hc
	return opts, nil
}

// healthCheck is the health gate's check, of the first of --health-exec,
// --health-http and --health-tcp given; nil with none.
func (o *SwapOptions) healthCheck() (*inplacedv1.Handler, error) {
	switch {
	case len(o.HealthExec) > 0:
		return &inplacedv1.Handler{Exec: o.HealthExec}, nil
	case o.HealthHTTP != "":
		port, path, _ := strings.Cut(o.HealthHTTP, "/")
		var p int32
		if _, err := fmt.Sscan(port, &p); err != nil || p <= 0 {
			return nil, fmt.Errorf("--health-http %q: want PORT/PATH, e.g. 8080/healthz", o.HealthHTTP)
		}
		return &inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Port: p, Path: "/" + path}}, nil
	case o.HealthTCP > 0:
		return &inplacedv1.Handler{TcpPort: o.HealthTCP}, nil
	}
	return nil, nil
}

// readRegistryAuth reads the --registry-auth file; nil when none is given.
func readRegistryAuth(path string) (*inplacedv1.RegistryAuth, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--registry-auth: %w", err)
	}
	a := &inplacedv1.RegistryAuth{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(b, a); err != nil {
		return nil, fmt.Errorf("--registry-auth %s: %w (want JSON with username/password, auth or identity_token)", path, err)
	}
	return a, nil
}

type eventStream interface {
	Recv() (*inplacedv1.SwapEvent, error)
}

// errSwapFailed makes inplacectl exit non-zero after printing the record.
var errSwapFailed = errors.New("swap did not commit")

// followSwap prints each step as it happens and the result; it returns an
// error unless the swap committed.
func followSwap(stream eventStream, output string, w io.Writer) error {
	var final *inplacedv1.SwapRecord
	bar := newProgressPrinter(w, "  pull ")
	defer bar.end()
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if ev.Record != nil {
			final = ev.Record
			continue
		}
		if output == "table" {
			if ev.Pull != nil {
				bar.update(ev.Pull)
				continue
			}
			bar.end()
			fmt.Fprintf(w, "%s  %-12s %s\n", time.Unix(0, ev.TimeUnixNano).Format("15:04:05.000"), ev.Step, ev.Message)
		}
	}
	if final == nil {
		return fmt.Errorf("the swap's event stream ended without a result: see inplacectl swaps")
	}
	if output != "table" {
		if err := printStructured(w, output, final); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(w, "swap %s: %s\n", final.Id, strings.TrimPrefix(final.State.String(), "SWAP_STATE_"))
		fmt.Fprintf(w, "  %s → %s\n", final.From.GetImage(), final.To.GetImage())
		fmt.Fprintf(w, "  old container %s, new %s, running %s\n", final.OldContainerId, final.NewContainerId, final.RunningContainerId)
		fmt.Fprintf(w, "  sandbox %s (runtime handler %s): %s\n", shortID(final.SandboxId), handlerText(final.RuntimeHandler), keptText(final.SandboxKept))
		fmt.Fprintf(w, "  downtime: %s\n", time.Duration(final.DowntimeNs).Round(time.Microsecond))
		if st := final.StrategySummary(); st != "" {
			fmt.Fprintf(w, "  strategy: %s\n", st)
		}
		if h := final.Hold; h != nil {
			fmt.Fprintf(w, "  connections: %s\n", h.Summary())
		}
		if final.Error != "" {
			fmt.Fprintf(w, "  error: %s\n", final.Error)
		}
	}
	if final.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		return fmt.Errorf("%w: %s: %s", errSwapFailed, final.State, final.Error)
	}
	return nil
}

// handlerText names a runtime handler; CRI's empty name is the runtime's default.
func handlerText(h string) string {
	if h == "" {
		return "default"
	}
	return h
}

func keptText(kept bool) string {
	if kept {
		return "kept (same IP, network namespace and sandbox process)"
	}
	return "NOT shown to be kept"
}

func newSwapsCommand(g *globals) *cobra.Command {
	var t targetFlags
	cmd := newCommand(g, "swaps [POD -n NAMESPACE [-c CONTAINER]]", "List swap history",
		cobra.MaximumNArgs(1), func(_ *cobra.Command, args []string) (*inplacedv1.ListSwapsRequest, error) {
			req := &inplacedv1.ListSwapsRequest{}
			if len(args) == 1 || t.id != "" {
				req.Target = &inplacedv1.Target{Namespace: t.namespace, Container: t.container, ContainerId: t.id}
				if len(args) == 1 {
					req.Target.Pod = args[0]
				}
			}
			return req, nil
		}, func(ctx context.Context, c inplacedv1.ControlClient, req *inplacedv1.ListSwapsRequest, output string, w io.Writer) error {
			resp, err := c.ListSwaps(ctx, req)
			if err != nil {
				return err
			}
			return printSwaps(w, output, resp.Swaps)
		})
	t.add(cmd)
	return cmd
}

func printSwaps(w io.Writer, output string, swaps []*inplacedv1.SwapRecord) error {
	if output == "yaml" {
		return printStructured(w, output, &inplacedv1.ListSwapsResponse{Swaps: swaps})
	}
	if output == "json" {
		b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(&inplacedv1.ListSwapsResponse{Swaps: swaps})
		if err != nil {
			return err
		}
		var pretty any
		_ = json.Unmarshal(b, &pretty)
		out, _ := json.MarshalIndent(pretty, "", "  ")
		fmt.Fprintln(w, string(out))
		return nil
	}
	fmt.Fprintf(w, "%-32s %-8s %-30s %-16s %-40s %-10s %-13s %s\n", "ID", "KIND", "POD/CONTAINER", "STATE", "FROM → TO", "DOWNTIME", "RUNNING", "CALLER")
	for _, s := range swaps {
		fmt.Fprintf(w, "%-32s %-8s %-30s %-16s %-40s %-10s %-13s %s\n", s.Id, s.Kind,
			s.Namespace+"/"+s.Pod+"/"+s.Container, strings.TrimPrefix(s.State.String(), "SWAP_STATE_"),
			s.From.GetImage()+" → "+s.To.GetImage(), time.Duration(s.DowntimeNs).Round(time.Millisecond),
			shortID(s.RunningContainerId), s.Caller.Summary())
		if s.Error != "" {
			fmt.Fprintf(w, "    %s\n", s.Error)
		}
		if s.Handoff != "" {
			fmt.Fprintf(w, "    kubelet: %s\n", s.Handoff)
		}
		if st := s.StrategySummary(); st != "" {
			fmt.Fprintf(w, "    strategy: %s\n", st)
		}
		if s.Hold != nil {
			fmt.Fprintf(w, "    connections: %s\n", s.Hold.Summary())
		}
		if s.State == inplacedv1.SwapState_SWAP_STATE_RUNNING && len(s.Steps) > 0 {
			st := s.Steps[len(s.Steps)-1]
			if st.DurationNs == 0 {
				fmt.Fprintf(w, "    step %s running for %s\n", st.Name, time.Since(time.Unix(0, st.StartedUnixNano)).Round(100*time.Millisecond))
				if st.Pull != nil {
					fmt.Fprintf(w, "      %s\n", progressLine(st.Pull))
				}
			}
		}
	}
	return nil
}

func shortID(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	if id == "" {
		return "-"
	}
	return id
}
