package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// newStatusCommand says whether inplaced serves in full or only passes
// kubelet's calls through, and what to do about each part out of service.
func newStatusCommand(g *globals) *cobra.Command {
	return newListCommand(g, "status",
		"Say whether inplaced serves in full, and what to do about each part of it out of service",
		inplacedv1.ControlClient.Status, &inplacedv1.StatusRequest{}, printStatus)
}

func printStatus(w io.Writer, resp *inplacedv1.StatusResponse) {
	swaps := "allowed"
	if !resp.SwapsAllowed {
		swaps = "REFUSED (kubelet's calls pass through)"
	}
	fmt.Fprintf(w, "version:     %s\nstate file:  %s\nkubernetes:  %s\nswaps:       %s\n", resp.Version, resp.StateFile, resp.Kubernetes, swaps)
	if len(resp.Problems) == 0 {
		fmt.Fprintln(w, "problems:    none")
		return
	}
	for _, p := range resp.Problems {
		fmt.Fprintf(w, "\nPROBLEM %s (since %s)\n  what:   %s\n  action: %s\n", p.Part, ts(p.SinceUnixNano), p.What, p.Action)
	}
}
