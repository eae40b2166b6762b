package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func newRevertCommand(g *globals) *cobra.Command {
	var t targetFlags
	cmd := newCommand(g, "revert POD -n NAMESPACE -c CONTAINER",
		"Drop a container's swap override and swap back to the declared config",
		cobra.MaximumNArgs(1), targetRequest(&t, func(target *inplacedv1.Target) (*inplacedv1.RevertRequest, error) {
			return &inplacedv1.RevertRequest{Target: target}, nil
		}), followSwapCall(inplacedv1.ControlClient.Revert))
	t.add(cmd)
	return cmd
}

func newOverridesCommand(g *globals) *cobra.Command {
	return newListCommand(g, "overrides", "Show, per container, the active sticky override and the swap it comes from",
		inplacedv1.ControlClient.ListOverrides, &inplacedv1.ListOverridesRequest{},
		func(w io.Writer, resp *inplacedv1.ListOverridesResponse) {
			fmt.Fprintf(w, "%-40s %-32s %-40s %s\n", "POD/CONTAINER", "SWAP", "IMAGE", "ENV KEYS")
			for _, o := range resp.Overrides {
				fmt.Fprintf(w, "%-40s %-32s %-40s %s\n", o.Namespace+"/"+o.Pod+"/"+o.Container, o.SwapId, o.To.GetImage(), strings.Join(o.To.GetEnv(), ","))
			}
		})
}
