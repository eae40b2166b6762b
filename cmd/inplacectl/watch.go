package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func newWatchCommand(g *globals) *cobra.Command {
	o := &PodFilter{}
	cmd := newCommand(g, "watch [--pod POD] [-n NAMESPACE]",
		"Stream swaps, steps, resizes, overrides and fence waits as they happen (Ctrl-C ends)",
		cobra.NoArgs, always(o), Watch)
	o.addNamespace(cmd)
	cmd.Flags().StringVar(&o.Pod, "pod", "", "only this pod")
	return cmd
}

// Watch prints events until ctx ends (nil then) or the daemon goes away.
// JSON and YAML are one document per event (JSON: one line each).
func Watch(ctx context.Context, c inplacedv1.ControlClient, o *PodFilter, output string, w io.Writer) error {
	stream, err := c.Watch(ctx, &inplacedv1.WatchRequest{Namespace: o.Namespace, Pod: o.Pod})
	if err != nil {
		return err
	}
	if _, err := stream.Header(); err != nil {
		return ended(ctx, err)
	}
	fmt.Fprintln(os.Stderr, "# watching; Ctrl-C ends")
	for {
		ev, err := stream.Recv()
		if err != nil {
			return ended(ctx, err)
		}
		switch output {
		case "json":
			b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ev)
			if err != nil {
				return err
			}
			fmt.Fprintln(w, string(b))
		case "yaml":
			fmt.Fprintln(w, "---")
			if err := printStructured(w, output, ev); err != nil {
				return err
			}
		default:
			what := ev.Namespace + "/" + ev.Pod + "/" + ev.Container
			if ev.Pod == "" {
				what = "-"
			}
			detail := ev.Message
			if ev.Step != "" {
				detail = ev.Step + " " + detail
			}
			if ev.State != "" {
				detail = ev.State + " " + detail
			}
			id := ev.SwapId
			if id == "" {
				id = ev.ResizeId
			}
			fmt.Fprintf(w, "%s  %-16s %-36s %-32s %s\n", time.Unix(0, ev.TimeUnixNano).Format("15:04:05.000"), ev.Kind, what, id, detail)
		}
	}
}

func ended(ctx context.Context, err error) error {
	if errors.Is(err, io.EOF) || ctx.Err() != nil || status.Code(err) == codes.Canceled {
		return nil
	}
	return err
}
