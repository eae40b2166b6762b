// Command inplacectl drives inplaced's control API: swaps, reverts,
// overrides and resizes.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

const defaultControlSocket = "/run/inplaced/control.sock"

type globals struct {
	socket string
	output string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		if st, ok := status.FromError(err); ok {
			fmt.Fprintf(os.Stderr, "inplacectl: %s: %s\n", st.Code(), st.Message())
		} else {
			fmt.Fprintln(os.Stderr, "inplacectl:", err)
		}
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "inplacectl",
		Short:         "Change containers in place through inplaced",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.socket, "control-socket", defaultControlSocket, "inplaced control API socket")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "table", "output format: table, json or yaml")
	root.AddCommand(newSwapCommand(g), newCheckCommand(g), newSwapsCommand(g), newRevertCommand(g), newOverridesCommand(g),
		newResizeCommand(g), newResizesCommand(g), newPsCommand(g), newWatchCommand(g), newPrepullCommand(g), newStatusCommand(g))
	return root
}

func (g *globals) client() (inplacedv1.ControlClient, func(), error) {
	if g.output != "table" && g.output != "json" && g.output != "yaml" {
		return nil, nil, fmt.Errorf("-o %q: want table, json or yaml", g.output)
	}
	if _, err := os.Stat(g.socket); err != nil {
		return nil, nil, fmt.Errorf("control socket %s: %w (is inplaced running? set --control-socket)", g.socket, err)
	}
	conn, err := grpc.NewClient("unix://"+g.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return inplacedv1.NewControlClient(conn), func() { conn.Close() }, nil
}

// call runs f with a client of the control socket, closed when f returns.
func (g *globals) call(f func(c inplacedv1.ControlClient) error) error {
	c, done, err := g.client()
	if err != nil {
		return err
	}
	defer done()
	return f(c)
}

// runFunc asks inplaced, through c, what req says and prints the answer to
// w in the -o format (output): the exported function of a command (Ps,
// Watch, Prepull), which tests drive with a fake client.
type runFunc[Req any] func(ctx context.Context, c inplacedv1.ControlClient, req Req, output string, w io.Writer) error

// newCommand is the shape of every inplacectl command: request reads the
// arguments and flags into what to ask, before any connection, so that a
// usage error is reported before a missing socket; run then asks it with a
// client of the control socket, closed when run returns.
func newCommand[Req any](g *globals, use, short string, args cobra.PositionalArgs,
	request func(cmd *cobra.Command, args []string) (Req, error), run runFunc[Req]) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  args,
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := request(cmd, args)
			if err != nil {
				return err
			}
			return g.call(func(c inplacedv1.ControlClient) error {
				return run(cmd.Context(), c, req, g.output, cmd.OutOrStdout())
			})
		},
	}
}

// always is the request step of a command whose arguments add nothing to
// req (its flags, bound to req, may).
func always[Req any](req Req) func(*cobra.Command, []string) (Req, error) {
	return func(*cobra.Command, []string) (Req, error) { return req, nil }
}

// followSwapCall is the run of a command that asks inplaced for a swap
// (start is inplacedv1.ControlClient.Swap or .Revert) and follows its event
// stream to the end: see followSwap.
func followSwapCall[Req any](start func(inplacedv1.ControlClient, context.Context, Req, ...grpc.CallOption) (grpc.ServerStreamingClient[inplacedv1.SwapEvent], error)) runFunc[Req] {
	return func(ctx context.Context, c inplacedv1.ControlClient, req Req, output string, w io.Writer) error {
		stream, err := start(c, ctx, req)
		if err != nil {
			return err
		}
		return followSwap(stream, output, w)
	}
}

// newListCommand is a command without arguments that asks inplaced one
// question, call (a ControlClient method, as inplacedv1.ControlClient.CheckPods)
// with req, and prints the answer: see answer.
func newListCommand[Req any, Resp proto.Message](g *globals, use, short string,
	call func(inplacedv1.ControlClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req,
	table func(w io.Writer, resp Resp)) *cobra.Command {
	return newCommand(g, use, short, cobra.NoArgs, always(req), answer(call, table))
}

// answer is the run of a command that asks inplaced one question, call,
// and prints the answer: as JSON or YAML with -o json|yaml, else as table
// writes it. An error that carries an answer (a refused resize carries its
// record) has it printed too, then is returned.
func answer[Req any, Resp proto.Message](call func(inplacedv1.ControlClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
	table func(w io.Writer, resp Resp)) runFunc[Req] {
	return func(ctx context.Context, c inplacedv1.ControlClient, req Req, output string, w io.Writer) error {
		show := func(resp Resp) error {
			if output != "table" {
				return printStructured(w, output, resp)
			}
			table(w, resp)
			return nil
		}
		resp, err := call(c, ctx, req)
		if err != nil {
			for _, d := range status.Convert(err).Details() {
				if resp, ok := d.(Resp); ok {
					_ = show(resp)
					break
				}
			}
			return err
		}
		return show(resp)
	}
}

func ts(ns int64) string {
	if ns == 0 {
		return "-"
	}
	return time.Unix(0, ns).Format(time.RFC3339)
}
