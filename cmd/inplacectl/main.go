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

// followSwapCall asks inplaced for a swap (start is
// inplacedv1.ControlClient.Swap or .Revert) and follows its event stream to
// the end: see followSwap.
func followSwapCall[Req any](g *globals, cmd *cobra.Command,
	start func(inplacedv1.ControlClient, context.Context, Req, ...grpc.CallOption) (grpc.ServerStreamingClient[inplacedv1.SwapEvent], error),
	req Req) error {
	return g.call(func(c inplacedv1.ControlClient) error {
		stream, err := start(c, cmd.Context(), req)
		if err != nil {
			return err
		}
		return followSwap(stream, g.output, cmd.OutOrStdout())
	})
}

// newListCommand is a command without arguments that asks inplaced one
// question, call (a ControlClient method, as inplacedv1.ControlClient.CheckPods)
// with req, and prints the answer: as JSON or YAML with -o json|yaml, else
// as table writes it.
func newListCommand[Req any, Resp proto.Message](g *globals, use, short string,
	call func(inplacedv1.ControlClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req,
	table func(w io.Writer, resp Resp)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.call(func(c inplacedv1.ControlClient) error {
				resp, err := call(c, cmd.Context(), req)
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if g.output != "table" {
					return printStructured(w, g.output, resp)
				}
				table(w, resp)
				return nil
			})
		},
	}
}

func ts(ns int64) string {
	if ns == 0 {
		return "-"
	}
	return time.Unix(0, ns).Format(time.RFC3339)
}
