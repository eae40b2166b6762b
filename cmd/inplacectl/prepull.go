package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// PrepullOptions are the flags of `inplacectl prepull`.
type PrepullOptions struct {
	Images       []string
	RegistryAuth string
}

func newPrepullCommand(g *globals) *cobra.Command {
	o := &PrepullOptions{}
	cmd := newCommand(g, "prepull IMAGE... [--registry-auth FILE]",
		"Pull images onto the node now, with progress (the pulls go on if this command is killed; Ctrl-C cancels them)",
		cobra.MinimumNArgs(1), func(_ *cobra.Command, args []string) (*inplacedv1.PrepullRequest, error) {
			o.Images = args
			auth, err := readRegistryAuth(o.RegistryAuth)
			if err != nil {
				return nil, err
			}
			return &inplacedv1.PrepullRequest{Images: o.Images, Auth: auth}, nil
		}, Prepull)
	cmd.Flags().StringVar(&o.RegistryAuth, "registry-auth", "", "JSON file with registry credentials (as for swap); kept in memory only")
	return cmd
}

// Prepull runs the pulls and prints their progress. When ctx ends (Ctrl-C)
// it cancels them on the daemon and returns context.Canceled.
func Prepull(ctx context.Context, c inplacedv1.ControlClient, req *inplacedv1.PrepullRequest, output string, w io.Writer) error {
	// The stream's own context is not ctx: cancelling the call would leave
	// the daemon's pulls running. Ctrl-C asks the daemon to cancel them.
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	stream, err := c.Prepull(sctx, req)
	if err != nil {
		return err
	}
	ch := make(chan prepullUpdate)
	go func() {
		for {
			p, err := stream.Recv()
			select {
			case ch <- prepullUpdate{p, err}:
			case <-sctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	bar := newProgressPrinter(w, "")
	defer bar.end()
	var id string
	failed := 0
	for {
		select {
		case <-ctx.Done():
			bar.end()
			if id == "" {
				// Ctrl-C before the first update: the daemon's pulls have
				// begun, but their ID comes with that update. Wait for it
				// (briefly) rather than leave them running.
				id = awaitPrepullID(ch, 5*time.Second)
			}
			if id != "" {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_, err := c.CancelPrepull(cctx, &inplacedv1.CancelPrepullRequest{Id: id})
				cancel()
				if err != nil {
					return fmt.Errorf("cancel prepull %s: %w", id, err)
				}
			}
			fmt.Fprintln(os.Stderr, "prepull cancelled")
			return context.Canceled
		case r := <-ch:
			if errors.Is(r.err, io.EOF) {
				if failed > 0 {
					return fmt.Errorf("%d of %d images failed to pull", failed, len(req.Images))
				}
				return nil
			}
			if r.err != nil {
				return r.err
			}
			id = r.p.PrepullId
			if r.p.Error != "" {
				failed++
			}
			if output == "table" {
				bar.update(r.p)
				continue
			}
			// json and yaml alike: one JSON object per line, which a
			// stream of updates needs (a YAML stream would need separators).
			b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(r.p)
			if err != nil {
				return err
			}
			fmt.Fprintln(w, string(b))
		}
	}
}

// prepullUpdate is one receive from the prepull stream.
type prepullUpdate struct {
	p   *inplacedv1.PullProgress
	err error
}

// awaitPrepullID reads updates until one names the prepull, for at most d;
// "" when none does (the stream ended or d passed).
func awaitPrepullID(ch <-chan prepullUpdate, d time.Duration) string {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case r := <-ch:
			if r.err != nil {
				return ""
			}
			if id := r.p.GetPrepullId(); id != "" {
				return id
			}
		case <-t.C:
			return ""
		}
	}
}
