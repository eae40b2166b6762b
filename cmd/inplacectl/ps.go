package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func newPsCommand(g *globals) *cobra.Command {
	o := &PodFilter{}
	cmd := newCommand(g, "ps [POD] [-n NAMESPACE]",
		"List the containers as kubelet sees them through the proxy, with overrides, running swaps and resizes",
		cobra.MaximumNArgs(1), func(_ *cobra.Command, args []string) (*PodFilter, error) {
			if len(args) == 1 {
				o.Pod = args[0]
			}
			return o, nil
		}, Ps)
	o.addNamespace(cmd)
	return cmd
}

// Ps prints the containers.
func Ps(ctx context.Context, c inplacedv1.ControlClient, o *PodFilter, output string, w io.Writer) error {
	resp, err := c.ListContainers(ctx, &inplacedv1.ListContainersRequest{Namespace: o.Namespace, Pod: o.Pod})
	if err != nil {
		return err
	}
	if output != "table" {
		return printStructured(w, output, resp)
	}
	// Swap IDs are 28 characters (20261203T131520.884-4ec9ecce).
	const f = "%-13s %-36s %-18s %-3s %-28s %-10s %-28s %-22s %s\n"
	fmt.Fprintf(w, f, "CONTAINER", "POD/CONTAINER", "STATE", "#", "IMAGE", "HASH", "OVERRIDE (SWAP)", "SWAP RUNNING", "LAST RESIZE")
	for _, ci := range resp.Containers {
		override, running, resize := "-", "-", "-"
		if ci.OverrideSwapId != "" {
			override = ci.OverrideSwapId
		}
		if ci.RunningSwapId != "" {
			id := ci.RunningSwapId
			if len(id) > 8 {
				id = id[len(id)-8:] // swap IDs end in their random part
			}
			running = id + " " + ci.RunningStep
		}
		if ci.LastResizeId != "" {
			resize = ci.LastResizeResult + " " + time.Unix(0, ci.LastResizeUnixNano).Format("01-02 15:04:05")
			if ci.LastResizeEnforced != "" {
				resize += " (enforced " + ci.LastResizeEnforced + ")"
			}
		}
		hash := ci.KubeletHash
		if hash == "" {
			hash = "-"
		}
		fmt.Fprintf(w, f, shortID(ci.Id), ci.Namespace+"/"+ci.Pod+"/"+ci.Container,
			strings.TrimPrefix(ci.State, "CONTAINER_"), fmt.Sprint(ci.Attempt), ci.Image, hash, override, running, resize)
	}
	return nil
}
