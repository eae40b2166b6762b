package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// newCheckCommand lists the pods on the node that no longer fit it: an
// in-place change bypasses the scheduler, so a node label or taint that
// changed since the pod was scheduled is found here.
func newCheckCommand(g *globals) *cobra.Command {
	return newListCommand(g, "check",
		"List the pods on this node that no longer fit it (nodeSelector, required node affinity, taints), and why",
		inplacedv1.ControlClient.CheckPods, &inplacedv1.CheckPodsRequest{},
		func(w io.Writer, resp *inplacedv1.CheckPodsResponse) {
			if len(resp.Misfits) == 0 {
				fmt.Fprintf(w, "all %d pods fit node %s\n", resp.PodsChecked, resp.Node)
				return
			}
			fmt.Fprintf(w, "%-40s %s\n", "POD", "WHY IT NO LONGER FITS NODE "+resp.Node)
			for _, m := range resp.Misfits {
				fmt.Fprintf(w, "%-40s %s\n", m.Namespace+"/"+m.Pod, m.Reason)
			}
		})
}
